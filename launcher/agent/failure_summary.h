#pragma once

#include <string>

#include "absl/time/time.h"
#include "ddprun/v1/rendezvous.pb.h"

namespace ddprun::launcher {

// The one summary `ddprun` prints when a job failed: the root cause (rank,
// host, exit code or signal name, time, error message) first, then the
// other failures. Multi-line; ends with a newline.
std::string FormatFailureSummary(const std::string& run_id,
                                 const v1::JobEnded& ended);

// torchrun's contract with schedulers: when the agent itself was given a
// TORCHELASTIC_ERROR_FILE (`path`, empty: none), the job's root cause is
// written there in torchrun's format ({"message": {"message": ...,
// "extraInfo": {...}}}), so that the scheduler reports why the job failed.
// Errors are logged; an agent that fails to write goes on to exit 1.
void WriteAgentErrorFile(const std::string& path, const v1::JobEnded& ended);

// What torchrun's @record leaves in its own TORCHELASTIC_ERROR_FILE when a
// signal stops it (its SignalException): "SignalException: Process <pid>
// got signal: <sig>" and the time. Empty `path`: nothing.
void WriteAgentSignalErrorFile(const std::string& path, int pid, int sig,
                               absl::Time when);

// One failure on one line (without the message body's newlines).
std::string FormatFailure(const v1::WorkerFailure& failure);

}  // namespace ddprun::launcher
