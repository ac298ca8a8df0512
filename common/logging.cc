#include "common/logging.h"

#include "spdlog/sinks/stdout_color_sinks.h"

namespace ddprun::common {

void InitLogging(const LoggingOptions& options) {
  auto logger = spdlog::stderr_color_mt(options.name);
  logger->set_pattern("[%Y-%m-%d %H:%M:%S.%e] [%n] [%^%l%$] %v");
  logger->set_level(spdlog::level::from_str(options.level));
  logger->flush_on(spdlog::level::info);
  spdlog::set_default_logger(logger);
}

}  // namespace ddprun::common
