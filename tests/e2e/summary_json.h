#pragma once

#include <optional>
#include <string>

namespace ddprun::testing {

// Reads one numeric field of the flat JSON object ddprun-mnist writes with
// --summary-json; nullopt when the field is missing or not a number.
std::optional<double> SummaryNumber(const std::string& json,
                                    const std::string& field);

}  // namespace ddprun::testing
