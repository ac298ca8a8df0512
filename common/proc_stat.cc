#include "common/proc_stat.h"

#include <fstream>
#include <iterator>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace ddprun::common {

std::vector<std::string> ProcStatFields(absl::string_view text) {
  const size_t close = text.rfind(')');
  if (close == absl::string_view::npos || close + 2 >= text.size()) return {};
  return absl::StrSplit(text.substr(close + 2), absl::ByAnyChar(" \n"),
                        absl::SkipEmpty());
}

std::vector<std::string> ReadProcStatFields(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
  const std::string text((std::istreambuf_iterator<char>(in)),
                         std::istreambuf_iterator<char>());
  return ProcStatFields(text);
}

}  // namespace ddprun::common
