#include "relay/relay_flags.h"

#include "CLI/CLI.hpp"
#include "absl/time/time.h"
#include "common/cli.h"

namespace ddprun::relay {

RelayCommandLine ParseRelayFlags(int argc, const char* const* argv) {
  RelayCommandLine command;
  RelayOptions& relay = command.run.relay;
  CLI::App app{
      "ddprun-relay: agents dial it as their rendezvous server; it sends "
      "their Joins and heartbeats upstream in batches and passes every "
      "other call through"};
  app.add_option("--upstream", relay.upstream,
                 "the rendezvous server, HOST:PORT")
      ->required();
  app.add_option("--host", relay.host,
                 "address to listen on; 0.0.0.0 or :: for all interfaces")
      ->capture_default_str();
  app.add_option("--port", relay.port, "port; 0 lets the kernel pick one")
      ->capture_default_str()
      ->check(CLI::Range(0, 65535));
  app.add_option("--max-batch", relay.max_batch,
                 "nodes per upstream Join and per upstream heartbeat message")
      ->capture_default_str()
      ->check(CLI::Range(1, 1024));
  double batch_window_ms = absl::ToDoubleMilliseconds(relay.batch_window);
  app.add_option("--batch-window-ms", batch_window_ms,
                 "how long the first Join or heartbeat of a batch waits for "
                 "more before the batch is sent")
      ->capture_default_str()
      ->check(common::FiniteNonNegative());
  app.add_option("--tls-cert-file", relay.tls.cert_file,
                 "PEM certificate chain: serve TLS to the agents");
  app.add_option("--tls-key-file", relay.tls.key_file,
                 "PEM private key of --tls-cert-file");
  app.add_option("--tls-client-ca-file", relay.tls.client_ca_file,
                 "PEM CA: require client certificates it signed (mutual "
                 "TLS)");
  common::ChannelOptions& upstream = relay.upstream_channel;
  app.add_option("--upstream-tls-ca-file", upstream.tls_ca_file,
                 "PEM CA the server's certificate must chain to: dial the "
                 "upstream with TLS");
  app.add_option("--upstream-tls-cert-file", upstream.tls_cert_file,
                 "PEM client certificate for mutual TLS upstream");
  app.add_option("--upstream-tls-key-file", upstream.tls_key_file,
                 "PEM private key of --upstream-tls-cert-file");
  app.add_option("--upstream-tls-server-name", upstream.tls_server_name,
                 "the name checked against the server's certificate instead "
                 "of the upstream's host");
  app.add_option("--metrics-port", command.run.metrics_port,
                 "serve Prometheus /metrics on this port (0: the kernel "
                 "picks; -1: off)")
      ->capture_default_str();
  app.add_option("--metrics-host", command.run.metrics_host,
                 "address for /metrics (it needs no token)")
      ->capture_default_str();
  app.add_flag("--insecure", command.run.insecure,
               "listen beyond loopback without mutual TLS: where the "
               "server checks tokens, or only trusted hosts reach the port");
  common::AddLogLevelFlag(app, &command.logging.level);
  common::AddVersionFlag(app, "ddprun-relay");
  command.exit_code = common::ParseFlags(app, argc, argv, "ddprun-relay");
  if (command.exit_code.has_value()) return command;
  relay.batch_window = absl::Milliseconds(batch_window_ms);
  return command;
}

}  // namespace ddprun::relay
