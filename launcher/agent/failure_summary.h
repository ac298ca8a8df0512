#pragma once

#include <string>

#include "ddprun/v1/rendezvous.pb.h"

namespace ddprun::launcher {

// The one summary `ddprun` prints when a job failed: the root cause (rank,
// host, exit code or signal name, time, error message) first, then the
// other failures. Multi-line; ends with a newline.
std::string FormatFailureSummary(const std::string& run_id,
                                 const v1::JobEnded& ended);

// One failure on one line (without the message body's newlines).
std::string FormatFailure(const v1::WorkerFailure& failure);

}  // namespace ddprun::launcher
