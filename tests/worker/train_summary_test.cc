// The --summary-json writer keeps the exact bits that its rounded figures
// hide: the final loss as a hex float, the parameters as a digest of their
// raw bytes.
#include "mnist/train_summary.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>

#include "absl/strings/match.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/temp_dir.h"

namespace ddprun::worker {
namespace {

using ::ddprun::testing::ReadFileOrEmpty;
using ::ddprun::testing::TempDir;

// The text of a string field ("name": "value") of the flat object.
std::string StringField(const std::string& json, const std::string& name) {
  const std::string key = "\"" + name + "\": \"";
  size_t at = json.find(key);
  if (at == std::string::npos) return "";
  at += key.size();
  return json.substr(at, json.find('"', at) - at);
}

TEST(TrainSummaryTest, Fnv1a64MatchesTheReferenceVectors) {
  EXPECT_EQ(Fnv1a64(""), 0xcbf29ce484222325ull);
  EXPECT_EQ(Fnv1a64("a"), 0xaf63dc4c8601ec8cull);
  EXPECT_EQ(Fnv1a64("foobar"), 0x85944171f73967e8ull);
  // Chained calls digest the buffers as one.
  EXPECT_EQ(Fnv1a64("bar", Fnv1a64("foo")), Fnv1a64("foobar"));
}

TEST(TrainSummaryTest, TheLossKeepsItsBitsAndTheDigestItsValue) {
  TempDir dir;
  TrainSummary summary;
  // 0.1 + 3 ulps: %.6f prints both as 0.100000.
  double loss = 0.1;
  for (int i = 0; i < 3; ++i) loss = std::nextafter(loss, 1.0);
  summary.final_loss = loss;
  summary.parameters_fnv1a64 = 0x0123456789abcdefull;
  ASSERT_TRUE(WriteTrainSummary(dir.File("s.json"), summary).ok());
  const std::string json = ReadFileOrEmpty(dir.File("s.json"));
  EXPECT_TRUE(absl::StrContains(json, "\"final_loss\": 0.100000")) << json;
  const std::string hex = StringField(json, "final_loss_hex");
  ASSERT_FALSE(hex.empty()) << json;
  const double read_back = std::strtod(hex.c_str(), nullptr);
  EXPECT_EQ(std::memcmp(&read_back, &loss, sizeof loss), 0) << hex;
  EXPECT_NE(read_back, 0.1) << hex;
  EXPECT_EQ(StringField(json, "parameters_fnv1a64"), "0123456789abcdef")
      << json;
}

}  // namespace
}  // namespace ddprun::worker
