#include "tests/e2e/summary_json.h"

#include <cstdlib>

namespace ddprun::testing {

std::optional<double> SummaryNumber(const std::string& json,
                                    const std::string& field) {
  std::string quoted = "\"" + field + "\"";
  size_t at = json.find(quoted);
  if (at == std::string::npos) return std::nullopt;
  size_t colon = json.find(':', at + quoted.size());
  if (colon == std::string::npos) return std::nullopt;
  const char* begin = json.c_str() + colon + 1;
  char* end = nullptr;
  double value = std::strtod(begin, &end);
  if (end == begin) return std::nullopt;
  return value;
}

}  // namespace ddprun::testing
