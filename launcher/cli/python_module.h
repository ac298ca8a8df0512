#pragma once

#include <optional>
#include <string>
#include <vector>

namespace ddprun::launcher {

// The folder that holds ddprun's Python package (`import ddprun.progress`)
// next to this executable: <bin>/../share/ddprun/python when installed,
// the source tree's python/ when run from the build tree. nullopt when
// neither holds it (the wheel puts the package in site-packages instead).
std::optional<std::string> FindPythonPackageDir(const std::string& executable);

// Appends `dir` to PYTHONPATH in `env` (NAME=value entries), after what the
// user set, so that their own modules win.
void AppendToPythonPath(std::vector<std::string>& env, const std::string& dir);

}  // namespace ddprun::launcher
