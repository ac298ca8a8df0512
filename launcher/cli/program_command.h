#pragma once

#include <string>
#include <vector>

#include "launcher/cli/launch_options.h"

namespace ddprun::launcher {

// The command each worker runs, as torchrun builds it: a `.py` program runs
// under $PYTHON_EXEC (or python3) with -u, -m runs `python -u -m module`,
// --no-python and any other program run directly. `python_exec` is the value
// of $PYTHON_EXEC (empty when unset).
std::vector<std::string> BuildProgramArgv(const LaunchOptions& options,
                                          const std::string& python_exec);

// Whether BuildProgramArgv runs the program under Python.
bool RunsUnderPython(const LaunchOptions& options);

// The interpreter for `.py` programs and -m when $PYTHON_EXEC is unset or
// empty: `python3` in the folder of ddprun's own executable (`self_exe`, the
// resolved /proc/self/exe) when it is there and executable, else "" (then
// python3 from PATH). A virtual environment's bin/ holds both, so a ddprun
// installed there by pip runs that environment's Python whether or not it is
// activated, as torchrun runs sys.executable.
std::string PythonBeside(const std::string& self_exe);

// The command of a prewarmed worker (--prewarm). Python: the interpreter
// running the standby shim, then the program as BuildProgramArgv would pass
// it. Any other program runs as it is and promises to wait for its round on
// DDPRUN_STANDBY_FD itself (libddp's AwaitActivation).
std::vector<std::string> BuildStandbyArgv(const LaunchOptions& options,
                                          const std::string& python_exec);

}  // namespace ddprun::launcher
