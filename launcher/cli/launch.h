#pragma once

#include "launcher/cli/launch_options.h"

namespace ddprun::launcher {

// Runs `ddprun [flags] PROGRAM`: sets up logging, signals, the rendezvous
// (in-process with --standalone), then the agent. Returns the process exit
// code (see Agent::Run). Call from main's thread, before any other thread
// exists.
int RunLaunch(const LaunchOptions& options);

}  // namespace ddprun::launcher
