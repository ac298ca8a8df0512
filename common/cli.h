#pragma once

// What every ddprun program's command line shares: --version, a validated
// --log-level and exit code 2 on bad usage (CLI11's own codes are 105-109).
// Header-only, so that ddprun_common needs no CLI11; its users have it.

#include <cmath>
#include <cstdio>
#include <iterator>
#include <optional>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "common/version.h"

namespace ddprun::common {

inline const std::vector<std::string>& LogLevels() {
  static const std::vector<std::string> levels = {
      "trace", "debug", "info", "warn", "error", "critical", "off"};
  return levels;
}

// --log-level, refused unless one of LogLevels(): spdlog reads an unknown
// name as "off", which would hide every message.
inline CLI::Option* AddLogLevelFlag(CLI::App& app, std::string* level) {
  return app
      .add_option("--log-level", *level,
                  "trace, debug, info, warn, error or off")
      ->capture_default_str()
      ->check(CLI::IsMember(LogLevels()));
}

// --log-format text|json (common/logging.h; default: DDPRUN_LOG_FORMAT, else
// text).
inline CLI::Option* AddLogFormatFlag(CLI::App& app, std::string* format) {
  return app
      .add_option("--log-format", *format,
                  "text or json (one JSON object a line); default: "
                  "DDPRUN_LOG_FORMAT, else text")
      ->check(CLI::IsMember({"text", "json"}));
}

// A number of seconds or milliseconds: finite and >= 0. CLI11's
// NonNegativeNumber lets "nan" and "inf" through (NaN fails no comparison).
inline CLI::Validator FiniteNonNegative() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        double value = 0;
        if (!CLI::detail::lexical_cast(text, value) || !std::isfinite(value) ||
            value < 0) {
          return "'" + text + "' is not a finite number >= 0; write e.g. 5";
        }
        return "";
      },
      "FINITE>=0");
}

inline void AddVersionFlag(CLI::App& app, const std::string& program) {
  app.set_version_flag("--version", program + " " + Version());
}

// Parses the command line. std::nullopt: go on; else the exit code: 0 after
// --help or --version (printed), 2 after a bad flag or value (one line on
// stderr naming it and the fix).
inline std::optional<int> ParseFlags(CLI::App& app, int argc,
                                     const char* const* argv,
                                     const std::string& program) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    app.exit(e);
    return 0;
  } catch (const CLI::CallForAllHelp& e) {
    app.exit(e);
    return 0;
  } catch (const CLI::CallForVersion& e) {
    app.exit(e);
    return 0;
  } catch (const CLI::ParseError& e) {
    std::string what = e.what();
    what = what.substr(0, what.find('\n'));
    std::fprintf(stderr, "%s: error: %s; run '%s --help' for the flags\n",
                 program.c_str(), what.c_str(), program.c_str());
    return 2;
  }
  return std::nullopt;
}

}  // namespace ddprun::common
