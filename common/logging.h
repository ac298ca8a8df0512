#pragma once

#include <string>

#include "spdlog/spdlog.h"

namespace ddprun::common {

struct LoggingOptions {
  std::string name = "ddprun";  // shown in each line
  std::string level = "info";   // trace, debug, info, warn, error, off
};

// Sets the default spdlog logger: one line per event on stderr,
// "[time] [name] [level] message". Call once, from main.
void InitLogging(const LoggingOptions& options);

}  // namespace ddprun::common
