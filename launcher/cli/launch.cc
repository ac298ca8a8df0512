#include "launcher/cli/launch.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/credentials.h"
#include "common/endpoint.h"
#include "common/logging.h"
#include "common/metrics.h"
#include "common/metrics_http.h"
#include "launcher/agent/agent.h"
#include "launcher/agent/agent_metrics.h"
#include "launcher/agent/failure_summary.h"
#include "launcher/agent/rendezvous_client.h"
#include "launcher/agent/worker_env.h"
#include "launcher/cli/farewell.h"
#include "launcher/cli/nproc.h"
#include "launcher/cli/program_command.h"
#include "launcher/cli/python_module.h"
#include "launcher/cli/worker_torch.h"
#include "launcher/posix/local_address.h"
#include "launcher/posix/orphan_guard.h"
#include "launcher/posix/process_control.h"
#include "launcher/posix/shm_dir.h"
#include "launcher/posix/signal_watcher.h"
#include "rendezvous/service/job_page.h"
#include "rendezvous/service/server.h"
#include "spdlog/spdlog.h"

namespace ddprun::launcher {
namespace {

bool LogsToFiles(const LaunchOptions& options) {
  return options.redirects.all != 0 || options.tee.all != 0 ||
         !options.redirects.by_local_rank.empty() ||
         !options.tee.by_local_rank.empty();
}

// The run's log folder, torchrun's layout: `<base>/<run_id>_<random>`, whose
// attempt_<n>/<local_rank>/ folders hold each worker's error.json (and, with
// --redirects or --tee, its stdout.log and stderr.log). `<base>` is --log-dir
// (created if missing, kept), or a temporary folder (torchrun's
// torchelastic_XXXXXX) removed when the agent ends unless it holds logs.
// --log-dir /dev/null means no log folder of the user's, as torch 2.x.
class RunLogDir {
 public:
  static absl::StatusOr<std::unique_ptr<RunLogDir>> Create(
      const LaunchOptions& options) {
    std::unique_ptr<RunLogDir> dir(new RunLogDir);
    std::string base = options.log_dir;
    if (base.empty() || base == "/dev/null") {
      const char* tmp = getenv("TMPDIR");
      std::string pattern = absl::StrFormat(
          "%s/torchelastic_XXXXXX", tmp != nullptr && *tmp ? tmp : "/tmp");
      if (mkdtemp(pattern.data()) == nullptr) {
        return absl::FailedPreconditionError(absl::StrFormat(
            "cannot create a temporary log folder '%s': %s; set TMPDIR to a "
            "writable folder",
            pattern, strerror(errno)));
      }
      base = pattern;
      dir->temporary_base_ = base;
      dir->keep_ = LogsToFiles(options);
    } else {
      std::error_code ec;
      std::filesystem::create_directories(base, ec);
      if (ec) {
        return absl::FailedPreconditionError(absl::StrFormat(
            "--log-dir: cannot create '%s': %s; give a writable folder", base,
            ec.message()));
      }
      // Workers get absolute paths (TORCHELASTIC_ERROR_FILE), whatever
      // folder they change to.
      std::filesystem::path absolute = std::filesystem::absolute(base, ec);
      if (!ec) base = absolute.lexically_normal().string();
    }
    // mkdtemp's random part is 6 letters or digits; torchrun's (Python's
    // tempfile) is 8 lowercase letters, digits or '_'.
    std::string run = absl::StrFormat("%s/%s_XXXXXX", base, options.rdzv_id);
    if (mkdtemp(run.data()) == nullptr) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "--log-dir: cannot create the run's log folder '%s': %s; give a "
          "writable folder",
          run, strerror(errno)));
    }
    dir->path_ = run;
    return dir;
  }
  ~RunLogDir() {
    std::error_code ignored;
    if (!temporary_base_.empty() && !keep_) {
      std::filesystem::remove_all(temporary_base_, ignored);
    }
  }
  const std::string& path() const { return path_; }
  // The temporary folder removed at the end; empty when there is none to
  // remove (--log-dir, or logs kept).
  std::string removable_base() const { return keep_ ? "" : temporary_base_; }

 private:
  RunLogDir() = default;
  bool keep_ = true;
  std::string temporary_base_;  // removed at the end unless keep_
  std::string path_;
};

// The rendezvous this agent talks to: the one at --rdzv-endpoint, or one
// served here (--standalone, or torchrun's agent-hosted and static forms).
// `channel` loses its TLS settings when this agent serves it in plaintext
// (--standalone without --host-tls-cert-file: loopback only).
struct Rendezvous {
  std::unique_ptr<rendezvous::Server> server;  // served by this agent
  common::Endpoint endpoint;
};

// Starts the in-process rendezvous server on host:port. `only_run_id`
// (torchrun's agent-hosted form) makes it serve that job alone; off
// loopback with neither a token nor mutual TLS it then answers no Status
// either, and warns: a torchrun c10d store is as open, no more. With `tls`
// (a certificate) it serves TLS, which this agent and its workers check with
// the CA of `channel`, and with tls.client_ca_file mutual TLS, for which
// they present the certificate of `channel`; without, it serves plaintext
// and `channel` drops its TLS.
absl::StatusOr<std::unique_ptr<rendezvous::Server>> Serve(
    const std::string& host, int port, const std::string& only_run_id,
    const common::ServerTlsOptions& tls, common::ChannelOptions& channel) {
  // The token (if any) guards it, as ddprun-rendezvous's --token-file.
  rendezvous::ServerOptions server_options;
  server_options.tls = tls;
  server_options.host = host;
  server_options.port = port;
  server_options.token = channel.token;
  server_options.only_run_id = only_run_id;
  // A client certificate signed by the client CA authenticates a caller
  // as a token does.
  const bool open_network = channel.token.empty() &&
                            tls.client_ca_file.empty() &&
                            !common::IsLoopbackHost(host);
  server_options.status_without_token = !open_network || only_run_id.empty();
  absl::StatusOr<std::unique_ptr<rendezvous::Server>> started =
      rendezvous::Server::Start(server_options);
  if (!started.ok()) return started;
  if (tls.cert_file.empty()) channel.ClearTls();
  if (open_network) {
    spdlog::warn(
        "the rendezvous this agent serves on {} takes no token: any host "
        "that reaches the port can join job '{}' and read or write its store "
        "(as with torchrun's c10d store). Give every agent the same "
        "--token-file (or DDPRUN_TOKEN), or mutual TLS "
        "(--host-tls-client-ca-file), or give --rdzv-endpoint an address "
        "only trusted hosts reach",
        (*started)->listen_address(), only_run_id);
  }
  return started;
}

// The files of a rendezvous this agent may serve, read as the server will
// read them, so that a missing or unreadable one is refused before anything
// starts (and an agent that might connect instead never hides it).
absl::Status CheckHostTlsFiles(const common::ServerTlsOptions& tls) {
  if (tls.cert_file.empty()) return absl::OkStatus();
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> credentials =
      common::CreateServerCredentials(tls);
  if (credentials.ok()) return absl::OkStatus();
  return absl::Status(
      credentials.status().code(),
      absl::StrCat("the TLS of the rendezvous this agent serves "
                   "(--host-tls-*): ",
                   credentials.status().message()));
}

// Returns the exit code on failure.
absl::StatusOr<Rendezvous> FindRendezvous(const LaunchOptions& options,
                                          common::ChannelOptions& channel,
                                          int& exit_code) {
  using Mode = LaunchOptions::RdzvMode;
  Rendezvous found;
  std::string endpoint = options.rdzv_endpoint;
  if (options.rdzv_mode == Mode::kStandalone) {
    absl::StatusOr<std::unique_ptr<rendezvous::Server>> started =
        Serve("127.0.0.1", 0, /*only_run_id=*/"", options.host_tls, channel);
    if (!started.ok()) {
      exit_code = 1;
      return absl::Status(started.status().code(),
                          absl::StrCat("cannot start the standalone "
                                       "rendezvous: ",
                                       started.status().message()));
    }
    found.server = std::move(*started);
    endpoint = found.server->endpoint();
    spdlog::info("standalone rendezvous on {}, run id {}", endpoint,
                 options.rdzv_id);
  }
  absl::StatusOr<common::Endpoint> parsed =
      common::ParseEndpoint(endpoint, /*default_port=*/29400);
  if (!parsed.ok()) {
    exit_code = 2;
    return absl::Status(
        parsed.status().code(),
        absl::StrCat("--rdzv-endpoint: ", parsed.status().message()));
  }
  if (absl::Status resolves = CheckHostResolves(parsed->host); !resolves.ok()) {
    exit_code = 2;
    return resolves;
  }
  // With --tls-ca-file the rendezvous is a TLS one: served here only with a
  // certificate (--host-tls-cert-file; kHost without one is refused by the
  // flags), never a plaintext one the other agents could not reach.
  const bool serves_tls = !options.host_tls.cert_file.empty();
  const bool may_host = options.rdzv_mode == Mode::kHost ||
                        (options.rdzv_mode == Mode::kHostOrConnect &&
                         (channel.tls_ca_file.empty() || serves_tls));
  if (options.rdzv_mode == Mode::kHostOrConnect && !may_host) {
    spdlog::info(
        "rendezvous at {}: with --tls-ca-file and no --host-tls-cert-file "
        "this agent joins a TLS ddprun-rendezvous or TLS-serving agent there "
        "(waiting for it up to read_timeout) and never serves one itself",
        parsed->ToString());
  }
  if (may_host) {
    // Binding decides: the address is this host's and nothing listens
    // there yet (SO_REUSEPORT is off), so one agent wins, as c10d's is_host.
    // A quiet probe first: gRPC logs raw errors for a bind that fails.
    absl::StatusOr<std::unique_ptr<rendezvous::Server>> started =
        options.rdzv_mode == Mode::kHostOrConnect && parsed->port != 0 &&
                !CanListenOn(parsed->host, parsed->port)
            ? absl::UnavailableError("the address is in use or not local")
            : Serve(parsed->host, parsed->port, options.rdzv_id,
                    options.host_tls, channel);
    if (started.ok()) {
      found.server = std::move(*started);
      parsed->port = found.server->port();
      spdlog::info(
          "serving the rendezvous on {} for this job (run id {}) {}; it "
          "ends with this agent: a separate ddprun-rendezvous outlives any "
          "node",
          found.server->listen_address(), options.rdzv_id,
          !serves_tls                               ? "in plaintext"
          : options.host_tls.client_ca_file.empty() ? "over TLS"
                                                    : "over mutual TLS");
    } else if (options.rdzv_mode == Mode::kHost) {
      exit_code = 1;
      return absl::Status(
          started.status().code(),
          absl::StrCat("cannot serve the rendezvous on ", parsed->ToString(),
                       ": ", started.status().message()));
    } else {
      spdlog::info("rendezvous at {} served elsewhere; joining it",
                   parsed->ToString());
    }
  }
  found.endpoint = *parsed;
  return found;
}

// The commands of the workers (and standbys); a missing program is found
// here, before this node joins and makes the others wait for it.
absl::Status SetCommands(const LaunchOptions& options, AgentContext& context) {
  const char* from_env = getenv("PYTHON_EXEC");
  std::string python_exec =
      from_env != nullptr && *from_env != '\0' ? from_env : "";
  if (python_exec.empty() && RunsUnderPython(options)) {
    char self[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
    if (n > 0) python_exec = PythonBeside(std::string(self, n));
  }
  context.worker_argv = BuildProgramArgv(options, python_exec);
  switch (options.prewarm) {
    case LaunchOptions::Prewarm::kOn:
      context.standby_argv = BuildStandbyArgv(options, python_exec);
      context.rank0_listens_on_master_port = RunsUnderPython(options);
      break;
    case LaunchOptions::Prewarm::kAuto:
      // Only forked from a zygote that a worker forks where its program
      // waits for its round: cheap, and nothing for a program that does not.
      if (!RunsUnderPython(options) && options.PlainConsole()) {
        context.standby_argv = BuildStandbyArgv(options, python_exec);
        context.prewarm_from_seed = true;
      }
      break;
    case LaunchOptions::Prewarm::kOff:
      break;
  }
  absl::Status resolved =
      ResolveProgram(context.worker_argv[0], context.base_env).status();
  if (resolved.ok() && RunsUnderPython(options)) {
    context.worker_torch =
        ProbeWorkerTorch(context.worker_argv[0], context.base_env);
  }
  return resolved;
}

// What the agent sets for the workers that a user may want to know.
void LogWorkerSettings(const LaunchOptions& options,
                       const std::string& log_dir) {
  if (!getenv("OMP_NUM_THREADS") && options.nproc_per_node > 1) {
    spdlog::info(
        "setting OMP_NUM_THREADS=1 for each worker to avoid overloading the "
        "system; set it yourself to tune");
  }
  // torchrun says it too ("log directory set to: ...").
  spdlog::log(
      LogsToFiles(options) || !options.log_dir.empty() ? spdlog::level::info
                                                       : spdlog::level::debug,
      "log directory set to: {} (attempt_<restart>/<local_rank>/)", log_dir);
}

// What the agent knows of its node before any round.
AgentContext MakeContext(const LaunchOptions& options,
                         const common::Endpoint& rdzv,
                         const common::ChannelOptions& channel) {
  AgentContext context;
  context.store_endpoint = rdzv.ToString();
  context.local_addr = options.local_addr.empty() ? DefaultLocalAddress(rdzv)
                                                  : options.local_addr;
  context.node_id = MakeNodeId();
  // Workers reach the store (the same server) as the agent does.
  context.credentials = channel.ForWorkers();
  context.base_env = CurrentEnvironment();
  // `import ddprun.progress` works in every worker (python/ddprun).
  if (std::optional<std::string> dir = FindPythonPackageDir("/proc/self/exe")) {
    AppendToPythonPath(context.base_env, *dir);
  }
  if (const char* error_file = getenv("TORCHELASTIC_ERROR_FILE")) {
    context.agent_error_file = error_file;
  }
  // torchrun's static default form on one node: --master-port is the
  // workers' MASTER_PORT (elsewhere the rendezvous serves on it).
  if (options.rdzv_mode == LaunchOptions::RdzvMode::kStandalone &&
      options.master_port > 0) {
    context.reserve_port = [port = options.master_port](
                               const std::string&) -> absl::StatusOr<int> {
      return port;
    };
  }
  return context;
}

// --metrics-port: the registry's /metrics endpoint; null when off. When
// this agent hosts the rendezvous (`hosted`), the job pages too
// (rendezvous/job_page.h).
absl::StatusOr<std::unique_ptr<common::MetricsServer>> StartMetrics(
    const LaunchOptions& options, common::MetricsRegistry& registry,
    const rendezvous::Server* hosted) {
  if (options.metrics_port < 0) return nullptr;
  common::MetricsServerOptions metrics_options;
  if (hosted != nullptr) {
    metrics_options.pages = [hosted](const std::string& target) {
      return rendezvous::JobPage(target,
                                 [hosted](const v1::StatusRequest& request) {
                                   return hosted->JobStatus(request);
                                 });
    };
  }
  metrics_options.host = options.metrics_host;
  metrics_options.port = options.metrics_port;
  absl::StatusOr<std::unique_ptr<common::MetricsServer>> started =
      common::MetricsServer::Start(metrics_options, &registry);
  if (!started.ok()) {
    return absl::Status(
        started.status().code(),
        absl::StrCat("--metrics-port: ", started.status().message()));
  }
  spdlog::info("metrics on {}", (*started)->url());
  return started;
}

// Logs `status` and returns `code`.
int Fail(const absl::Status& status, int code) {
  spdlog::error("{}", std::string(status.message()));
  return code;
}

// torchrun's flags and --rdzv-conf keys that mean nothing here, named once.
void LogIgnoredFlags(const LaunchOptions& options) {
  for (const std::string& flag : options.ignored_flags) {
    spdlog::info("{}: torchrun's flag, ignored (no meaning with ddprun)", flag);
  }
  for (const std::string& key : options.rdzv_conf.ignored) {
    spdlog::info(
        "--rdzv-conf {}: torchrun's key, ignored (no meaning with "
        "ddprun's rendezvous)",
        key);
  }
}

// Where the signal thread's news goes: the agent's events; once there is a
// client, a stop also cancels the Join in flight, and a child's change of
// state wakes it (an in-place Join looks at its workers: JoinUnless).
// Thread-safe.
class SignalRouter {
 public:
  explicit SignalRouter(AgentEvents& events) : events_(events) {}
  void OnSignal(int sig) {
    events_.PostSignal(sig);
    absl::MutexLock lock(&mu_);
    if (client_ != nullptr) client_->CancelJoin();
  }
  void OnChildEvent() {
    events_.PostChildEvent();
    absl::MutexLock lock(&mu_);
    if (client_ != nullptr) client_->WakeJoin();
  }
  void SetClient(RendezvousClient* client) {
    absl::MutexLock lock(&mu_);
    client_ = client;
  }

 private:
  AgentEvents& events_;
  absl::Mutex mu_;
  RendezvousClient* client_ ABSL_GUARDED_BY(mu_) = nullptr;
};

// What the agent knows of its node, and the folders it holds for the run
// (they go when the run ends).
struct NodeSetUp {
  AgentContext context;
  std::unique_ptr<ShmDir> shm_dir;  // null where /dev/shm cannot be used
  std::unique_ptr<RunLogDir> log_dir;
};

// Workers get the agent's token as a file, never as DDPRUN_TOKEN in their
// environment (which user code, crash reports and child processes see):
// when the agent's token came from DDPRUN_TOKEN, it is written to a 0600 file
// in the run's folder, which goes with the run.
absl::Status GiveWorkersTokenFile(const common::ChannelOptions& channel,
                                  AgentContext& context) {
  if (channel.token.empty() || !context.credentials.token_file.empty()) {
    return absl::OkStatus();
  }
  std::string path = context.scratch_dir + "/token";
  int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  bool ok = fd >= 0 && write(fd, channel.token.data(), channel.token.size()) ==
                           static_cast<ssize_t>(channel.token.size());
  int error = errno;
  if (fd >= 0) close(fd);
  if (!ok) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "cannot write the workers' token file '%s': %s; give the agent a "
        "writable --log-dir, or --token-file",
        path, strerror(error)));
  }
  context.credentials.token_file = path;
  return absl::OkStatus();
}

// The node's context: its folders, the worker commands (a missing program
// is an error here, before the node joins).
absl::StatusOr<NodeSetUp> SetUpNode(const LaunchOptions& options,
                                    const common::Endpoint& rdzv,
                                    const common::ChannelOptions& channel,
                                    OrphanGuard* guard) {
  NodeSetUp node;
  node.context = MakeContext(options, rdzv, channel);
  // Before the standbys start: they load their data before their round.
  absl::StatusOr<std::unique_ptr<ShmDir>> shm_dir = ShmDir::Create();
  if (shm_dir.ok()) {
    node.shm_dir = *std::move(shm_dir);
    node.context.shm_dir = node.shm_dir->path();
    if (guard != nullptr) guard->WatchPath(node.shm_dir->path());
  } else {
    spdlog::debug("{}", std::string(shm_dir.status().message()));
  }
  if (absl::Status s = SetCommands(options, node.context); !s.ok()) return s;
  absl::StatusOr<std::unique_ptr<RunLogDir>> log_dir =
      RunLogDir::Create(options);
  if (!log_dir.ok()) return log_dir.status();
  node.log_dir = *std::move(log_dir);
  node.context.scratch_dir = node.log_dir->path();
  if (guard != nullptr && !node.log_dir->removable_base().empty()) {
    guard->WatchPath(node.log_dir->removable_base());
  }
  if (absl::Status s = GiveWorkersTokenFile(channel, node.context); !s.ok()) {
    return s;
  }
  LogWorkerSettings(options, node.log_dir->path());
  return node;
}

// torchrun's exit barrier, for the rendezvous this agent serves to other
// nodes: they report their end to it, so it stays up after this node is
// done until every other node listed is done too, the job succeeded, or
// kLinger passed, or a signal stops this agent. Without it the other
// nodes' Leave found the server gone and retried for a minute.
void LingerForTheOtherNodes(const rendezvous::Server& server,
                            const std::string& run_id,
                            const std::string& node_id, AgentEvents& events) {
  constexpr absl::Duration kLinger = absl::Seconds(60);
  auto others_running = [&] {
    v1::StatusRequest request;
    request.set_run_id(run_id);
    absl::StatusOr<v1::StatusResponse> status = server.JobStatus(request);
    if (!status.ok()) return false;
    for (const v1::JobStatus& job : status->jobs()) {
      if (job.state() == v1::JOB_STATE_SUCCEEDED) return false;
      for (const v1::NodeStatus& node : job.nodes()) {
        if (node.node_id() != node_id &&
            node.node_state() != v1::NODE_STATE_DONE) {
          return true;
        }
      }
    }
    return false;
  };
  if (!others_running()) return;
  spdlog::info(
      "keeping the rendezvous this agent serves up until the other nodes "
      "are done (at most {})",
      absl::FormatDuration(kLinger));
  const absl::Time give_up = absl::Now() + kLinger;
  while (absl::Now() < give_up && !events.stop_signal().has_value() &&
         others_running()) {
    events.Wait(absl::Milliseconds(50));
  }
}

// Runs the agent to the job's end, with /metrics when --metrics-port asks.
int RunAgent(const LaunchOptions& options, AgentContext context,
             RendezvousClient& client, AgentEvents& events, OrphanGuard* guard,
             const rendezvous::Server* hosted) {
  // Declared before the agent that updates them; the server stops first.
  common::MetricsRegistry registry;
  std::unique_ptr<AgentMetrics> metrics;
  if (options.metrics_port >= 0) {
    metrics = std::make_unique<AgentMetrics>(registry);
    context.metrics = metrics.get();
  }
  absl::StatusOr<std::unique_ptr<common::MetricsServer>> metrics_server =
      StartMetrics(options, registry, hosted);
  if (!metrics_server.ok()) return Fail(metrics_server.status(), 2);
  PosixProcessControl control(guard);
  Agent agent(MakeAgentOptions(options), std::move(context), client, control,
              events, common::RealClock::Get());
  int code = agent.Run();
  if (*metrics_server != nullptr) (*metrics_server)->Shutdown();
  return code;
}

}  // namespace

AgentOptions MakeAgentOptions(const LaunchOptions& options) {
  AgentOptions agent;
  agent.rdzv_id = options.rdzv_id;
  agent.min_nodes = options.min_nodes;
  agent.max_nodes = options.max_nodes;
  agent.nproc_per_node = options.nproc_per_node;
  agent.node_rank = options.node_rank;
  agent.max_restarts = options.max_restarts;
  agent.rdzv_conf = options.rdzv_conf;
  agent.monitor_interval = options.monitor_interval;
  agent.hang_bounds = options.hang_bounds;
  agent.replace_stragglers = options.replace_stragglers;
  agent.shutdown_grace = options.shutdown_grace;
  agent.role = options.role;
  agent.virtual_local_rank = options.virtual_local_rank;
  agent.redirects = options.redirects;
  agent.tee = options.tee;
  agent.local_ranks_filter = options.local_ranks_filter;
  return agent;
}

int RunLaunch(const LaunchOptions& options) {
  SignalWatcher::BlockSignals();
  common::InitLogging({"ddprun", options.log_level});
  // First, while this is the only thread: it forks.
  absl::StatusOr<std::unique_ptr<OrphanGuard>> guard =
      OrphanGuard::Start("/proc/self/exe");
  if (!guard.ok()) {
    spdlog::warn(
        "{}; a kill -9 of this agent may leave its workers' "
        "children and its folders behind",
        std::string(guard.status().message()));
  }
  OrphanGuard* orphan_guard = guard.ok() ? guard->get() : nullptr;
  LogIgnoredFlags(options);
  AgentEvents events;
  SignalRouter router(events);
  // Created before any gRPC thread, so they all inherit the blocked mask.
  SignalWatcher signals({
      [&router](int sig) { router.OnSignal(sig); },
      [&router] { router.OnChildEvent(); },
  });
  if (absl::Status s = BecomeSubreaper(); !s.ok()) {
    spdlog::warn("{}; grandchildren of workers are not reaped",
                 std::string(s.message()));
  }
  absl::StatusOr<common::ChannelOptions> channel =
      MakeChannelOptions(options.auth);
  if (!channel.ok()) return Fail(channel.status(), 2);
  if (absl::Status files = CheckHostTlsFiles(options.host_tls); !files.ok()) {
    return Fail(files, 2);
  }
  int exit_code = 0;
  absl::StatusOr<Rendezvous> rdzv =
      FindRendezvous(options, *channel, exit_code);
  if (!rdzv.ok()) return Fail(rdzv.status(), exit_code);
  absl::StatusOr<NodeSetUp> node =
      SetUpNode(options, rdzv->endpoint, *channel, orphan_guard);
  if (!node.ok()) return Fail(node.status(), 2);

  RendezvousClientOptions client_options;
  client_options.endpoint = rdzv->endpoint.ToString();
  client_options.channel = *channel;
  absl::StatusOr<std::unique_ptr<RendezvousClient>> client =
      RendezvousClient::Create(client_options);
  if (!client.ok()) return Fail(client.status(), 2);
  router.SetClient(client->get());
  const std::string node_id = node->context.node_id;
  // An agent that serves the rendezvous takes it along when it dies.
  if (orphan_guard != nullptr && rdzv->server == nullptr) {
    Farewell farewell{.endpoint = client_options.endpoint,
                      .run_id = options.rdzv_id,
                      .node_id = node_id,
                      .credentials = channel->ForWorkers()};
    farewell.credentials.token = channel->token;
    orphan_guard->SetFarewell(EncodeFarewell(farewell));
  }
  const std::string agent_error_file = node->context.agent_error_file;
  int code = RunAgent(options, std::move(node->context), **client, events,
                      orphan_guard, rdzv->server.get());
  if (rdzv->server != nullptr && options.max_nodes > 1 &&
      !events.stop_signal().has_value()) {
    LingerForTheOtherNodes(*rdzv->server, options.rdzv_id, node_id, events);
  }
  router.SetClient(nullptr);
  // torchrun ends with its SignalException, exit status 1, whatever the
  // signal, and its @record writes that exception into its own
  // TORCHELASTIC_ERROR_FILE; schedulers and wrappers written for it read 1
  // as "stopped".
  if (std::optional<int> sig = events.stop_signal();
      sig.has_value() && code == 128 + *sig) {
    WriteAgentSignalErrorFile(agent_error_file, getpid(), *sig, absl::Now());
    if (!options.signal_exit_code_shell) code = 1;
  }
  return code;
}

}  // namespace ddprun::launcher
