#include "rendezvous/service/server_flags.h"

#include "CLI/CLI.hpp"
#include "absl/time/time.h"
#include "common/cli.h"
#include "rendezvous/core/limits.h"

namespace ddprun::rendezvous {

namespace {

// Where the server listens and who may call it.
void AddListenFlags(CLI::App& app, RunServerOptions* run) {
  app.add_option("--host", run->server.host,
                 "address to listen on; 0.0.0.0 or :: for all interfaces")
      ->capture_default_str();
  app.add_option("--port", run->server.port, "port; 0 lets the kernel pick one")
      ->capture_default_str()
      ->check(CLI::Range(0, 65535));
  app.add_option("--token-file", run->token_file,
                 "file holding the server's token: calls must carry it or "
                 "their job's token (see job-token) (default: "
                 "$DDPRUN_TOKEN; none: no check)");
  app.add_option("--tls-cert-file", run->server.tls.cert_file,
                 "PEM server certificate chain: serve TLS");
  app.add_option("--tls-key-file", run->server.tls.key_file,
                 "PEM private key of --tls-cert-file");
  app.add_option("--tls-client-ca-file", run->server.tls.client_ca_file,
                 "PEM CA: require client certificates it signed (mutual TLS)");
}

// The limits that bound what clients may make the server hold.
void AddLimitFlags(CLI::App& app, Limits* limits) {
  app.add_option("--max-jobs", limits->max_jobs,
                 "jobs this server hosts at once")
      ->capture_default_str();
  app.add_option("--max-nodes-per-job", limits->max_nodes_per_job,
                 "nodes one job may have")
      ->capture_default_str();
  app.add_option("--max-value-bytes", limits->max_value_bytes,
                 "largest store value")
      ->capture_default_str();
  app.add_option("--max-keys-per-scope", limits->max_keys_per_scope,
                 "keys one store scope (job round) may hold")
      ->capture_default_str();
  app.add_option("--max-store-bytes", limits->max_store_bytes,
                 "memory the store may hold for all jobs together (keys, "
                 "values, parked calls; bytes)")
      ->capture_default_str();
  app.add_option("--max-job-store-bytes", limits->max_job_store_bytes,
                 "memory the store may hold for one job (bytes)")
      ->capture_default_str();
  limits->max_memory_bytes = kDefaultMemoryBytes;
  app.add_option("--max-memory-bytes", limits->max_memory_bytes,
                 "the server's resident memory (RSS) bound: a store write "
                 "that would pass it is refused (bytes; 0: only the store "
                 "caps bound the store)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--max-job-store-write-bytes-per-s",
                 limits->max_job_store_write_bytes_per_s,
                 "request bytes per second of one job's store writes (Set, "
                 "Add, CompareSet, DeleteKey; stored or refused alike) after "
                 "a burst: a job past it gets its writes answered (and "
                 "applied) late, which slows a client down to the rate "
                 "(0: no rate)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--job-store-write-burst-bytes",
                 limits->job_store_write_burst_bytes,
                 "store write bytes a job that wrote nothing for a while may "
                 "send at once before its rate applies")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--max-job-parked-write-bytes",
                 limits->max_job_parked_write_bytes,
                 "bytes of one job's store writes held back by its rate at "
                 "once; past it (or all jobs' past a twentieth of "
                 "--max-memory-bytes) a write is refused "
                 "RESOURCE_EXHAUSTED instead")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--max-held-store-refusals", limits->max_held_store_refusals,
                 "store writes refused past those parked bytes that are "
                 "answered late, when their job's rate has paid for them "
                 "(all jobs together; past it a refusal is answered at "
                 "once; 0: always at once)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--max-job-store-keys", limits->max_job_store_keys,
                 "keys the store may hold for one job, all its rounds")
      ->capture_default_str();
}

// The per-job policies a large job needs tuned: stragglers, heartbeat and
// poll budgets, parked Joins. `max_poll_delay_s` takes --max-poll-delay,
// `figures_interval_s` --figures-interval.
void AddJobPolicyFlags(CLI::App& app, ServerOptions* server,
                       double* max_poll_delay_s, double* figures_interval_s) {
  app.add_option("--straggler-factor", server->straggler.factor,
                 "a rank whose own compute time per step stays above this "
                 "many times the other ranks' median is named a straggler "
                 "(status, /metrics, the job page); 0: never")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--straggler-windows", server->straggler.windows,
                 "one-second windows in a row a rank must be that slow to be "
                 "named (and fine to be cleared)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--heartbeat-budget", server->heartbeat_budget_per_s,
                 "heartbeats per second one job may send: a larger job's "
                 "nodes are told a longer interval (and timeout, in "
                 "proportion); 0: never")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--figures-interval", *figures_interval_s,
                 "seconds: how often each node sends its ranks' straggler "
                 "figures at the latest (figures that changed much go at "
                 "once)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber & common::FiniteNonNegative());
  app.add_option("--figures-budget", server->figures_budget_per_s,
                 "straggler figures messages per second one job may send: "
                 "a larger job's nodes are told to send them less often "
                 "than once a second (stragglers are then named later); 0: "
                 "never")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--max-heartbeat-streams", server->max_heartbeat_streams,
                 "heartbeat streams open at once; the agents past it send "
                 "unary heartbeats (each open stream costs every call some "
                 "CPU with Debian's gRPC, and ~6-13 KiB; 0: none)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--max-parked-joins", server->max_parked_joins,
                 "Joins parked per job until its round closes (gRPC holds "
                 "~14 KiB per parked call); agents that can poll are told "
                 "beyond it to poll instead (older agents are always parked)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--poll-budget", server->poll_budget_per_s,
                 "polling Joins per second one job's waiting nodes may send: "
                 "more polling nodes are told a longer poll interval")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--max-poll-delay", *max_poll_delay_s,
                 "seconds: a waiting node is told to poll right after its "
                 "round's expected close, but at most this long from now")
      ->capture_default_str()
      ->check(CLI::PositiveNumber & common::FiniteNonNegative());
  app.add_option("--join-queues", server->join_queues,
                 "completion queues (one thread each) that serve Join; "
                 "more spread a large job's parked Joins thinner")
      ->capture_default_str()
      ->check(CLI::Range(1, 256));
}

}  // namespace

ServerCommandLine ParseServerFlags(int argc, const char* const* argv) {
  ServerCommandLine command;
  ServerOptions& server = command.run.server;
  CLI::App app{
      "ddprun-rendezvous: rounds, ranks, heartbeats and the "
      "key-value store for ddprun jobs"};
  AddListenFlags(app, &command.run);
  AddLimitFlags(app, &server.limits);
  double max_poll_delay_s = absl::ToDoubleSeconds(server.max_poll_delay);
  double figures_interval_s = absl::ToDoubleSeconds(server.figures_interval);
  AddJobPolicyFlags(app, &server, &max_poll_delay_s, &figures_interval_s);
  app.add_option("--metrics-port", command.run.metrics_port,
                 "serve Prometheus /metrics on this port (0: the kernel "
                 "picks; -1: off)")
      ->capture_default_str();
  app.add_option("--metrics-host", command.run.metrics_host,
                 "address for /metrics; it needs no token and names every "
                 "job, so widen it (e.g. 0.0.0.0) only where just your "
                 "scrapers reach it")
      ->capture_default_str();
  app.add_flag("--insecure", command.run.insecure,
               "listen beyond loopback without a token: only on a network "
               "that just trusted hosts reach");
  common::AddLogLevelFlag(app, &command.logging.level);
  common::AddLogFormatFlag(app, &command.logging.format);
  common::AddVersionFlag(app, "ddprun-rendezvous");
  JobTokenCommand job_token_command;
  CLI::App* job_token = app.add_subcommand(
      "job-token",
      "print the token that admits one job's agents and workers (and no "
      "other job): HMAC-SHA256 of the run id keyed by the server's token, "
      "in hex");
  job_token
      ->add_option("--run-id", job_token_command.run_id,
                   "the job's run id (--rdzv-id)")
      ->required();
  job_token->add_option("--token-file", job_token_command.token_file,
                        "the server's token file (default: $DDPRUN_TOKEN)");
  command.exit_code = common::ParseFlags(app, argc, argv, "ddprun-rendezvous");
  if (command.exit_code.has_value()) return command;
  if (*job_token) command.job_token = job_token_command;
  server.max_poll_delay = absl::Seconds(max_poll_delay_s);
  server.figures_interval = absl::Seconds(figures_interval_s);
  return command;
}

}  // namespace ddprun::rendezvous
