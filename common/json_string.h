#pragma once

#include <string>

#include "absl/strings/string_view.h"

namespace ddprun::common {

// Appends `text` to `out` as a JSON string literal, quotes included:
// quote, backslash and control characters escaped; other bytes (UTF-8)
// copied as they are. The one JSON string writer of the agent and libddp.
void AppendJsonString(std::string& out, absl::string_view text);

}  // namespace ddprun::common
