#include "launcher/cli/python_module.h"

#include <filesystem>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace ddprun::launcher {

std::optional<std::string> FindPythonPackageDir(const std::string& executable) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path bin = fs::weakly_canonical(executable, ec).parent_path();
  if (ec) return std::nullopt;
  for (const fs::path& candidate :
       {bin / ".." / "share" / "ddprun" / "python",
        // build/launcher/ddprun -> the source tree's python/ (a build
        // folder inside the checkout, as the README's).
        bin / ".." / ".." / "python"}) {
    if (fs::is_regular_file(candidate / "ddprun" / "progress.py", ec)) {
      return fs::weakly_canonical(candidate, ec).string();
    }
  }
  return std::nullopt;
}

void AppendToPythonPath(std::vector<std::string>& env, const std::string& dir) {
  for (std::string& entry : env) {
    if (absl::StartsWith(entry, "PYTHONPATH=")) {
      if (entry.size() > 11) {
        absl::StrAppend(&entry, ":", dir);
      } else {
        entry = absl::StrCat("PYTHONPATH=", dir);
      }
      return;
    }
  }
  env.push_back(absl::StrCat("PYTHONPATH=", dir));
}

}  // namespace ddprun::launcher
