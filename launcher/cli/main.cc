// ddprun: torchrun for C++ programs. Parses the command line and runs it.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "launcher/cli/farewell.h"
#include "launcher/cli/flags.h"
#include "launcher/cli/launch.h"
#include "launcher/cli/status_command.h"
#include "launcher/posix/orphan_guard.h"

int main(int argc, char** argv) {
  using ddprun::launcher::CommandLine;
  // The orphan guard the agent starts of itself (posix/orphan_guard.h).
  if (argc == 4 && std::string(argv[1]) == "--orphan-guard") {
    return ddprun::launcher::RunOrphanGuard(
        std::atoi(argv[2]), std::atoi(argv[3]), ddprun::launcher::SayFarewell);
  }
  absl::StatusOr<CommandLine> command =
      ddprun::launcher::ParseCommandLine(argc, argv);
  if (!command.ok()) {
    std::fprintf(stderr, "ddprun: error: %s\n",
                 std::string(command.status().message()).c_str());
    return 2;
  }
  switch (command->kind) {
    case CommandLine::Kind::kHelp:
      std::fputs(command->help.c_str(), stdout);
      return 0;
    case CommandLine::Kind::kStatus:
      return ddprun::launcher::RunStatus(command->status);
    case CommandLine::Kind::kLaunch:
      return ddprun::launcher::RunLaunch(command->launch);
  }
  return 2;
}
