#include "tests/e2e/summary_json.h"

#include <cstdlib>

#include <gtest/gtest.h>

#include "tests/testing/temp_dir.h"

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

std::string ExpectTrainedSummary(const std::string& path, int world_size,
                                 double min_accuracy) {
  std::string summary = ReadFileOrEmpty(path);
  EXPECT_FALSE(summary.empty()) << "rank 0 wrote no --summary-json";
  if (summary.empty()) return summary;
  EXPECT_EQ(SummaryNumber(summary, "world_size"), world_size) << summary;
  std::optional<double> accuracy = SummaryNumber(summary, "test_accuracy");
  EXPECT_TRUE(accuracy.has_value()) << summary;
  EXPECT_GE(accuracy.value_or(0), min_accuracy) << summary;
  return summary;
}

}  // namespace ddprun::testing
