#include "launcher/cli/launch.h"

#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <memory>

#include "absl/strings/str_format.h"
#include "common/endpoint.h"
#include "common/logging.h"
#include "common/metrics.h"
#include "common/metrics_http.h"
#include "launcher/agent/agent.h"
#include "launcher/agent/agent_metrics.h"
#include "launcher/posix/local_address.h"
#include "launcher/posix/process_control.h"
#include "launcher/cli/program_command.h"
#include "launcher/agent/rendezvous_client.h"
#include "launcher/posix/shm_dir.h"
#include "launcher/posix/signal_watcher.h"
#include "launcher/agent/worker_env.h"
#include "rendezvous/server.h"
#include "spdlog/spdlog.h"

namespace ddprun::launcher {
namespace {

// A per-run directory for the workers' error files (and, with --redirects or
// --tee, their logs) when there is no --log-dir. Removed when the agent ends
// unless it holds logs, as torchrun keeps its temporary log folder.
class ScratchDir {
 public:
  explicit ScratchDir(bool keep) : keep_(keep) {
    const char* tmp = getenv("TMPDIR");
    std::string pattern =
        absl::StrFormat("%s/ddprun-XXXXXX", tmp != nullptr ? tmp : "/tmp");
    if (mkdtemp(pattern.data()) != nullptr) path_ = pattern;
  }
  ~ScratchDir() {
    std::error_code ignored;
    if (!path_.empty() && !keep_) std::filesystem::remove_all(path_, ignored);
  }
  const std::string& path() const { return path_; }

 private:
  bool keep_;
  std::string path_;
};

}  // namespace

int RunLaunch(const LaunchOptions& options) {
  SignalWatcher::BlockSignals();
  common::InitLogging({"ddprun", options.log_level});
  AgentEvents events;
  // Created before any gRPC thread, so they all inherit the blocked mask.
  RendezvousClient* client_for_signals = nullptr;
  absl::Mutex client_mu;
  SignalWatcher signals({
      [&](int sig) {
        events.PostSignal(sig);
        absl::MutexLock lock(&client_mu);
        if (client_for_signals != nullptr) client_for_signals->CancelJoin();
      },
      [&] { events.PostChildEvent(); },
  });
  if (absl::Status s = BecomeSubreaper(); !s.ok()) {
    spdlog::warn("{}; grandchildren of workers are not reaped",
                 std::string(s.message()));
  }

  absl::StatusOr<common::ChannelOptions> channel =
      MakeChannelOptions(options.auth);
  if (!channel.ok()) {
    spdlog::error("{}", std::string(channel.status().message()));
    return 2;
  }
  std::string endpoint = options.rdzv_endpoint;
  std::unique_ptr<rendezvous::Server> server;
  if (options.standalone) {
    // Loopback only: a token (if any) guards it; TLS has no use here.
    rendezvous::ServerOptions server_options;
    server_options.host = "127.0.0.1";
    server_options.port = 0;
    server_options.token = channel->token;
    *channel = common::ChannelOptions{.token = channel->token};
    absl::StatusOr<std::unique_ptr<rendezvous::Server>> started =
        rendezvous::Server::Start(server_options);
    if (!started.ok()) {
      spdlog::error("cannot start the standalone rendezvous: {}",
                    std::string(started.status().message()));
      return 1;
    }
    server = std::move(*started);
    endpoint = server->endpoint();
    spdlog::info("standalone rendezvous on {}, run id {}", endpoint,
                 options.rdzv_id);
  }
  absl::StatusOr<common::Endpoint> parsed = common::ParseEndpoint(endpoint);
  if (!parsed.ok()) {
    spdlog::error("--rdzv-endpoint: {}",
                  std::string(parsed.status().message()));
    return 2;
  }

  AgentContext context;
  context.store_endpoint = parsed->ToString();
  context.local_addr = options.local_addr.empty() ? DefaultLocalAddress(*parsed)
                                                  : options.local_addr;
  context.node_id = MakeNodeId();
  RendezvousClientOptions client_options;
  client_options.endpoint = parsed->ToString();
  client_options.channel = *channel;
  if (!options.auth.token_file.empty()) {
    // Workers read the same token for their store calls.
    std::error_code ec;
    context.credentials.token_file = std::filesystem::absolute(options.auth.token_file, ec);
  }
  if (!channel->tls_ca_file.empty()) {
    // Workers reach the store (the same server) with the same TLS settings;
    // absolute, as workers may change directory.
    std::error_code ec;
    auto absolute = [&ec](const std::string& path) -> std::string {
      return path.empty() ? path
                          : std::filesystem::absolute(path, ec).string();
    };
    context.credentials.tls_ca_file = absolute(channel->tls_ca_file);
    context.credentials.tls_cert_file = absolute(channel->tls_cert_file);
    context.credentials.tls_key_file = absolute(channel->tls_key_file);
    context.credentials.tls_server_name = channel->tls_server_name;
  }
  const char* python_exec = getenv("PYTHON_EXEC");
  context.worker_argv =
      BuildProgramArgv(options, python_exec != nullptr ? python_exec : "");
  context.base_env = CurrentEnvironment();
  // Before the standbys start: they load their data before their round.
  absl::StatusOr<std::unique_ptr<ShmDir>> shm_dir = ShmDir::Create();
  if (shm_dir.ok()) {
    context.shm_dir = (*shm_dir)->path();
  } else {
    spdlog::debug("{}", std::string(shm_dir.status().message()));
  }
  if (options.prewarm) {
    context.standby_argv =
        BuildStandbyArgv(options, python_exec != nullptr ? python_exec : "");
    context.rank0_listens_on_master_port = RunsUnderPython(options);
  }
  // A missing program is found here, before this node joins and makes the
  // others wait for it.
  if (absl::StatusOr<std::string> program =
          ResolveProgram(context.worker_argv[0], context.base_env);
      !program.ok()) {
    spdlog::error("{}", std::string(program.status().message()));
    return 2;
  }
  if (!getenv("OMP_NUM_THREADS") && options.nproc_per_node > 1) {
    spdlog::info(
        "setting OMP_NUM_THREADS=1 for each worker to avoid overloading the "
        "system; set it yourself to tune");
  }
  bool logs_to_files = options.redirects.all != 0 || options.tee.all != 0 ||
                       !options.redirects.by_local_rank.empty() ||
                       !options.tee.by_local_rank.empty();
  ScratchDir scratch(/*keep=*/logs_to_files && options.log_dir.empty());
  context.scratch_dir = scratch.path();
  if (logs_to_files) {
    spdlog::info("worker logs in {}/attempt_<restart>/",
                 options.log_dir.empty()
                     ? scratch.path()
                     : options.log_dir + "/" + options.rdzv_id);
  }

  absl::StatusOr<std::unique_ptr<RendezvousClient>> created =
      RendezvousClient::Create(client_options);
  if (!created.ok()) {
    spdlog::error("{}", std::string(created.status().message()));
    return 2;
  }
  RendezvousClient& client = **created;
  {
    absl::MutexLock lock(&client_mu);
    client_for_signals = &client;
  }
  // Declared before the agent that updates them; the server stops first.
  common::MetricsRegistry registry;
  std::unique_ptr<AgentMetrics> metrics;
  std::unique_ptr<common::MetricsServer> metrics_server;
  if (options.metrics_port >= 0) {
    metrics = std::make_unique<AgentMetrics>(registry);
    common::MetricsServerOptions metrics_options;
    metrics_options.host = options.metrics_host;
    metrics_options.port = options.metrics_port;
    absl::StatusOr<std::unique_ptr<common::MetricsServer>> started =
        common::MetricsServer::Start(metrics_options, &registry);
    if (!started.ok()) {
      spdlog::error("--metrics-port: {}", std::string(started.status().message()));
      return 2;
    }
    metrics_server = std::move(*started);
    spdlog::info("metrics on {}", metrics_server->url());
    context.metrics = metrics.get();
  }
  PosixProcessControl control;
  Agent agent(options, std::move(context), client, control, events,
              common::RealClock::Get());
  int code = agent.Run();
  if (metrics_server != nullptr) metrics_server->Shutdown();
  {
    absl::MutexLock lock(&client_mu);
    client_for_signals = nullptr;
  }
  return code;
}

}  // namespace ddprun::launcher
