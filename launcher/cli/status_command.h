#pragma once

#include <string>

#include "ddprun/v1/rendezvous.pb.h"
#include "launcher/cli/launch_options.h"

namespace ddprun::launcher {

// `ddprun status`: asks the server (Status RPC) and prints its jobs, rounds,
// nodes, ranks, heartbeat ages, restarts and failures. Returns the exit code.
int RunStatus(const StatusOptions& options);

// The human-readable table RunStatus prints.
std::string FormatStatus(const v1::StatusResponse& response);
// `ddprun status --events`: one line per event, as text or (json) as JSON
// lines with the job's run_id added.
std::string FormatEvents(const v1::StatusResponse& response, bool json);

}  // namespace ddprun::launcher
