#pragma once

#include <optional>

#include "common/logging.h"
#include "relay/run_relay.h"

namespace ddprun::relay {

// What ddprun-relay's command line asks for.
struct RelayCommandLine {
  RunRelayOptions run;
  common::LoggingOptions logging{.name = "ddprun-relay"};
  // Set when the program ends at once with this code: 0 after --help or
  // --version (printed), 2 after a bad flag or value (one line on stderr
  // naming it and the fix).
  std::optional<int> exit_code;
};

// Parses ddprun-relay's flags (every relay option, with its default shown
// in --help).
RelayCommandLine ParseRelayFlags(int argc, const char* const* argv);

}  // namespace ddprun::relay
