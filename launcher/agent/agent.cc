#include "launcher/agent/agent.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "launcher/agent/failure_report.h"
#include "launcher/agent/failure_summary.h"
#include "launcher/agent/heartbeat_loop.h"
#include "launcher/posix/local_address.h"
#include "launcher/agent/worker_env.h"
#include "launcher/posix/worker_output.h"
#include "spdlog/spdlog.h"

namespace ddprun::launcher {
namespace {

// Bound on retrying an unreachable rendezvous, whatever join_timeout says:
// a typo in --rdzv-endpoint should fail in seconds, not minutes.
constexpr absl::Duration kMaxUnreachableWait = absl::Seconds(30);

// How long prewarmed workers other than global rank 0 wait for MASTER_PORT
// to listen: torch's own retry would cost a second.
constexpr absl::Duration kMasterListenWait = absl::Seconds(1);

int64_t Millis(absl::Duration d) { return absl::ToInt64Milliseconds(d); }

}  // namespace

Agent::Agent(const LaunchOptions& options, AgentContext context,
             RendezvousClient& client, ProcessControl& control,
             AgentEvents& events, const common::Clock& clock)
    : options_(options),
      context_(std::move(context)),
      client_(client),
      control_(control),
      events_(events),
      clock_(clock) {
  if (!context_.standby_argv.empty()) {
    std::vector<std::string> env = context_.base_env;
    // Set before the standby imports torch, which reads it once.
    if (std::none_of(env.begin(), env.end(), [](const std::string& e) {
          return e.rfind("OMP_NUM_THREADS=", 0) == 0;
        })) {
      env.push_back("OMP_NUM_THREADS=1");
    }
    standbys_ = std::make_unique<StandbyPool>(control_, context_.standby_argv,
                                              std::move(env));
  }
}

v1::JoinRequest Agent::MakeJoinRequest(int master_port) const {
  v1::JoinRequest request;
  request.set_run_id(options_.rdzv_id);
  request.set_node_id(context_.node_id);
  request.set_local_world_size(options_.nproc_per_node);
  request.set_node_rank(options_.node_rank);
  request.set_address(context_.local_addr);
  request.set_master_port(master_port);
  v1::JobConfig* config = request.mutable_config();
  const RdzvConf& conf = options_.rdzv_conf;
  config->set_min_nodes(options_.min_nodes);
  config->set_max_nodes(options_.max_nodes);
  config->set_max_restarts(options_.max_restarts);
  config->set_last_call_timeout_ms(Millis(conf.last_call_timeout));
  config->set_join_timeout_ms(Millis(conf.join_timeout));
  config->set_heartbeat_interval_ms(Millis(conf.heartbeat_interval));
  config->set_heartbeat_timeout_ms(Millis(conf.heartbeat_timeout));
  return request;
}

std::string Agent::AttemptDir(int restart_count) const {
  if (!options_.log_dir.empty()) {
    return absl::StrFormat("%s/%s/attempt_%d", options_.log_dir,
                           options_.rdzv_id, restart_count);
  }
  return absl::StrFormat("%s/attempt_%d", context_.scratch_dir, restart_count);
}

int Agent::Run() {
  const RdzvConf& conf = options_.rdzv_conf;
  long last_round = 0;  // the last round this node was assigned
  while (true) {
    if (std::optional<int> sig = events_.stop_signal()) {
      // Stopped between rounds (e.g. while its workers were being stopped):
      // still tell the server, so that no round waits for this node.
      Leave(last_round, v1::LeaveRequest::REASON_SHUTDOWN);
      return 128 + *sig;
    }
    absl::StatusOr<int> master_port = ReservePort(context_.local_addr);
    if (!master_port.ok()) {
      spdlog::error("{}", std::string(master_port.status().message()));
      return 1;
    }
    spdlog::info("joining job '{}' at rendezvous {} as {}", options_.rdzv_id,
                 client_.endpoint(), context_.node_id);
    absl::StatusOr<v1::JoinResponse> joined =
        client_.Join(MakeJoinRequest(*master_port), conf.join_timeout,
                     std::min(conf.join_timeout, kMaxUnreachableWait));
    if (std::optional<int> sig = events_.stop_signal()) {
      spdlog::info("stopped by {} while joining", SignalName(*sig));
      long round = joined.ok() && joined->has_assignment()
                       ? joined->assignment().round()
                       : last_round;
      Leave(round, v1::LeaveRequest::REASON_SHUTDOWN);
      return 128 + *sig;
    }
    if (!joined.ok()) {
      spdlog::error("{}", std::string(joined.status().message()));
      return 1;
    }
    if (joined->has_ended()) {
      const v1::JobEnded& ended = joined->ended();
      if (ended.state() == v1::JOB_STATE_SUCCEEDED) {
        spdlog::info("job '{}' already succeeded", options_.rdzv_id);
        return 0;
      }
      std::string summary = FormatFailureSummary(options_.rdzv_id, ended);
      fputs(summary.c_str(), stderr);
      fflush(stderr);
      return 1;
    }
    const v1::Assignment& assignment = joined->assignment();
    last_round = assignment.round();
    spdlog::info(
        "round {}: node rank {} of {}, ranks {}..{} of {}, master {}:{}, "
        "restart {}/{}",
        assignment.round(), assignment.node_rank(), assignment.num_nodes(),
        assignment.rank_offset(),
        assignment.rank_offset() + options_.nproc_per_node - 1,
        assignment.world_size(), assignment.master_addr(),
        assignment.master_port(), assignment.restart_count(),
        assignment.max_restarts());
    switch (RunRound(assignment)) {
      case RoundEnd::kSucceeded:
        Leave(assignment.round(), v1::LeaveRequest::REASON_SUCCEEDED);
        spdlog::info("all {} local workers succeeded", options_.nproc_per_node);
        return 0;
      case RoundEnd::kStopped: {
        Leave(assignment.round(), v1::LeaveRequest::REASON_SHUTDOWN);
        int sig = events_.stop_signal().value_or(SIGTERM);
        return 128 + sig;
      }
      case RoundEnd::kRejoin:
        break;
    }
  }
}

Agent::RoundEnd Agent::RunRound(const v1::Assignment& assignment) {
  const int n = options_.nproc_per_node;
  std::string attempt_dir = AttemptDir(assignment.restart_count());
  std::error_code ec;
  std::filesystem::create_directories(attempt_dir, ec);
  if (ec) {
    spdlog::warn("cannot create {}: {}; workers get no error file", attempt_dir,
                 ec.message());
  }
  std::vector<std::string> error_files;
  for (int local_rank = 0; local_rank < n; ++local_rank) {
    std::string error_file =
        absl::StrFormat("%s/rank_%d.error.json", attempt_dir,
                        assignment.rank_offset() + local_rank);
    std::filesystem::remove(error_file, ec);  // only this attempt's errors
    error_files.push_back(error_file);
  }
  // Prewarmed workers already hold their progress channels.
  bool use_standbys = standbys_ != nullptr && standbys_->size() >= n;
  std::vector<ProgressChannel> progress;
  auto make_requests = [&](const std::vector<int>& progress_fds) {
    std::vector<SpawnRequest> requests;
    for (int local_rank = 0; local_rank < n; ++local_rank) {
      WorkerEnvSpec spec;
      spec.run_id = options_.rdzv_id;
      spec.role = options_.role;
      spec.local_rank = local_rank;
      spec.local_world_size = n;
      spec.rank = assignment.rank_offset() + local_rank;
      spec.world_size = assignment.world_size();
      spec.group_rank = assignment.node_rank();
      spec.group_world_size = assignment.num_nodes();
      spec.master_addr = assignment.master_addr();
      spec.master_port = assignment.master_port();
      spec.restart_count = assignment.restart_count();
      spec.max_restarts = assignment.max_restarts();
      spec.round = assignment.round();
      spec.error_file = error_files[local_rank];
      spec.store_endpoint = context_.store_endpoint;
      spec.local_addr = context_.local_addr;
      spec.credentials = context_.credentials;
      spec.progress_fd = progress_fds[local_rank];
      SpawnRequest request;
      request.argv = context_.worker_argv;
      request.env = BuildWorkerEnv(spec, context_.base_env);
      if (spec.progress_fd >= 0) request.inherit_fds = {spec.progress_fd};
      requests.push_back(std::move(request));
    }
    return requests;
  };
  auto fresh_requests = [&] {
    progress.clear();
    std::vector<int> fds;
    for (int local_rank = 0; local_rank < n; ++local_rank) {
      progress.emplace_back();
      fds.push_back(progress.back().write_fd());
    }
    return make_requests(fds);
  };
  std::vector<SpawnRequest> requests;
  if (use_standbys) {
    std::vector<int> fds;
    for (int i = 0; i < n; ++i) fds.push_back(standbys_->progress_fd(i));
    requests = make_requests(fds);
  } else {
    requests = fresh_requests();
  }

  WorkerOutputOptions output_options;
  output_options.attempt_dir = attempt_dir;
  output_options.num_workers = n;
  output_options.rank_offset = assignment.rank_offset();
  output_options.redirects = options_.redirects;
  output_options.tee = options_.tee;
  output_options.local_ranks_filter = options_.local_ranks_filter;
  absl::StatusOr<std::unique_ptr<WorkerOutput>> output =
      WorkerOutput::Open(output_options);
  if (!output.ok()) {
    spdlog::error("{}", std::string(output.status().message()));
    ReportFailures(assignment, {}, error_files,
                   std::string(output.status().message()));
    return RoundEnd::kRejoin;
  }
  for (int local_rank = 0; local_rank < n; ++local_rank) {
    requests[local_rank].stdout_fd = (*output)->stdout_fd(local_rank);
    requests[local_rank].stderr_fd = (*output)->stderr_fd(local_rank);
  }

  events_.TakeRejoin();  // a previous round's news is not this round's
  WorkerGroup group(control_, clock_);
  absl::Status started;
  if (use_standbys) {
    absl::StatusOr<std::vector<pid_t>> pids =
        ActivateStandbys(assignment, requests, progress);
    if (pids.ok()) {
      group.Adopt(*pids);
    } else {
      spdlog::warn("{}; starting workers afresh",
                   std::string(pids.status().message()));
      use_standbys = false;
      requests = fresh_requests();
      for (int local_rank = 0; local_rank < n; ++local_rank) {
        requests[local_rank].stdout_fd = (*output)->stdout_fd(local_rank);
        requests[local_rank].stderr_fd = (*output)->stderr_fd(local_rank);
      }
    }
  }
  if (!use_standbys) started = group.Start(requests, options_.shutdown_grace);
  for (ProgressChannel& channel : progress) channel.CloseWriteEnd();
  (*output)->StartCopying();
  if (!started.ok()) {
    spdlog::error("{}", std::string(started.message()));
    ReportFailures(assignment, {}, error_files, std::string(started.message()));
    return RoundEnd::kRejoin;
  }
  spdlog::info("{} {} workers: {}",
               use_standbys ? "activated prewarmed" : "started", n,
               context_.worker_argv[0]);
  // The next round's workers start now, while this round trains.
  if (standbys_ != nullptr) standbys_->Fill(n);
  RoundEnd end = Supervise(assignment, group, progress, error_files);
  // The workers are gone; what they wrote last still reaches the console and
  // the files (bounded: a worker's own children may hold a pipe open).
  (*output)->Finish(absl::Seconds(1));
  return end;
}

absl::StatusOr<std::vector<pid_t>> Agent::ActivateStandbys(
    const v1::Assignment& assignment, const std::vector<SpawnRequest>& requests,
    std::vector<ProgressChannel>& progress) {
  std::vector<std::vector<std::string>> envs;
  for (const SpawnRequest& r : requests) envs.push_back(r.env);
  progress.clear();
  // torch 1.13's env:// has global rank 0 host the TCPStore on MASTER_PORT;
  // a rank that connects before it listens sleeps a whole second before
  // trying again. Prewarmed rank 0 listens within milliseconds, so the
  // others go once it does (bounded: a program may never listen there).
  // Other programs (libddp: the rendezvous store) are told all at once.
  bool hosts_rank0 = assignment.rank_offset() == 0 &&
                     context_.rank0_listens_on_master_port;
  std::vector<pid_t> pids;
  if (hosts_rank0) {
    absl::StatusOr<std::vector<pid_t>> first =
        standbys_->Activate({envs[0]}, progress);
    if (!first.ok()) return first.status();
    pids = *first;
    envs.erase(envs.begin());
  }
  if (!envs.empty()) {
    if (context_.rank0_listens_on_master_port &&
        !WaitUntilListening(assignment.master_addr(), assignment.master_port(),
                            kMasterListenWait)) {
      spdlog::debug("nothing listens on MASTER_PORT {} after {}; going on",
                    assignment.master_port(),
                    absl::FormatDuration(kMasterListenWait));
    }
    absl::StatusOr<std::vector<pid_t>> rest =
        standbys_->Activate(envs, progress);
    if (!rest.ok()) {
      for (pid_t pid : pids) control_.SignalGroup(pid, SIGKILL);
      return rest.status();
    }
    pids.insert(pids.end(), rest->begin(), rest->end());
  }
  return pids;
}

Agent::RoundEnd Agent::Supervise(const v1::Assignment& assignment,
                                 WorkerGroup& group,
                                 std::vector<ProgressChannel>& progress,
                                 const std::vector<std::string>& error_files) {
  const int n = options_.nproc_per_node;
  HeartbeatLoopOptions hb;
  hb.run_id = options_.rdzv_id;
  hb.node_id = context_.node_id;
  hb.round = assignment.round();
  hb.interval = assignment.heartbeat_interval_ms() > 0
                    ? absl::Milliseconds(assignment.heartbeat_interval_ms())
                    : options_.rdzv_conf.heartbeat_interval;
  hb.timeout = options_.rdzv_conf.heartbeat_timeout;
  HeartbeatLoop heartbeat(client_, hb, [this] { events_.PostRejoin(); });

  SupervisorPolicyOptions policy_options;
  policy_options.num_workers = n;
  policy_options.worker_timeout = options_.worker_timeout;
  SupervisorPolicy policy(policy_options, clock_);
  AgentMetrics* metrics = context_.metrics;
  if (metrics != nullptr) metrics->RoundStarted(assignment, n);
  // Whatever ends the round, the metrics say no worker runs any more.
  absl::Cleanup round_ended = [metrics] {
    if (metrics != nullptr) metrics->RoundEnded();
  };
  int exited = 0;
  auto record_exits =
      [&](const std::vector<std::pair<int, ExitStatus>>& exits) {
        exited += static_cast<int>(exits.size());
        for (const auto& [local_rank, status] : exits) {
          if (!status.success()) {
            spdlog::warn("worker rank {} (local {}) ended: {}",
                         assignment.rank_offset() + local_rank, local_rank,
                         status.ToString());
          }
          policy.OnExit(local_rank, status);
        }
      };

  while (true) {
    absl::Duration wait = options_.monitor_interval;
    if (std::optional<absl::Time> hang = policy.NextHangDeadline()) {
      wait =
          std::max(absl::ZeroDuration(), std::min(wait, *hang - clock_.Now()));
    }
    events_.Wait(wait);
    if (std::optional<int> sig = events_.stop_signal()) {
      spdlog::info("got {}: stopping workers (grace {})", SignalName(*sig),
                   absl::FormatDuration(options_.shutdown_grace));
      // The signal itself first, as torchrun forwards it; then the usual
      // two phases.
      group.SignalAll(*sig);
      group.Stop(options_.shutdown_grace);
      return RoundEnd::kStopped;
    }
    record_exits(group.Reap());
    for (int i = 0; i < n; ++i) {
      if (progress[i].Drain()) {
        policy.OnProgress(i);
        if (metrics != nullptr) metrics->Progress(i, clock_.Now());
      }
    }
    if (metrics != nullptr) metrics->Update(n - exited, clock_.Now());
    switch (policy.Evaluate()) {
      case SupervisorPolicy::Verdict::kRunning:
        break;
      case SupervisorPolicy::Verdict::kSucceeded:
        return RoundEnd::kSucceeded;
      case SupervisorPolicy::Verdict::kFailed: {
        // Report first, so that the other nodes hear of it at their next
        // heartbeat while this one stops its workers.
        std::vector<LocalFailure> failures = policy.failures();
        for (const LocalFailure& f : failures) {
          if (f.cause == "hung") {
            spdlog::warn(
                "worker rank {} (local {}) is hung: no progress for {} "
                "(--worker-timeout)",
                assignment.rank_offset() + f.local_rank, f.local_rank,
                absl::FormatDuration(options_.worker_timeout));
          }
        }
        if (metrics != nullptr) {
          for (const LocalFailure& f : failures) metrics->WorkerFailed(f.cause);
        }
        ReportFailures(assignment, failures, error_files, "");
        group.Stop(options_.shutdown_grace);
        return RoundEnd::kRejoin;
      }
    }
    if (events_.TakeRejoin()) {
      group.Stop(options_.shutdown_grace);
      return RoundEnd::kRejoin;
    }
  }
}

void Agent::ReportFailures(const v1::Assignment& assignment,
                           const std::vector<LocalFailure>& failures,
                           const std::vector<std::string>& error_files,
                           const std::string& spawn_error) {
  FailureReportContext report;
  report.run_id = options_.rdzv_id;
  report.node_id = context_.node_id;
  report.host = context_.local_addr;
  report.round = assignment.round();
  report.rank_offset = assignment.rank_offset();
  report.worker_timeout = options_.worker_timeout;
  v1::ReportFailureRequest request = BuildFailureReport(
      report, failures, error_files, spawn_error, clock_.Now());
  absl::StatusOr<v1::ReportFailureResponse> response =
      client_.ReportFailure(request);
  if (!response.ok()) {
    spdlog::warn("{}", std::string(response.status().message()));
    return;
  }
  spdlog::info(
      "reported the failure of round {}; job restart count {}, restarts {}",
      assignment.round(), response->restart_count(),
      response->restarts_exhausted() ? "exhausted" : "left");
}

void Agent::Leave(long round, v1::LeaveRequest::Reason reason) {
  v1::LeaveRequest request;
  request.set_run_id(options_.rdzv_id);
  request.set_node_id(context_.node_id);
  request.set_round(round);
  request.set_reason(reason);
  absl::Status left = client_.Leave(request);
  if (!left.ok()) spdlog::warn("{}", std::string(left.message()));
}

}  // namespace ddprun::launcher
