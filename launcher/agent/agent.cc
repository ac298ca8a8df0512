#include "launcher/agent/agent.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <filesystem>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/worker_env.h"
#include "common/worker_protocol.h"
#include "launcher/agent/failure_report.h"
#include "launcher/agent/failure_summary.h"
#include "launcher/agent/heartbeat_loop.h"
#include "launcher/agent/join_retry_policy.h"
#include "launcher/agent/rank_figures.h"
#include "launcher/posix/local_address.h"
#include "spdlog/spdlog.h"

namespace ddprun::launcher {
namespace {

// How long prewarmed workers other than global rank 0 wait for MASTER_PORT
// to listen: torch's own retry would cost a second.
constexpr absl::Duration kMasterListenWait = absl::Seconds(1);

int64_t Millis(absl::Duration d) { return absl::ToInt64Milliseconds(d); }

void LogAssignment(const v1::Assignment& assignment, int nproc_per_node) {
  spdlog::info(
      "round {}: node rank {} of {}, ranks {}..{} of {}, master {}:{}, "
      "restart {}/{}",
      assignment.round(), assignment.node_rank(), assignment.num_nodes(),
      assignment.rank_offset(), assignment.rank_offset() + nproc_per_node - 1,
      assignment.world_size(), assignment.master_addr(),
      assignment.master_port(), assignment.restart_count(),
      assignment.max_restarts());
}

void RouteOutput(const WorkerOutput& output, RoundPlan& plan) {
  for (int local_rank = 0; local_rank < static_cast<int>(plan.workers.size());
       ++local_rank) {
    plan.workers[local_rank].stdout_fd = output.stdout_fd(local_rank);
    plan.workers[local_rank].stderr_fd = output.stderr_fd(local_rank);
  }
}

// The workers go on into the next round in place: each carries its
// declaration of in-place recovery with it, and whether it is still
// starting.
void KeepDeclarations(WorkerGroup& group, const SupervisorPolicy& policy) {
  const std::vector<bool>& declared = policy.in_place_declared();
  for (int i = 0; i < group.size(); ++i) {
    group.slot(i).declared_in_place =
        i < static_cast<int>(declared.size()) && declared[i];
    group.slot(i).starting = policy.phase(i) == common::Phase::kStart;
  }
}

}  // namespace

Agent::Agent(AgentOptions options, AgentContext context, RendezvousApi& client,
             ProcessControl& control, AgentEvents& events,
             const common::Clock& clock)
    : options_(std::move(options)),
      context_(std::move(context)),
      client_(client),
      control_(control),
      events_(events),
      clock_(clock),
      phase_bounds_(options_.hang_bounds) {
  if (!context_.reserve_port) {
    context_.reserve_port =
        [this](const std::string& address) -> absl::StatusOr<int> {
      absl::StatusOr<HeldPort> held = HeldPort::Bind(address);
      if (!held.ok()) return held.status();
      held_master_port_ = std::move(*held);
      spdlog::debug(
          "holding port {} on {} (this node's MASTER_PORT offer) "
          "until the round's workers start",
          held_master_port_->port(), address);
      return held_master_port_->port();
    };
  }
  if (context_.standby_argv.empty()) return;
  StandbyPoolOptions pool_options;
  if (context_.prewarm_from_seed) {
    // Forked standbys need the agent to adopt them; exec'd ones would cost
    // a process start each, which only --prewarm asks for.
    if (!control_.AdoptsOrphans()) {
      spdlog::debug(
          "this agent cannot adopt forked standbys: no prewarming "
          "(--prewarm starts them by exec)");
      context_.standby_argv.clear();
      return;
    }
    // The zygote is forked by a worker where it waits for its round: no
    // process start of its own beside the training.
    pool_options.exec = false;
    pool_options.seed = true;
  }
  standbys_ = std::make_unique<StandbyPool>(
      control_, clock_, context_.standby_argv, BuildStandbyPlanEnv(context_),
      pool_options);
}

void Agent::PlantZygoteSeed(SpawnRequest& request) {
  if (standbys_ == nullptr) return;
  const int seed = standbys_->PlantSeed();
  if (seed < 0) return;
  request.env.push_back(absl::StrCat(common::env::kZygoteSeedFd, "=", seed));
  request.inherit_fds.push_back(seed);
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
  if (record_.has_value()) *request.mutable_record() = *record_;
  return request;
}

void Agent::Remember(const v1::Assignment& assignment) {
  record_.emplace();
  *record_->mutable_assignment() = assignment;
  record_->set_restart_count(assignment.restart_count());
}

void Agent::RememberReport(
    const absl::StatusOr<v1::ReportFailureResponse>& response) {
  if (!record_.has_value()) return;
  if (response.ok()) {
    record_->set_restart_count(
        std::max(record_->restart_count(), response->restart_count()));
  } else {
    // No server counted it: the next server learns it from the record.
    record_->set_failed(true);
  }
}

v1::JoinRequest Agent::MakeResumeRequest() const {
  return MakeJoinRequest(
      record_.has_value() ? record_->assignment().master_port() : 0);
}

int Agent::Run() {
  int64_t last_round = 0;  // the last round this node was assigned
  while (true) {
    if (std::optional<int> sig = events_.stop_signal()) {
      // Stopped between rounds (e.g. while its workers were being stopped):
      // still tell the server, so that no round waits for this node.
      Leave(last_round, v1::LeaveRequest::REASON_SHUTDOWN)
          .IgnoreError();  // logged by Leave; a stopping agent goes on
      return 128 + *sig;
    }
    Joined joined = JoinNextRound(last_round);
    if (!joined.assignment.has_value()) return joined.exit_code;
    v1::Assignment& assignment = *joined.assignment;
    last_round = assignment.round();
    Remember(assignment);
    LogAssignment(assignment, options_.nproc_per_node);
    const RoundOutcome outcome = RunRound(assignment);
    last_round = assignment.round();  // in-place rounds ran inside
    switch (outcome.end) {
      case RoundEnd::kSucceeded:
        LeaveSucceeded(assignment.round());
        spdlog::info("all {} local workers succeeded", options_.nproc_per_node);
        return 0;
      case RoundEnd::kStopped: {
        Leave(assignment.round(), v1::LeaveRequest::REASON_SHUTDOWN)
            .IgnoreError();  // logged by Leave; a stopping agent goes on
        int sig = events_.stop_signal().value_or(SIGTERM);
        return 128 + sig;
      }
      case RoundEnd::kEnded:
        return outcome.exit_code;
      case RoundEnd::kRejoin:
      case RoundEnd::kInPlace:
        break;
    }
  }
}

Agent::Joined Agent::JoinNextRound(int64_t last_round, WorkerGroup* survivors) {
  const RdzvConf& conf = options_.rdzv_conf;
  absl::StatusOr<int> master_port = context_.reserve_port(context_.local_addr);
  if (!master_port.ok()) {
    spdlog::error("{}", std::string(master_port.status().message()));
    return {.exit_code = 1};
  }
  spdlog::info("joining job '{}' at rendezvous {} as {}", options_.rdzv_id,
               client_.endpoint(), context_.node_id);
  const absl::Duration unreachable_timeout =
      JoinRetryPolicy::UnreachableTimeout(conf.join_timeout, conf.read_timeout);
  const v1::JoinRequest request = MakeJoinRequest(*master_port);
  absl::StatusOr<v1::JoinResponse> joined;
  if (survivors == nullptr) {
    joined = client_.Join(request, conf.join_timeout, unreachable_timeout);
  } else {
    // In place: the survivors may finish the job in the round just left
    // (their collectives outlived the round's end on the server), and then
    // nothing would form the next round. A child's change of state wakes
    // the Join to look (the signal thread: WakeJoin).
    joined = client_.JoinUnless(
        request, conf.join_timeout, unreachable_timeout,
        [this, survivors] { return WorkersAllSucceeded(*survivors); });
    if (IsJoinLeft(joined.status())) {
      spdlog::info(
          "this node's workers all succeeded while it joined the round after "
          "{}: they finished the job in that round",
          last_round);
      return {.workers_succeeded = true};
    }
  }
  if (std::optional<int> sig = events_.stop_signal()) {
    spdlog::info("stopped by {} while joining", SignalName(*sig));
    int64_t round = joined.ok() && joined->has_assignment()
                        ? joined->assignment().round()
                        : last_round;
    Leave(round, v1::LeaveRequest::REASON_SHUTDOWN)
        .IgnoreError();  // logged by Leave; a stopping agent goes on
    return {.exit_code = 128 + *sig};
  }
  if (!joined.ok()) {
    if (joined.status().code() == absl::StatusCode::kUnavailable) {
      // A supervisor restarts on this status (systemd's
      // RestartForceExitStatus, the Job's podFailurePolicy Count rule).
      spdlog::error(
          "{}; gave up after read_timeout ({}): exit {}, start the "
          "rendezvous first or raise --rdzv-conf read_timeout",
          std::string(joined.status().message()),
          absl::FormatDuration(unreachable_timeout),
          kExitRendezvousUnreachable);
      return {.exit_code = kExitRendezvousUnreachable};
    }
    spdlog::error("{}", std::string(joined.status().message()));
    return {.exit_code = 1};
  }
  if (joined->has_ended()) {
    const v1::JobEnded& ended = joined->ended();
    if (ended.state() == v1::JOB_STATE_SUCCEEDED) {
      spdlog::info("job '{}' already succeeded", options_.rdzv_id);
      return {.exit_code = 0};
    }
    std::string summary = FormatFailureSummary(options_.rdzv_id, ended);
    WriteAgentErrorFile(context_.agent_error_file, ended);
    fputs(summary.c_str(), stderr);
    fflush(stderr);
    return {.exit_code = 1};
  }
  return {.assignment = joined->assignment()};
}

bool Agent::WorkersAllSucceeded(WorkerGroup& group) {
  for (auto& exit : group.Reap()) early_exits_.push_back(std::move(exit));
  std::vector<bool> succeeded(group.size(), false);
  for (const auto& [local_rank, status] : early_exits_) {
    if (local_rank >= 0 && local_rank < group.size()) {
      succeeded[local_rank] = status.success();
    }
  }
  return !succeeded.empty() && std::all_of(succeeded.begin(), succeeded.end(),
                                           [](bool ok) { return ok; });
}

RoundPlan Agent::PlanRound(const v1::Assignment& assignment, bool use_standbys,
                           WorkerGroup& group) const {
  std::vector<int> fds;
  std::vector<int> control_fds;
  // Prewarmed workers already hold their progress and control channels;
  // workers started afresh get new ones.
  if (!use_standbys) group.OpenSlots(options_.nproc_per_node);
  for (int local_rank = 0; local_rank < options_.nproc_per_node; ++local_rank) {
    if (use_standbys) {
      fds.push_back(standbys_->progress_fd(local_rank));
      control_fds.push_back(standbys_->control_fd(local_rank));
    } else {
      const WorkerSlot& slot = group.slot(local_rank);
      fds.push_back(slot.progress.write_fd());
      control_fds.push_back(slot.control.child_fd());
    }
  }
  return BuildRoundPlan(options_, context_, assignment, fds, control_fds);
}

void Agent::PrepareAttemptDir(const RoundPlan& plan) const {
  // Only this attempt's files (a round after a scale event has the same
  // attempt number), and a folder per local rank, as torchrun.
  std::error_code ec;
  std::filesystem::remove_all(plan.attempt_dir, ec);
  for (const std::string& file : plan.error_files) {
    std::filesystem::path folder = std::filesystem::path(file).parent_path();
    if (!std::filesystem::create_directories(folder, ec) && ec) {
      spdlog::warn("cannot create {}: {}; workers get no error file",
                   folder.string(), ec.message());
    }
  }
}

Agent::RoundOutcome Agent::RunRound(v1::Assignment& assignment) {
  const int n = options_.nproc_per_node;
  early_exits_.clear();  // a fresh group: nothing of the last one's counts
  bool use_standbys = standbys_ != nullptr && standbys_->size() >= n;
  // Declared before the workers: it outlives them, and copies what they
  // wrote last.
  std::unique_ptr<WorkerOutput> output;
  WorkerGroup group(control_, clock_);
  RoundPlan plan = PlanRound(assignment, use_standbys, group);
  PrepareAttemptDir(plan);
  absl::StatusOr<std::unique_ptr<WorkerOutput>> opened =
      WorkerOutput::Open(plan.output);
  if (!opened.ok()) {
    spdlog::error("{}", std::string(opened.status().message()));
    ReportFailures(assignment, {}, plan.error_files,
                   std::string(opened.status().message()));
    return {.end = RoundEnd::kRejoin};
  }
  output = *std::move(opened);
  RouteOutput(*output, plan);

  events_.TakeRejoin();       // a previous round's news is not this round's
  held_master_port_.reset();  // global rank 0 may bind it now
  absl::Status started =
      StartWorkers(assignment, *output, plan, group, use_standbys);
  group.CloseWorkerEnds();
  output->StartCopying();
  if (!started.ok()) {
    spdlog::error("{}", std::string(started.message()));
    ReportFailures(assignment, {}, plan.error_files,
                   std::string(started.message()));
    return {.end = RoundEnd::kRejoin};
  }
  spdlog::info("{} {} workers: {}",
               use_standbys ? "activated prewarmed" : "started", n,
               context_.worker_argv[0]);
  // The next round's workers start now, while this round trains.
  if (standbys_ != nullptr) standbys_->Fill(n);
  RoundOutcome outcome = Supervise({assignment, plan, group});
  while (outcome.end == RoundEnd::kInPlace) {
    outcome =
        ContinueInPlace(assignment, plan, group, *output, outcome.replace);
  }
  // The workers are gone; what they wrote last still reaches the console and
  // the files (bounded: a worker's own children may hold a pipe open).
  output->Finish(absl::Seconds(1));
  return outcome;
}

absl::Status Agent::StartWorkers(const v1::Assignment& assignment,
                                 const WorkerOutput& output, RoundPlan& plan,
                                 WorkerGroup& group, bool& used_standbys) {
  if (used_standbys) {
    absl::StatusOr<std::vector<WorkerSlot>> activated =
        ActivateStandbys(assignment, plan.workers);
    if (activated.ok()) {
      group.Adopt(*std::move(activated));
      return absl::OkStatus();
    }
    spdlog::warn("{}; starting workers afresh",
                 std::string(activated.status().message()));
    used_standbys = false;
    plan = PlanRound(assignment, /*use_standbys=*/false, group);
    RouteOutput(output, plan);
  }
  std::vector<SpawnRequest> requests = plan.workers;
  PlantZygoteSeed(requests.front());
  absl::Status started = group.Start(requests, options_.shutdown_grace);
  if (standbys_ != nullptr) standbys_->SeedPlanted();
  return started;
}

absl::StatusOr<std::vector<WorkerSlot>> Agent::ActivateStandbys(
    const v1::Assignment& assignment,
    const std::vector<SpawnRequest>& requests) {
  std::vector<std::vector<std::string>> envs;
  for (const SpawnRequest& r : requests) envs.push_back(r.env);
  // torch 1.13's env:// has global rank 0 host the TCPStore on MASTER_PORT;
  // a rank that connects before it listens sleeps a whole second before
  // trying again. Prewarmed rank 0 listens within milliseconds, so the
  // others go once it does (bounded: a program may never listen there).
  // Other programs (libddp: the rendezvous store) are told all at once.
  bool hosts_rank0 =
      assignment.rank_offset() == 0 && context_.rank0_listens_on_master_port;
  std::vector<WorkerSlot> workers;
  if (hosts_rank0) {
    absl::StatusOr<std::vector<WorkerSlot>> first =
        standbys_->Activate({envs[0]});
    if (!first.ok()) return first.status();
    workers = *std::move(first);
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
    absl::StatusOr<std::vector<WorkerSlot>> rest = standbys_->Activate(envs);
    if (!rest.ok()) {
      for (const WorkerSlot& w : workers) control_.SignalGroup(w.pid, SIGKILL);
      return rest.status();
    }
    for (WorkerSlot& w : *rest) workers.push_back(std::move(w));
  }
  return workers;
}

HeartbeatLoopOptions Agent::HeartbeatOptions(
    const v1::Assignment& assignment) const {
  HeartbeatLoopOptions hb;
  hb.run_id = options_.rdzv_id;
  hb.node_id = context_.node_id;
  hb.round = assignment.round();
  hb.interval = assignment.heartbeat_interval_ms() > 0
                    ? absl::Milliseconds(assignment.heartbeat_interval_ms())
                    : options_.rdzv_conf.heartbeat_interval;
  hb.timeout = options_.rdzv_conf.heartbeat_timeout;
  if (assignment.figures_interval_ms() > 0) {
    hb.figures_interval = absl::Milliseconds(assignment.figures_interval_ms());
  }
  hb.resume = MakeResumeRequest();
  return hb;
}

Agent::RoundOutcome Agent::Supervise(const RunningRound& round) {
  // Whether the workers may still use the round's store (the heartbeat
  // thread asks after a rendezvous restart); updated at every look.
  std::atomic<bool> forming{true};
  // Declared before the heartbeat loop, which reads it.
  RankFigures figures(options_.nproc_per_node, clock_.Now());
  HeartbeatLoopOptions heartbeat_options = HeartbeatOptions(round.assignment);
  heartbeat_options.forming = [&forming] { return forming.load(); };
  heartbeat_options.figures = [this, &figures] {
    return figures.Summary(clock_.Now());
  };
  // The round's most steps and its furthest in the state sync, as the
  // server answers them, and since when a rank has been there: a local rank
  // behind is waited for by a rank of another node from then (OnRoundSteps,
  // OnRoundSync). Both ways they are dated by age, not by a clock another
  // machine would read.
  RoundProgressInbox round_progress;
  heartbeat_options.progress = [this, &figures] {
    const absl::Time now = clock_.Now();
    auto age = [now](const RankFigures::Most& most) {
      return most.value > 0 ? now - most.reached : absl::ZeroDuration();
    };
    const RankFigures::Most steps = figures.MostSteps();
    const RankFigures::Most sync = figures.MostSync();
    return HeartbeatLoopOptions::Progress{steps.value, age(steps), sync.value,
                                          age(sync)};
  };
  heartbeat_options.on_round_progress =
      [this, &round_progress](HeartbeatLoopOptions::Progress round) {
        const absl::Time now = clock_.Now();
        round_progress.Post({round.steps, now - round.steps_age, round.sync,
                             now - round.sync_age});
      };
  // Stragglers the server names, for the agent's thread (Observe).
  StragglerInbox stragglers;
  if (options_.replace_stragglers) {
    heartbeat_options.on_stragglers = [&stragglers](std::vector<int> ranks) {
      stragglers.Post(std::move(ranks));
    };
  }
  HeartbeatLoop heartbeat(client_, std::move(heartbeat_options),
                          [this] { events_.PostRejoin(); });
  SupervisorPolicyOptions policy_options;
  policy_options.num_workers = options_.nproc_per_node;
  policy_options.first_rank = round.assignment.rank_offset();
  policy_options.expect_reports = workers_report_;
  for (int i = 0; i < round.group.size(); ++i) {
    policy_options.in_place.push_back(round.group.slot(i).declared_in_place ||
                                      program_recovers_in_place_);
  }
  policy_options.survivors = round.survivors;
  policy_options.figured_steps = program_figures_steps_;
  policy_options.reports_between_steps = program_reports_between_steps_;
  policy_options.multi_node = round.assignment.num_nodes() > 1;
  SupervisorPolicy policy(policy_options, phase_bounds_, clock_);
  forming.store(policy.Forming());
  AgentMetrics* metrics = context_.metrics;
  if (metrics != nullptr) {
    metrics->RoundStarted(round.assignment, options_.nproc_per_node);
  }
  // Whatever ends the round, the metrics say no worker runs any more.
  absl::Cleanup round_ended = [metrics] {
    if (metrics != nullptr) metrics->RoundEnded();
  };
  int exited = 0;
  while (true) {
    events_.Wait(policy.WaitBefore(options_.monitor_interval));
    if (std::optional<int> sig = events_.stop_signal()) {
      return StopOnSignal(round, *sig);
    }
    if (std::optional<RoundProgressInbox::Latest> latest =
            round_progress.Take()) {
      policy.OnRoundSteps(latest->steps, latest->steps_since);
      policy.OnRoundSync(latest->sync, latest->sync_since);
    }
    Observe(round, policy, figures, exited);
    forming.store(policy.Forming());
    for (int local_rank : stragglers.Take()) {
      spdlog::warn(
          "worker rank {} (local {}) is a persistent straggler: replacing it "
          "(--straggler-policy replace)",
          round.assignment.rank_offset() + local_rank, local_rank);
      policy.OnStraggler(local_rank);
    }
    if (standbys_ != nullptr) standbys_->PromoteLate();
    if (std::optional<RoundOutcome> outcome = OnVerdict(round, policy)) {
      return *std::move(outcome);
    }
    if (events_.TakeRejoin()) return OnRoundOverElsewhere(round, policy);
  }
}

Agent::RoundOutcome Agent::StopOnSignal(const RunningRound& round, int sig) {
  spdlog::info("got {}: stopping workers (grace {})", SignalName(sig),
               absl::FormatDuration(options_.shutdown_grace));
  // The signal itself first, as torchrun forwards it; then the usual two
  // phases.
  round.group.SignalAll(sig);
  round.group.Stop(options_.shutdown_grace);
  return {.end = RoundEnd::kStopped};
}

std::optional<Agent::RoundOutcome> Agent::OnVerdict(const RunningRound& round,
                                                    SupervisorPolicy& policy) {
  switch (policy.Evaluate()) {
    case SupervisorPolicy::Verdict::kRunning:
      return std::nullopt;
    case SupervisorPolicy::Verdict::kSucceeded:
      return RoundOutcome{.end = RoundEnd::kSucceeded};
    case SupervisorPolicy::Verdict::kFailed:
      break;
  }
  if (policy.AwaitsRemoteCause(round.assignment.num_nodes())) {
    return std::nullopt;
  }
  RecoveryDecision decision = policy.DecideRecovery();
  if (!decision.in_place) return OnWorkersFailed(round, policy);
  KeepDeclarations(round.group, policy);
  return OnWorkersFailedInPlace(round, policy, decision);
}

Agent::RoundOutcome Agent::OnRoundOverElsewhere(
    const RunningRound& round, const SupervisorPolicy& policy) {
  // Another node failed: workers that recover in place go on into the next
  // round.
  if (policy.DecideRecovery().in_place) {
    KeepDeclarations(round.group, policy);
    spdlog::info(
        "round {} ended elsewhere; the workers continue in place "
        "into the next round",
        round.assignment.round());
    return {.end = RoundEnd::kInPlace};
  }
  spdlog::info("round {} is over: stopping workers (grace {})",
               round.assignment.round(),
               absl::FormatDuration(options_.shutdown_grace));
  round.group.Stop(options_.shutdown_grace);
  return {.end = RoundEnd::kRejoin};
}

void Agent::Observe(const RunningRound& round, SupervisorPolicy& policy,
                    RankFigures& figures, int& exited) {
  const int n = options_.nproc_per_node;
  AgentMetrics* metrics = context_.metrics;
  std::vector<std::pair<int, ExitStatus>> exits = std::move(early_exits_);
  early_exits_.clear();
  for (auto& exit : round.group.Reap()) exits.push_back(std::move(exit));
  for (const auto& [local_rank, status] : exits) {
    ++exited;
    if (!status.success()) {
      spdlog::warn("worker rank {} (local {}) ended: {}",
                   round.assignment.rank_offset() + local_rank, local_rank,
                   status.ToString());
    }
    policy.OnExit(local_rank, status);
    figures.SetExited(local_rank);
  }
  const std::vector<pid_t> pids = round.group.pids();
  for (int i = 0; i < n; ++i) {
    ProgressChannel& progress = round.group.slot(i).progress;
    const std::vector<common::ProgressRecord> records = progress.Drain();
    const absl::Time now = clock_.Now();
    for (const common::ProgressRecord& record : records) {
      policy.OnRecord(i, record);
      figures.OnRecord(i, record, now);
    }
    figures.SetPhase(i, policy.phase(i));
    if (!records.empty()) {
      if (static_cast<int>(workers_report_.size()) <= i) {
        workers_report_.resize(i + 1, false);
      }
      workers_report_[i] = true;
      if (metrics != nullptr) metrics->Progress(i, clock_.Now());
    }
    if (progress.declared_in_place()) {
      policy.OnInPlaceDeclared(i);
      program_recovers_in_place_ = true;
    }
    program_figures_steps_ |= policy.figured_steps();
    program_reports_between_steps_ |= policy.reports_between_steps();
    // A stopped worker (SIGSTOP) is found by its state, in any phase and
    // whether or not its program reports; a blocked or spinning one by its
    // state and CPU time too: a look at /proc per worker and monitor
    // interval.
    if (i < static_cast<int>(pids.size()) && pids[i] > 0) {
      const std::optional<ProcessState> state = control_.State(pids[i]);
      policy.OnProcessState(i, state.value_or(ProcessState{}));
    }
  }
  if (metrics != nullptr) metrics->Update(n - exited, clock_.Now());
}

Agent::RoundOutcome Agent::OnWorkersFailed(const RunningRound& round,
                                           const SupervisorPolicy& policy) {
  // Report first, so that the other nodes hear of it at their next
  // heartbeat while this one stops its workers.
  const std::vector<LocalFailure>& failures = policy.failures();
  for (const LocalFailure& f : failures) {
    if (f.cause == v1::FAILURE_CAUSE_HUNG) {
      spdlog::warn("worker rank {} (local {}) is hung: {}",
                   round.assignment.rank_offset() + f.local_rank, f.local_rank,
                   DescribeHang(f));
    }
    if (context_.metrics != nullptr) context_.metrics->WorkerFailed(f.cause);
  }
  ReportFailures(round.assignment, failures, round.plan.error_files, "");
  // A hung worker cannot use a grace period (a checkpoint on SIGTERM); the
  // others get it.
  for (const LocalFailure& f : failures) {
    if (f.cause == v1::FAILURE_CAUSE_HUNG ||
        f.cause == v1::FAILURE_CAUSE_STRAGGLER) {
      round.group.Kill(f.local_rank);
    }
  }
  round.group.Stop(options_.shutdown_grace);
  return {.end = RoundEnd::kRejoin};
}

// In-place recovery: only the failed workers are replaced; the survivors
// keep their processes and state and learn the next round on their control
// pipes (worker/recovery.h).
Agent::RoundOutcome Agent::OnWorkersFailedInPlace(
    const RunningRound& round, const SupervisorPolicy& policy,
    const RecoveryDecision& decision) {
  // Only the replaced workers failed; the others waited for them.
  std::vector<LocalFailure> failures;
  for (const LocalFailure& f : policy.failures()) {
    if (std::find(decision.replace.begin(), decision.replace.end(),
                  f.local_rank) != decision.replace.end()) {
      failures.push_back(f);
    }
  }
  for (const LocalFailure& f : failures) {
    if (f.cause == v1::FAILURE_CAUSE_HUNG) {
      spdlog::warn("worker rank {} (local {}) is hung: {}; killing it",
                   round.assignment.rank_offset() + f.local_rank, f.local_rank,
                   DescribeHang(f));
    }
    if (context_.metrics != nullptr) context_.metrics->WorkerFailed(f.cause);
  }
  for (int local_rank : decision.kill) round.group.Kill(local_rank);
  ReportFailures(round.assignment, failures, round.plan.error_files, "");
  spdlog::info(
      "recovering in place: replacing local rank(s) {}, the other "
      "workers keep running",
      absl::StrJoin(decision.replace, ","));
  return {.end = RoundEnd::kInPlace, .replace = decision.replace};
}

Agent::RoundOutcome Agent::ContinueInPlace(v1::Assignment& assignment,
                                           RoundPlan& plan, WorkerGroup& group,
                                           const WorkerOutput& output,
                                           const std::vector<int>& replace) {
  const int n = options_.nproc_per_node;
  Joined joined = JoinNextRound(assignment.round(), &group);
  if (joined.workers_succeeded) return {.end = RoundEnd::kSucceeded};
  if (!joined.assignment.has_value()) {
    group.Stop(options_.shutdown_grace);
    return {.end = RoundEnd::kEnded, .exit_code = joined.exit_code};
  }
  events_.TakeRejoin();  // news of the round just left
  assignment = *joined.assignment;
  Remember(assignment);  // a restarted server learns this round, not the last
  held_master_port_.reset();  // global rank 0 may bind it for the new group
  LogAssignment(assignment, n);
  const InPlaceSources sources = PlanInPlaceSources(
      n, replace, standbys_ != nullptr ? standbys_->size() : 0);
  // What the Join reaped of a local rank replaced now ended its old process
  // (a hung worker killed before the Join): not the new one's.
  early_exits_.erase(
      std::remove_if(early_exits_.begin(), early_exits_.end(),
                     [&](const std::pair<int, ExitStatus>& exit) {
                       return sources.by_local_rank[exit.first] !=
                              WorkerSource::kSurvivor;
                     }),
      early_exits_.end());
  plan = PlanInPlaceRound(assignment, sources, group);
  PrepareAttemptDir(plan);
  RouteOutput(output, plan);
  // The survivors first: their collectives in flight abort at once.
  SendRoundToSurvivors(plan, sources, group);
  for (int i = 0; i < n; ++i) {
    if (sources.by_local_rank[i] == WorkerSource::kSurvivor) continue;
    absl::Status started = ReplaceWorker({assignment, plan, group}, i, sources);
    if (!started.ok()) {
      spdlog::error("cannot replace local rank {}: {}", i,
                    std::string(started.message()));
      ReportFailures(assignment, {}, plan.error_files,
                     std::string(started.message()));
      group.Stop(options_.shutdown_grace);
      return {.end = RoundEnd::kRejoin};
    }
  }
  if (standbys_ != nullptr) standbys_->Fill(n);
  // A worker kept while it still starts is no survivor to the policy: it
  // has not reached its round's group yet, and its start's bound applies.
  std::vector<bool> survivors(n);
  for (int i = 0; i < n; ++i) {
    survivors[i] = sources.by_local_rank[i] == WorkerSource::kSurvivor &&
                   !group.slot(i).starting;
  }
  return Supervise({assignment, plan, group, survivors});
}

RoundPlan Agent::PlanInPlaceRound(const v1::Assignment& assignment,
                                  const InPlaceSources& sources,
                                  WorkerGroup& group) {
  const int n = options_.nproc_per_node;
  std::vector<int> progress_fds(n, -1);
  std::vector<int> control_fds(n, -1);
  for (int i = 0; i < n; ++i) {
    switch (sources.by_local_rank[i]) {
      case WorkerSource::kSurvivor:
        progress_fds[i] = group.slot(i).progress.child_fd();
        control_fds[i] = group.slot(i).control.child_fd();
        break;
      case WorkerSource::kStandby:
        progress_fds[i] = standbys_->progress_fd(sources.standby_index[i]);
        control_fds[i] = standbys_->control_fd(sources.standby_index[i]);
        break;
      case WorkerSource::kFresh:
        group.RenewPipes(i);
        progress_fds[i] = group.slot(i).progress.write_fd();
        control_fds[i] = group.slot(i).control.child_fd();
        break;
    }
  }
  return BuildRoundPlan(options_, context_, assignment, progress_fds,
                        control_fds);
}

void Agent::SendRoundToSurvivors(const RoundPlan& plan,
                                 const InPlaceSources& sources,
                                 WorkerGroup& group) {
  for (int i = 0; i < options_.nproc_per_node; ++i) {
    if (sources.by_local_rank[i] != WorkerSource::kSurvivor) continue;
    absl::Status sent = group.slot(i).control.Send(
        common::EncodeWorkerEnv(plan.workers[i].env));
    if (!sent.ok()) {
      spdlog::warn("local rank {}: {}", i, std::string(sent.message()));
    }
  }
}

absl::Status Agent::ReplaceWorker(const RunningRound& round, int local_rank,
                                  const InPlaceSources& sources) {
  WorkerGroup& group = round.group;
  const SpawnRequest& request = round.plan.workers[local_rank];
  if (sources.by_local_rank[local_rank] == WorkerSource::kStandby) {
    absl::StatusOr<std::vector<WorkerSlot>> activated =
        standbys_->Activate({request.env});
    if (!activated.ok()) return activated.status();
    group.AdoptAt(local_rank, std::move(activated->front()));
  } else {
    SpawnRequest seeded = request;
    PlantZygoteSeed(seeded);
    absl::Status started = group.Respawn(local_rank, seeded);
    if (standbys_ != nullptr) standbys_->SeedPlanted();
    group.CloseWorkerEnds(local_rank);
    if (!started.ok()) return started;
  }
  spdlog::info(
      "local rank {} (rank {}) {} as pid {}", local_rank,
      round.assignment.rank_offset() + local_rank,
      sources.uses_standbys ? "replaced by a prewarmed worker" : "started anew",
      group.pids()[local_rank]);
  return absl::OkStatus();
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
  v1::ReportFailureRequest request = BuildFailureReport(
      report, failures, error_files, spawn_error, clock_.Now());
  absl::StatusOr<v1::ReportFailureResponse> response =
      client_.ReportFailure(request);
  RememberReport(response);
  if (!response.ok()) {
    spdlog::warn("{}", std::string(response.status().message()));
    return;
  }
  spdlog::info(
      "reported the failure of round {}; job restart count {}, restarts {}",
      assignment.round(), response->restart_count(),
      response->restarts_exhausted() ? "exhausted" : "left");
}

absl::Status Agent::Leave(int64_t round, v1::LeaveRequest::Reason reason) {
  v1::LeaveRequest request;
  request.set_run_id(options_.rdzv_id);
  request.set_node_id(context_.node_id);
  request.set_round(round);
  request.set_reason(reason);
  absl::Status left = client_.Leave(request);
  if (absl::IsNotFound(left) && record_.has_value()) {
    spdlog::info(
        "rendezvous {} does not know job '{}' (restarted?): "
        "re-registering this node with its round {} record, then "
        "leaving again",
        client_.endpoint(), options_.rdzv_id, record_->assignment().round());
    absl::StatusOr<v1::ResumeResponse> resumed =
        client_.Resume(MakeResumeRequest());
    if (resumed.ok()) {
      left = client_.Leave(request);
    } else {
      spdlog::warn("{}", std::string(resumed.status().message()));
    }
  }
  if (!left.ok()) spdlog::warn("{}", std::string(left.message()));
  return left;
}

void Agent::LeaveSucceeded(int64_t round) {
  if (Leave(round, v1::LeaveRequest::REASON_SUCCEEDED).ok()) return;
  const RdzvConf& conf = options_.rdzv_conf;
  const absl::Duration patience =
      std::min(conf.join_timeout, conf.close_timeout);
  spdlog::info(
      "telling rendezvous {} again that this node's workers "
      "succeeded, for up to {}",
      client_.endpoint(), absl::FormatDuration(patience));
  const absl::Time give_up = clock_.Now() + patience;
  while (!events_.stop_signal().has_value() && clock_.Now() < give_up) {
    events_.Wait(conf.heartbeat_interval);
    absl::StatusOr<v1::ResumeResponse> resumed =
        client_.Resume(MakeResumeRequest());
    if (!resumed.ok() &&
        resumed.status().code() != absl::StatusCode::kUnimplemented) {
      continue;  // still unreachable
    }
    if (Leave(round, v1::LeaveRequest::REASON_SUCCEEDED).ok()) {
      spdlog::info("rendezvous {} heard that this node's workers succeeded",
                   client_.endpoint());
      return;
    }
  }
  spdlog::warn(
      "rendezvous {} did not hear that this node's workers "
      "succeeded; its other nodes may be restarted",
      client_.endpoint());
}

}  // namespace ddprun::launcher
