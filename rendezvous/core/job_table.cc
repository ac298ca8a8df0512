#include "rendezvous/core/job_table.h"

#include <algorithm>
#include <limits>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_format.h"
#include "rendezvous/core/job_config.h"
#include "spdlog/spdlog.h"

namespace ddprun::rendezvous {

namespace {

JobTableOptions WithLimits(JobTableOptions options) {
  options.job.max_nodes = options.limits.max_nodes_per_job;
  options.job.max_failure_message_bytes =
      options.limits.max_failure_message_bytes;
  return options;
}

absl::Status CheckJoinSizes(const v1::JoinRequest& request,
                            const Limits& limits) {
  struct Field {
    const char* name;
    const std::string& value;
  };
  const Field fields[] = {{"run_id", request.run_id()},
                          {"node_id", request.node_id()},
                          {"address", request.address()}};
  for (const Field& f : fields) {
    if (static_cast<int64_t>(f.value.size()) > limits.max_id_bytes) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "Join refused: %s is %d bytes; the limit max_id_bytes is %d", f.name,
          f.value.size(), limits.max_id_bytes));
    }
  }
  if (request.config().max_nodes() > limits.max_nodes_per_job ||
      request.config().min_nodes() > limits.max_nodes_per_job) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "Join refused: --nnodes %d:%d is above this server's limit "
        "max_nodes_per_job %d",
        request.config().min_nodes(), request.config().max_nodes(),
        limits.max_nodes_per_job));
  }
  return absl::OkStatus();
}

// An id as a whole-batch refusal quotes it: ids are checked for size only
// per node, later, so a long one is cut (the status goes into a header).
std::string Shown(absl::string_view id) {
  constexpr size_t kMaxShown = 64;
  if (id.size() <= kMaxShown) return std::string(id);
  return absl::StrFormat("%s... (%d bytes)", id.substr(0, kMaxShown),
                         id.size());
}

}  // namespace

absl::Status CheckJoinBatch(const v1::JoinRequest& request) {
  if (request.more_size() == 0) return absl::OkStatus();
  const int n = request.more_size() + 1;
  if (n > kMaxJoinsPerMessage) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "a Join of job '%s' carries %d nodes, more than %d: split it into "
        "several messages",
        Shown(request.run_id()), n, kMaxJoinsPerMessage));
  }
  absl::flat_hash_set<absl::string_view> ids;
  ids.reserve(n);
  ids.insert(request.node_id());
  for (int i = 0; i < request.more_size(); ++i) {
    const v1::JoinRequest& more = request.more(i);
    if (more.run_id() != request.run_id()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "a Join of job '%s' carries in more[%d] node '%s' of job '%s': one "
          "message (and its one token check) holds nodes of one job only; "
          "send each job's nodes in their own Join",
          Shown(request.run_id()), i, Shown(more.node_id()),
          Shown(more.run_id())));
    }
    if (more.more_size() > 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "a Join of job '%s' carries in more[%d] (node '%s') a `more` of "
          "its own: list every node in the outer message's `more`",
          Shown(request.run_id()), i, Shown(more.node_id())));
    }
    if (!ids.insert(more.node_id()).second) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "a Join of job '%s' carries node '%s' twice (more[%d]): each node "
          "joins once per message",
          Shown(request.run_id()), Shown(more.node_id()), i));
    }
  }
  return absl::OkStatus();
}

JobTable::JobTable(const common::Clock* clock, JobTableOptions options)
    : clock_(clock), options_(WithLimits(options)) {}

absl::Status JobTable::NotFound(const std::string& run_id) const {
  return absl::NotFoundError(absl::StrFormat(
      "no job '%s' on this server: it never started here or it ended and "
      "was released; Join it (restart the agent) or check --rdzv-id",
      run_id));
}

absl::StatusOr<v1::JobConfig> JobTable::CheckJoin(
    const v1::JoinRequest& request) const {
  if (request.run_id().empty()) {
    return absl::InvalidArgumentError(
        "Join has an empty run_id; give --rdzv-id");
  }
  if (absl::Status sizes = CheckJoinSizes(request, options_.limits);
      !sizes.ok()) {
    return sizes;
  }
  absl::StatusOr<v1::JobConfig> config = NormalizeJobConfig(request.config());
  if (!config.ok()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("Join to job '%s' refused: %s", request.run_id(),
                        config.status().message()));
  }
  return config;
}

absl::StatusOr<Job*> JobTable::FindOrCreate(const v1::JoinRequest& request,
                                            const v1::JobConfig& config,
                                            absl::Time now) {
  auto it = jobs_.find(request.run_id());
  if (it == jobs_.end()) {
    if (static_cast<int64_t>(jobs_.size()) >= options_.limits.max_jobs) {
      return absl::ResourceExhaustedError(absl::StrFormat(
          "Join refused: this server already hosts %d jobs, its limit "
          "max_jobs; job '%s' cannot start here until others end",
          jobs_.size(), request.run_id()));
    }
    spdlog::info(
        "job '{}' created by node '{}': nodes {}:{}, max_restarts {}{}",
        request.run_id(), request.node_id(), config.min_nodes(),
        config.max_nodes(), config.max_restarts(),
        request.has_record() ? " (from the node's record of it)" : "");
    it = jobs_
             .emplace(request.run_id(),
                      std::make_unique<Job>(request.run_id(), config, now,
                                            options_.job))
             .first;
  } else if (std::string diff =
                 DescribeConfigDifference(it->second->config(), config);
             !diff.empty()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("Join of node '%s' to job '%s' refused: %s",
                        request.node_id(), request.run_id(), diff));
  }
  return it->second.get();
}

void JobTable::Join(const v1::JoinRequest& request, WaiterId waiter,
                    Effects* effects) {
  absl::StatusOr<v1::JobConfig> config = CheckJoin(request);
  if (!config.ok()) {
    effects->joins.push_back({waiter, config.status()});
    return;
  }
  absl::Time now = clock_->Now();
  absl::MutexLock lock(&mu_);
  JoinChecked(request, config, waiter, /*in_batch=*/false, now, effects);
}

void JobTable::JoinBatch(const v1::JoinRequest& request,
                         absl::Span<const WaiterId> waiters, Effects* effects) {
  const int n = request.more_size() + 1;
  if (static_cast<int>(waiters.size()) != n) {
    // (A caller's bug: every node needs its waiter.)
    for (WaiterId waiter : waiters) {
      effects->joins.push_back(
          {waiter,
           absl::InternalError(absl::StrFormat(
               "batched Join of %d nodes got %d waiters", n, waiters.size()))});
    }
    return;
  }
  std::vector<absl::StatusOr<v1::JobConfig>> configs;
  configs.reserve(n);
  configs.push_back(CheckJoin(request));
  for (const v1::JoinRequest& more : request.more()) {
    configs.push_back(CheckJoin(more));
  }
  absl::Time now = clock_->Now();
  absl::MutexLock lock(&mu_);
  JoinChecked(request, configs[0], waiters[0], /*in_batch=*/true, now, effects);
  for (int i = 1; i < n; ++i) {
    JoinChecked(request.more(i - 1), configs[i], waiters[i],
                /*in_batch=*/true, now, effects);
  }
}

void JobTable::JoinChecked(const v1::JoinRequest& request,
                           const absl::StatusOr<v1::JobConfig>& config,
                           WaiterId waiter, bool in_batch, absl::Time now,
                           Effects* effects) {
  if (!config.ok()) {
    effects->joins.push_back({waiter, config.status()});
    return;
  }
  absl::StatusOr<Job*> job = FindOrCreate(request, *config, now);
  if (!job.ok()) {
    effects->joins.push_back({waiter, job.status()});
    return;
  }
  (*job)->Join(request, waiter, now, effects, in_batch);
  Announce(**job);
}

absl::StatusOr<v1::ResumeResponse> JobTable::Resume(
    const v1::JoinRequest& request, Effects* effects) {
  if (request.more_size() > 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "Resume of node '%s' to job '%s' carries %d more nodes; Resume takes "
        "one node per call",
        Shown(request.node_id()), Shown(request.run_id()),
        request.more_size()));
  }
  if (!request.has_record()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "Resume of node '%s' to job '%s' has no record of its round; a node "
        "without one Joins",
        request.node_id(), request.run_id()));
  }
  absl::StatusOr<v1::JobConfig> config = CheckJoin(request);
  if (!config.ok()) return config.status();
  absl::Time now = clock_->Now();
  absl::MutexLock lock(&mu_);
  absl::StatusOr<Job*> job = FindOrCreate(request, *config, now);
  if (!job.ok()) return job.status();
  v1::ResumeResponse response = (*job)->Resume(request, now, effects);
  Announce(**job);
  return response;
}

void JobTable::CancelJoin(const std::string& run_id, const std::string& node_id,
                          WaiterId waiter, Effects* effects) {
  absl::Time now = clock_->Now();
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(run_id);
  if (it == jobs_.end()) return;
  it->second->CancelJoin(node_id, waiter, now, effects);
  Announce(*it->second);
}

absl::StatusOr<v1::HeartbeatResponse> JobTable::Heartbeat(
    const v1::HeartbeatRequest& request) {
  absl::Time now = clock_->Now();
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(request.run_id());
  if (it == jobs_.end()) return NotFound(request.run_id());
  absl::StatusOr<v1::HeartbeatResponse> response =
      it->second->Heartbeat(request, now);
  Announce(*it->second);
  return response;
}

absl::StatusOr<v1::HeartbeatResponse> JobTable::HeartbeatAnswer(
    const std::string& run_id, const std::string& node_id,
    int64_t round) const {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(run_id);
  if (it == jobs_.end()) return NotFound(run_id);
  return it->second->HeartbeatAnswer(node_id, round);
}

void JobTable::HeartbeatStreamEnded(const std::string& run_id,
                                    const std::string& node_id, int64_t round) {
  absl::Time now = clock_->Now();
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(run_id);
  if (it == jobs_.end()) return;
  it->second->HeartbeatStreamEnded(node_id, round, now);
  Announce(*it->second);
}

absl::StatusOr<v1::ReportFailureResponse> JobTable::ReportFailure(
    const v1::ReportFailureRequest& request, Effects* effects) {
  absl::Time now = clock_->Now();
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(request.run_id());
  if (it == jobs_.end()) return NotFound(request.run_id());
  absl::StatusOr<v1::ReportFailureResponse> response =
      it->second->ReportFailure(request, now, effects);
  Announce(*it->second);
  return response;
}

absl::Status JobTable::Leave(const v1::LeaveRequest& request,
                             Effects* effects) {
  absl::Time now = clock_->Now();
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(request.run_id());
  // NOT_FOUND, not OK: a server restarted since the node's last call has not
  // learnt the job yet, and the agent answers NOT_FOUND by re-registering
  // (Resume) and leaving again, so that the job's end is not lost.
  if (it == jobs_.end()) return NotFound(request.run_id());
  it->second->Leave(request, now, effects);
  Announce(*it->second);
  return absl::OkStatus();
}

absl::StatusOr<v1::StatusResponse> JobTable::Status(
    const v1::StatusRequest& request) const {
  absl::Time now = clock_->Now();
  absl::MutexLock lock(&mu_);
  v1::StatusResponse response;
  if (!request.run_id().empty()) {
    auto it = jobs_.find(request.run_id());
    if (it == jobs_.end()) return NotFound(request.run_id());
    *response.add_jobs() = it->second->Status(now, request.events());
    return response;
  }
  std::vector<const Job*> sorted;
  for (const auto& [id, job] : jobs_) sorted.push_back(job.get());
  std::sort(sorted.begin(), sorted.end(), [](const Job* a, const Job* b) {
    return a->run_id() < b->run_id();
  });
  for (const Job* job : sorted)
    *response.add_jobs() = job->Status(now, request.events());
  return response;
}

std::optional<int64_t> JobTable::CurrentRound(const std::string& run_id) const {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(run_id);
  if (it == jobs_.end()) return std::nullopt;
  return it->second->round();
}

absl::Status JobTable::CheckStoreScope(const v1::StoreScope& scope) const {
  std::optional<int64_t> round = CurrentRound(scope.run_id());
  if (!round.has_value()) return absl::OkStatus();
  int64_t current = *round;
  if (scope.round() == current) return absl::OkStatus();
  if (scope.round() < current) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "store scope of job '%s': round %d is over; the job is in round %d. "
        "This worker is stale: its agent must stop it and rejoin",
        scope.run_id(), scope.round(), current));
  }
  return absl::FailedPreconditionError(absl::StrFormat(
      "store scope of job '%s': round %d has not started; the job is in "
      "round %d. Use the round from the agent's assignment (DDPRUN_ROUND)",
      scope.run_id(), scope.round(), current));
}

void JobTable::AnswersDelivered(const ClosedRound& closed) {
  absl::Time now = clock_->Now();
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(closed.run_id);
  if (it == jobs_.end()) return;
  it->second->AnswersDelivered(closed.round, now);
  Announce(*it->second);
}

void JobTable::HeldAnswersDelivered(const std::string& run_id,
                                    absl::Span<const std::string> node_ids) {
  absl::Time now = clock_->Now();
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(run_id);
  if (it == jobs_.end()) return;
  it->second->HeldAnswersDelivered(node_ids, now);
  Announce(*it->second);
}

absl::Time JobTable::NextTick(const Job& job) const {
  absl::Time next = job.NextTick();
  if (std::optional<absl::Time> since = job.idle_since(); since.has_value()) {
    next = std::min(next, *since + options_.ended_job_grace);
  }
  return next;
}

void JobTable::Announce(const Job& job) const {
  if (options_.wake_by) options_.wake_by(NextTick(job));
}

absl::Time JobTable::Tick(Effects* effects) {
  absl::Time now = clock_->Now();
  absl::MutexLock lock(&mu_);
  std::vector<std::string> idle;
  absl::Time next = absl::InfiniteFuture();
  for (auto& [id, job] : jobs_) {
    job->Tick(now, effects);
    std::optional<absl::Time> since = job->idle_since();
    if (since.has_value() && now >= *since + options_.ended_job_grace) {
      idle.push_back(id);
    } else {
      next = std::min(next, NextTick(*job));
    }
  }
  for (const std::string& id : idle) {
    spdlog::info("job '{}' released after {} idle", id,
                 absl::FormatDuration(options_.ended_job_grace));
    jobs_.erase(id);
    effects->released.push_back({id, std::numeric_limits<int64_t>::max()});
  }
  return next;
}

void JobTable::CancelAllJoins(const absl::Status& status, Effects* effects) {
  absl::MutexLock lock(&mu_);
  for (auto& [id, job] : jobs_) job->CancelAllJoins(status, effects);
}

int64_t JobTable::AnswersForPoll() const {
  absl::MutexLock lock(&mu_);
  int64_t answers = 0;
  for (const auto& [id, job] : jobs_) answers += job->answers_for_poll();
  return answers;
}

size_t JobTable::num_jobs() const {
  absl::MutexLock lock(&mu_);
  return jobs_.size();
}

}  // namespace ddprun::rendezvous
