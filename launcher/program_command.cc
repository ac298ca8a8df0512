#include "launcher/program_command.h"

#include "absl/strings/match.h"

namespace ddprun::launcher {

std::vector<std::string> BuildProgramArgv(const LaunchOptions& options,
                                          const std::string& python_exec) {
  const std::vector<std::string>& program = options.program;
  bool python = !options.no_python &&
                (options.run_module ||
                 (!program.empty() && absl::EndsWith(program[0], ".py")));
  if (!python) return program;
  std::vector<std::string> argv = {
      python_exec.empty() ? std::string("python3") : python_exec, "-u"};
  if (options.run_module) argv.push_back("-m");
  argv.insert(argv.end(), program.begin(), program.end());
  return argv;
}

}  // namespace ddprun::launcher
