#pragma once

#include <algorithm>
#include <string>
#include <vector>

namespace ddprun::launcher {

// The Python side of a prewarmed worker (see StandbyPool), run with
// `python -u -c <this> SCRIPT ARGS...` or `... -m MODULE ARGS...`: imports
// torch ahead of time, waits (named "ddprun-standby", as libddp's
// standbys are) for the round's environment on
// DDPRUN_STANDBY_FD, installs it, then runs the unmodified program as
// `python SCRIPT` / `python -m MODULE` would. End of input without an
// environment means "not needed": it exits 0.
inline constexpr char kPythonStandbyShim[] = R"PY(
import json, os, runpy, sys
fd = int(os.environ.pop("DDPRUN_STANDBY_FD"))
def name(text=None):
    try:
        with open("/proc/self/comm", "w" if text else "r") as comm:
            return comm.write(text) if text else comm.read().strip()
    except OSError:
        return None
program = name()
name("ddprun-standby")
try:
    import torch
    import torch.distributed
except ImportError:
    pass
with os.fdopen(fd, "rb") as channel:
    data = channel.read()
if not data:
    sys.exit(0)
if program:
    name(program)
os.environ.clear()
os.environ.update(json.loads(data))
args = sys.argv[1:]
if args[0] == "-m":
    sys.argv = args[1:]
    runpy.run_module(args[1], run_name="__main__", alter_sys=True)
else:
    sys.argv = args
    sys.path[0] = os.path.dirname(os.path.abspath(args[0]))
    runpy.run_path(args[0], run_name="__main__")
)PY";

// Whether `argv` runs the shim above (a Python standby: it imports torch
// and never forks standbys, so StandbyPool starts each by exec).
inline bool IsPythonStandbyCommand(const std::vector<std::string>& argv) {
  return std::find(argv.begin(), argv.end(), kPythonStandbyShim) != argv.end();
}

}  // namespace ddprun::launcher
