#pragma once

#include <string>

#include "spdlog/spdlog.h"

namespace ddprun::common {

struct LoggingOptions {
  std::string name = "ddprun";  // shown in each line
  std::string level = "info";   // trace, debug, info, warn, error, off
  // "text": "[time] [name] [level] message"; "json": one JSON object a
  // line, {"time":..., "program":..., "level":..., "message":...}, time in
  // UTC (RFC 3339), for log collectors. Empty: DDPRUN_LOG_FORMAT from the
  // environment (which the agent passes on to its workers, so that one
  // setting covers a whole job), else text.
  std::string format;
};

// Sets the default spdlog logger: one line per event on stderr, in the
// options' format. Call once, from main.
void InitLogging(const LoggingOptions& options);

}  // namespace ddprun::common
