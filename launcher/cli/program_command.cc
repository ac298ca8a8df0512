#include "launcher/cli/program_command.h"

#include <unistd.h>

#include "absl/strings/match.h"
#include "launcher/agent/python_standby.h"

namespace ddprun::launcher {

std::string PythonBeside(const std::string& self_exe) {
  size_t slash = self_exe.rfind('/');
  if (slash == std::string::npos) return "";
  std::string python = self_exe.substr(0, slash + 1) + "python3";
  return access(python.c_str(), X_OK) == 0 ? python : "";
}

bool RunsUnderPython(const LaunchOptions& options) {
  const std::vector<std::string>& program = options.program;
  return !options.no_python &&
         (options.run_module ||
          (!program.empty() && absl::EndsWith(program[0], ".py")));
}

std::vector<std::string> BuildStandbyArgv(const LaunchOptions& options,
                                          const std::string& python_exec) {
  // Any other program waits for its round itself (AwaitActivation).
  if (!RunsUnderPython(options)) return options.program;
  std::vector<std::string> argv = {
      python_exec.empty() ? std::string("python3") : python_exec, "-u", "-c",
      kPythonStandbyShim};
  if (options.run_module) argv.push_back("-m");
  argv.insert(argv.end(), options.program.begin(), options.program.end());
  return argv;
}

std::vector<std::string> BuildProgramArgv(const LaunchOptions& options,
                                          const std::string& python_exec) {
  const std::vector<std::string>& program = options.program;
  if (!RunsUnderPython(options)) return program;
  std::vector<std::string> argv = {
      python_exec.empty() ? std::string("python3") : python_exec, "-u"};
  if (options.run_module) argv.push_back("-m");
  argv.insert(argv.end(), program.begin(), program.end());
  return argv;
}

}  // namespace ddprun::launcher
