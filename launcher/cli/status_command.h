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

}  // namespace ddprun::launcher
