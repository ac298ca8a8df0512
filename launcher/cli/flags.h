#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "launcher/cli/launch_options.h"

namespace ddprun::launcher {

// What the command line asks for.
struct CommandLine {
  enum class Kind { kLaunch, kStatus, kHelp };
  Kind kind = Kind::kLaunch;
  LaunchOptions launch;  // kind == kLaunch
  StatusOptions status;  // kind == kStatus
  std::string help;      // kind == kHelp: the text to print
};

// Parses `ddprun [flags] PROGRAM [ARGS...]` (torchrun's flags, dash and
// underscore spellings, each also read from PET_<FLAG>) or
// `ddprun status --rdzv-endpoint H:P [--rdzv-id ID] [--json]`.
// Everything from the first positional on is the program, untouched.
// A usage error is INVALID_ARGUMENT with one line that names the problem and
// the fix.
absl::StatusOr<CommandLine> ParseCommandLine(int argc, const char* const* argv);

}  // namespace ddprun::launcher
