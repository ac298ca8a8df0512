// ddprun-rendezvous: the rendezvous and store server for ddprun jobs.
#include "CLI/CLI.hpp"
#include "common/logging.h"
#include "rendezvous/run_server.h"

int main(int argc, char** argv) {
  ddprun::rendezvous::ServerOptions options;
  ddprun::common::LoggingOptions logging{.name = "ddprun-rendezvous"};
  CLI::App app{"ddprun-rendezvous: rounds, ranks, heartbeats and the "
               "key-value store for ddprun jobs"};
  app.add_option("--host", options.host,
                 "address to listen on; 0.0.0.0 or :: for all interfaces")
      ->capture_default_str();
  app.add_option("--port", options.port, "port; 0 lets the kernel pick one")
      ->capture_default_str()
      ->check(CLI::Range(0, 65535));
  app.add_option("--log-level", logging.level,
                 "trace, debug, info, warn, error or off")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  ddprun::common::InitLogging(logging);
  return ddprun::rendezvous::RunServerUntilSignal(options);
}
