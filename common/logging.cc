#include "common/logging.h"

#include <cstdlib>
#include <memory>
#include <string>

#include "common/json_string.h"
#include "spdlog/pattern_formatter.h"
#include "spdlog/sinks/stdout_color_sinks.h"

namespace ddprun::common {
namespace {

// %* in a pattern: the message as a JSON string literal.
class JsonMessageFlag final : public spdlog::custom_flag_formatter {
 public:
  void format(const spdlog::details::log_msg& msg, const std::tm&,
              spdlog::memory_buf_t& dest) override {
    std::string quoted;
    AppendJsonString(quoted,
                     absl::string_view(msg.payload.data(), msg.payload.size()));
    dest.append(quoted.data(), quoted.data() + quoted.size());
  }
  std::unique_ptr<custom_flag_formatter> clone() const override {
    return std::make_unique<JsonMessageFlag>();
  }
};

}  // namespace

void InitLogging(const LoggingOptions& options) {
  std::string format = options.format;
  if (format.empty()) {
    const char* env = std::getenv("DDPRUN_LOG_FORMAT");
    format = env != nullptr ? env : "text";
  }
  auto logger = spdlog::stderr_color_mt(options.name);
  if (format == "json") {
    auto formatter = std::make_unique<spdlog::pattern_formatter>(
        spdlog::pattern_time_type::utc);
    formatter->add_flag<JsonMessageFlag>('*').set_pattern(
        R"({"time":"%Y-%m-%dT%H:%M:%S.%eZ","program":"%n","level":"%l",)"
        R"("message":%*})");
    logger->set_formatter(std::move(formatter));
  } else {
    if (format != "text") {
      logger->warn(
          "unknown log format '{}' (DDPRUN_LOG_FORMAT); use text "
          "or json: logging as text",
          format);
    }
    logger->set_pattern("[%Y-%m-%d %H:%M:%S.%e] [%n] [%^%l%$] %v");
  }
  logger->set_level(spdlog::level::from_str(options.level));
  logger->flush_on(spdlog::level::info);
  spdlog::set_default_logger(logger);
}

}  // namespace ddprun::common
