// ddprun-rendezvous: the rendezvous and store server for ddprun jobs.
#include "CLI/CLI.hpp"
#include "common/cli.h"
#include "common/logging.h"
#include "rendezvous/run_server.h"

int main(int argc, char** argv) {
  ddprun::rendezvous::RunServerOptions options;
  ddprun::rendezvous::ServerOptions& server = options.server;
  ddprun::common::LoggingOptions logging{.name = "ddprun-rendezvous"};
  CLI::App app{
      "ddprun-rendezvous: rounds, ranks, heartbeats and the "
      "key-value store for ddprun jobs"};
  app.add_option("--host", server.host,
                 "address to listen on; 0.0.0.0 or :: for all interfaces")
      ->capture_default_str();
  app.add_option("--port", server.port, "port; 0 lets the kernel pick one")
      ->capture_default_str()
      ->check(CLI::Range(0, 65535));
  app.add_option("--token-file", options.token_file,
                 "file holding the shared token every call must carry "
                 "(default: $DDPRUN_TOKEN; none: no check)");
  app.add_option("--tls-cert-file", server.tls.cert_file,
                 "PEM server certificate chain: serve TLS");
  app.add_option("--tls-key-file", server.tls.key_file,
                 "PEM private key of --tls-cert-file");
  app.add_option("--tls-client-ca-file", server.tls.client_ca_file,
                 "PEM CA: require client certificates it signed (mutual TLS)");
  app.add_option("--max-jobs", server.limits.max_jobs,
                 "jobs this server hosts at once")
      ->capture_default_str();
  app.add_option("--max-nodes-per-job", server.limits.max_nodes_per_job,
                 "nodes one job may have")
      ->capture_default_str();
  app.add_option("--max-value-bytes", server.limits.max_value_bytes,
                 "largest store value")
      ->capture_default_str();
  app.add_option("--max-keys-per-scope", server.limits.max_keys_per_scope,
                 "keys one store scope (job round) may hold")
      ->capture_default_str();
  app.add_option("--metrics-port", options.metrics_port,
                 "serve Prometheus /metrics on this port (0: the kernel "
                 "picks; -1: off)")
      ->capture_default_str();
  app.add_option("--metrics-host", options.metrics_host,
                 "address for /metrics (default: --host)");
  ddprun::common::AddLogLevelFlag(app, &logging.level);
  ddprun::common::AddVersionFlag(app, "ddprun-rendezvous");
  if (std::optional<int> code = ddprun::common::ParseFlags(
          app, argc, argv, "ddprun-rendezvous")) {
    return *code;
  }
  ddprun::common::InitLogging(logging);
  return ddprun::rendezvous::RunServerUntilSignal(options);
}
