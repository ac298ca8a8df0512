// The opt-in JSON log format: one object a line, the message escaped.
#include "common/logging.h"

#include <gtest/gtest.h>

#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"

namespace ddprun::common {
namespace {

TEST(LoggingTest, JsonFormatWritesOneParsableObjectPerLine) {
  ::testing::internal::CaptureStderr();
  InitLogging({.name = "json-test", .level = "info", .format = "json"});
  spdlog::warn("a \"quoted\" word\tand a tab");
  spdlog::default_logger()->flush();
  const std::string out = ::testing::internal::GetCapturedStderr();
  ASSERT_FALSE(out.empty());
  ASSERT_EQ(out.back(), '\n');
  EXPECT_EQ(out.find('\n'), out.size() - 1) << "one line: " << out;
  google::protobuf::Struct parsed;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(out, &parsed).ok())
      << out;
  EXPECT_EQ(parsed.fields().at("program").string_value(), "json-test");
  EXPECT_EQ(parsed.fields().at("level").string_value(), "warning");
  EXPECT_EQ(parsed.fields().at("message").string_value(),
            "a \"quoted\" word\tand a tab");
  EXPECT_NE(parsed.fields().at("time").string_value().find('T'),
            std::string::npos);
}

TEST(LoggingTest, TextFormatIsTheDefault) {
  ::testing::internal::CaptureStderr();
  InitLogging({.name = "text-test", .level = "info", .format = "text"});
  spdlog::info("plain");
  spdlog::default_logger()->flush();
  const std::string out = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(out.find("[text-test] [info] plain"), std::string::npos) << out;
}

}  // namespace
}  // namespace ddprun::common
