#pragma once

#include <optional>
#include <string>

namespace ddprun::testing {

// Reads one numeric field of the flat JSON object ddprun-mnist writes with
// --summary-json; nullopt when the field is missing or not a number.
std::optional<double> SummaryNumber(const std::string& json,
                                    const std::string& field);

// Checks the --summary-json that rank 0 wrote at `path`: it exists, names
// `world_size`, and reports a test accuracy of at least `min_accuracy`.
// Returns the file's text for further checks (empty when it is missing).
std::string ExpectTrainedSummary(const std::string& path, int world_size,
                                 double min_accuracy);

}  // namespace ddprun::testing
