#pragma once

#include <optional>
#include <string>

#include "common/logging.h"
#include "rendezvous/service/run_server.h"

namespace ddprun::rendezvous {

// `ddprun-rendezvous job-token --run-id ID [--token-file FILE]`.
struct JobTokenCommand {
  std::string run_id;
  // The server's token file; empty: DDPRUN_TOKEN.
  std::string token_file;
};

// What ddprun-rendezvous's command line asks for.
struct ServerCommandLine {
  // Serve (the default).
  RunServerOptions run;
  common::LoggingOptions logging{.name = "ddprun-rendezvous"};
  // Set by `job-token`: print that job's token instead of serving.
  std::optional<JobTokenCommand> job_token;
  // Set when the program ends at once with this code: 0 after --help or
  // --version (printed), 2 after a bad flag or value (one line on stderr
  // naming it and the fix).
  std::optional<int> exit_code;
};

// Parses ddprun-rendezvous's flags (every server option, with its default
// shown in --help) and its `job-token` subcommand.
ServerCommandLine ParseServerFlags(int argc, const char* const* argv);

}  // namespace ddprun::rendezvous
