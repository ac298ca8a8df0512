#include "rendezvous/core/job.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <tuple>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/rendezvous_words.h"
#include "rendezvous/core/heartbeat_scaling.h"
#include "spdlog/spdlog.h"

namespace ddprun::rendezvous {

Job::Job(std::string run_id, v1::JobConfig config, absl::Time now,
         JobOptions options)
    : run_id_(std::move(run_id)),
      config_(std::move(config)),
      options_(options),
      heartbeat_interval_ms_(config_.heartbeat_interval_ms()),
      heartbeat_timeout_ms_(config_.heartbeat_timeout_ms()),
      last_activity_(now),
      poll_pacing_(options_.poll, config_, options_.heartbeat_budget_per_s),
      stragglers_(options_.straggler),
      events_(options_.max_events) {}

void Job::ScaleRoundHeartbeats(int64_t nodes) {
  const HeartbeatTiming timing = ScaleHeartbeats(
      config_.heartbeat_interval_ms(), config_.heartbeat_timeout_ms(), nodes,
      options_.heartbeat_budget_per_s);
  heartbeat_interval_ms_ = timing.interval_ms;
  heartbeat_timeout_ms_ = timing.timeout_ms;
  const int64_t base_figures_ms =
      absl::ToInt64Milliseconds(options_.figures_interval);
  SetFiguresInterval(ScaleFiguresInterval(base_figures_ms, nodes,
                                          options_.figures_budget_per_s));
  if (figures_interval_ms_ != base_figures_ms) {
    spdlog::info(
        "job '{}': {} nodes send their ranks' figures every {} ms, not {} "
        "ms, to stay within {} figures messages/s (--figures-budget)",
        run_id_, nodes, figures_interval_ms_, base_figures_ms,
        options_.figures_budget_per_s);
  }
  if (heartbeat_interval_ms_ == config_.heartbeat_interval_ms()) return;
  spdlog::info(
      "job '{}': {} nodes heartbeat every {} ms (timeout {} ms), not {} ms, "
      "to stay within {} heartbeats/s (--heartbeat-budget)",
      run_id_, nodes, heartbeat_interval_ms_, heartbeat_timeout_ms_,
      config_.heartbeat_interval_ms(), options_.heartbeat_budget_per_s);
}

void Job::SetFiguresInterval(int64_t interval_ms) {
  figures_interval_ms_ = interval_ms;
  stragglers_.SetReportInterval(absl::Milliseconds(interval_ms));
}

bool Job::ended() const {
  return state_ == v1::JOB_STATE_SUCCEEDED || state_ == v1::JOB_STATE_FAILED;
}

std::optional<absl::Time> Job::idle_since() const {
  if (ended_at_.has_value()) return ended_at_;
  if (nodes_.empty()) return last_activity_;
  return std::nullopt;
}

Job::Node& Job::NodeFor(const std::string& id, const v1::JoinRequest& request,
                        absl::string_view newer_call, Effects* effects) {
  auto [it, inserted] = nodes_.try_emplace(id);
  Node& node = it->second;
  if (inserted) node.arrival = next_arrival_++;
  if (node.waiting()) {
    Answer(node,
           absl::AbortedError(absl::StrFormat("superseded by %s from node '%s'",
                                              newer_call, id)),
           effects);
  }
  ClearAnswerForPoll(node);
  node.join = request;
  node.join.clear_config();
  node.join.clear_more();
  node.done = false;
  node.answer_held = false;
  return node;
}

void Job::Hold(Node& node, WaiterId waiter, bool in_batch) {
  node.waiter = waiter;
  node.waiter_in_batch = in_batch;
  if (!in_batch) ++parked_calls_;
}

void Job::Release(Node& node) {
  if (!node.waiter_in_batch) --parked_calls_;
  node.waiter.reset();
  node.waiter_in_batch = false;
}

bool Job::Park(Node& node, WaiterId waiter, bool poll, bool in_batch,
               absl::Time now) {
  node.join_deadline = now + absl::Milliseconds(config_.join_timeout_ms());
  node.last_seen = now;
  next_scan_ = std::min(next_scan_, node.join_deadline);
  ++parked_;
  poll_pacing_.Arrived(now);
  if (poll && !in_batch && parked_calls_ >= options_.max_parked_joins) {
    node.polling = true;
    ++polling_;
    node.poll_deadline = PollDeadline(now);
    next_scan_ = std::min(next_scan_, node.poll_deadline);
    return true;
  }
  Hold(node, waiter, in_batch);
  return false;
}

int64_t Job::PollDelayMs(absl::Time now) {
  std::optional<absl::Time> close;
  if (state_ == v1::JOB_STATE_JOINING && !resuming_.has_value()) {
    close = poll_pacing_.ExpectedClose(now, min_reached_at_, parked_);
  }
  return poll_pacing_.DelayMs(now, close, polling_);
}

absl::Time Job::PollDeadline(absl::Time now) const {
  return now + poll_pacing_.Timeout(poll_pacing_.IntervalMs(polling_), parked_);
}

void Job::RespondToPoll(const std::string& id, WaiterId waiter, absl::Time now,
                        Effects* effects, bool in_batch) {
  auto it = nodes_.find(id);
  if (it == nodes_.end()) {
    // (Not reached: nothing between Park and here drops a node.)
    return Refuse(
        waiter,
        absl::AbortedError(absl::StrFormat(
            "node '%s' was dropped from job '%s'; Join again", id, run_id_)),
        effects);
  }
  Node& node = it->second;
  if (node.answer_for_poll.has_value()) {
    absl::StatusOr<v1::JoinResponse> answer = *std::move(node.answer_for_poll);
    ClearAnswerForPoll(node);
    node.last_seen = now;  // a member's heartbeat clock starts now
    node.answer_held = in_batch && answer.ok() && answer->has_assignment();
    if (!answer.ok()) DropNode(id, now);
    effects->joins.push_back({waiter, std::move(answer)});
    return;
  }
  v1::JoinResponse response;
  v1::JoinWaiting* waiting = response.mutable_waiting();
  const int64_t delay = PollDelayMs(now);
  const absl::Duration timeout = poll_pacing_.Timeout(delay, parked_);
  // The node's deadline follows the delay it is given.
  node.poll_deadline = now + timeout;
  next_scan_ = std::min(next_scan_, node.poll_deadline);
  waiting->set_round(round_);
  waiting->set_poll_interval_ms(delay);
  waiting->set_poll_timeout_ms(absl::ToInt64Milliseconds(timeout));
  waiting->set_nodes_waiting(parked_);
  effects->joins.push_back({waiter, std::move(response)});
}

void Job::Poll(Node& node, const std::string& id, WaiterId waiter,
               bool in_batch, absl::Time now, Effects* effects) {
  // A poll sent at the expected close may come before the ticker saw the
  // last call end: it closes the round, and the poll collects at once.
  MaybeClose(now, effects);
  if (node.polling) {
    node.last_seen = now;
    node.poll_deadline = PollDeadline(now);
    next_scan_ = std::min(next_scan_, node.poll_deadline);
    if (in_batch || parked_calls_ < options_.max_parked_joins) {
      // A parked slot is free (a batch's node needs none): wait on this
      // call until the round closes.
      node.polling = false;
      --polling_;
      Hold(node, waiter, in_batch);
      return;
    }
  }
  RespondToPoll(id, waiter, now, effects, in_batch);
}

void Job::Answer(Node& node, absl::StatusOr<v1::JoinResponse> response,
                 Effects* effects) {
  if (node.waiter.has_value()) {
    // A batch holds the assignment until its last node is decided.
    node.answer_held =
        node.waiter_in_batch && response.ok() && response->has_assignment();
    effects->joins.push_back({*node.waiter, std::move(response)});
    Release(node);
  } else {
    // Polling: its next poll collects the answer.
    node.polling = false;
    --polling_;
    if (!node.answer_for_poll.has_value()) ++answers_for_poll_;
    node.answer_for_poll = std::move(response);
  }
  --parked_;
}

void Job::Refuse(WaiterId waiter, absl::Status status, Effects* effects) {
  effects->joins.push_back({waiter, std::move(status)});
}

v1::JobEnded Job::Ended() const {
  v1::JobEnded ended;
  ended.set_state(state_);
  for (const auto& f : failures_) *ended.add_failures() = f;
  if (state_ == v1::JOB_STATE_SUCCEEDED) {
    ended.set_message(absl::StrFormat(
        "job '%s' succeeded in round %d: every node's workers exited 0",
        run_id_, round_));
  } else {
    ended.set_message(absl::StrFormat(
        "job '%s' failed: %d restarts used, max_restarts is %d%s", run_id_,
        restart_count_, config_.max_restarts(),
        failures_.empty() ? "" : "; failures[0] is the root cause"));
  }
  return ended;
}

v1::JoinResponse Job::EndedResponse() const {
  v1::JoinResponse response;
  *response.mutable_ended() = Ended();
  return response;
}

void Job::Join(const v1::JoinRequest& request, WaiterId waiter, absl::Time now,
               Effects* effects, bool in_batch) {
  last_activity_ = now;
  if (ended()) {
    effects->joins.push_back({waiter, EndedResponse()});
    return;
  }
  const std::string& id = request.node_id();
  if (id.empty()) {
    return Refuse(waiter,
                  absl::InvalidArgumentError(absl::StrFormat(
                      "Join to job '%s' has no node_id; every agent must send "
                      "a unique node_id (host:pid:nonce)",
                      run_id_)),
                  effects);
  }
  if (request.poll()) {
    // A node polling for its round: its first Join was checked.
    if (auto it = nodes_.find(id);
        it != nodes_.end() &&
        (it->second.polling || it->second.answer_for_poll.has_value())) {
      return Poll(it->second, id, waiter, in_batch, now, effects);
    }
  }
  if (request.local_world_size() < 1) {
    return Refuse(waiter,
                  absl::InvalidArgumentError(absl::StrFormat(
                      "node '%s' asks for local_world_size %d; it must be at "
                      "least 1 (--nproc-per-node)",
                      id, request.local_world_size())),
                  effects);
  }
  if (request.node_rank() < -1 || request.node_rank() >= config_.max_nodes()) {
    return Refuse(waiter,
                  absl::InvalidArgumentError(absl::StrFormat(
                      "node '%s' asks for node_rank %d but job '%s' has "
                      "max_nodes %d; give --node-rank in [0, %d) or leave it "
                      "out",
                      id, request.node_rank(), run_id_, config_.max_nodes(),
                      config_.max_nodes())),
                  effects);
  }
  if (request.node_rank() >= 0) {
    for (const auto& [other_id, other] : nodes_) {
      if (other_id != id && other.waiting() &&
          other.join.node_rank() == request.node_rank()) {
        return Refuse(waiter,
                      absl::InvalidArgumentError(absl::StrFormat(
                          "node_rank %d is already taken by node '%s' in job "
                          "'%s'; give every node its own --node-rank",
                          request.node_rank(), other_id, run_id_)),
                      effects);
      }
    }
  }
  if (!nodes_.contains(id) &&
      static_cast<int64_t>(nodes_.size()) >= options_.max_nodes) {
    return Refuse(waiter,
                  absl::ResourceExhaustedError(absl::StrFormat(
                      "job '%s' already has %d nodes, the server's limit "
                      "max_nodes_per_job; node '%s' is refused",
                      run_id_, nodes_.size(), id)),
                  effects);
  }
  if (request.has_record()) {
    LearnFromRecord(request.record(), /*round_over=*/true, now, effects);
    if (ended()) {
      effects->joins.push_back({waiter, EndedResponse()});
      return;
    }
  }
  // An agent that retried while its first Join was still parked waits on
  // the newer call.
  Node& node = NodeFor(id, request, "a newer Join", effects);
  const bool polls = Park(node, waiter, request.poll(), in_batch, now);
  if (state_ == v1::JOB_STATE_RUNNING) {
    if (node.member) {
      spdlog::info(
          "job '{}': member '{}' joined again (its agent restarted); "
          "round {} ends",
          run_id_, id, round_);
      EndRound(now, effects);
    } else if (resuming_.has_value() && request.has_record() &&
               request.record().assignment().round() == round_) {
      // A member of the round being rebuilt that joins anew has left it
      // (it saw the round end before the server restarted): the round
      // cannot be whole again, so it ends now, not at the rebuild's
      // deadline (the heartbeat timeout).
      spdlog::info(
          "job '{}': node '{}' of round {} joins anew instead of resuming "
          "it; round {} ends",
          run_id_, id, round_, round_);
      round_decided_here_ = true;
      EndRound(now, effects);
    } else if (!resuming_.has_value() &&
               static_cast<int>(last_members_.size()) < config_.max_nodes()) {
      // (While a round is being resumed, newcomers wait until it is whole.)
      spdlog::info(
          "job '{}': node '{}' waits to join; round {} ends to "
          "admit it",
          run_id_, id, round_);
      EndRound(now, effects);
    }
    // Otherwise the round is full: the node waits, and heartbeats report it.
  }
  MaybeClose(now, effects);
  if (polls) RespondToPoll(id, waiter, now, effects);
}

void Job::CancelJoin(const std::string& node_id, WaiterId waiter,
                     absl::Time now, Effects* effects) {
  auto it = nodes_.find(node_id);
  if (it == nodes_.end() || it->second.waiter != waiter) return;
  Release(it->second);
  --parked_;
  DropNode(node_id, now);
  MaybeClose(now, effects);
}

bool Job::AllExpectedParked() const {
  for (const std::string& id : last_members_) {
    auto it = nodes_.find(id);
    if (it == nodes_.end()) continue;  // dropped: no longer expected
    const Node& node = it->second;
    // (A polling node whose Join timed out is dropped once it collects
    // that answer: no longer expected either.)
    if (node.answer_for_poll.has_value() && !node.answer_for_poll->ok()) {
      continue;
    }
    if (!node.done && !node.waiting()) return false;
  }
  return true;
}

void Job::MaybeClose(absl::Time now, Effects* effects) {
  if (state_ != v1::JOB_STATE_JOINING) return;
  if (parked_ < config_.min_nodes()) {
    min_reached_at_.reset();
    return;
  }
  if (!min_reached_at_.has_value()) min_reached_at_ = now;
  bool full = parked_ >= config_.max_nodes();
  bool all_back = !last_members_.empty() && AllExpectedParked();
  bool last_call_over =
      now >=
      *min_reached_at_ + absl::Milliseconds(config_.last_call_timeout_ms());
  if (full || all_back || last_call_over) Close(now, effects);
}

std::vector<Job::Entry*> Job::ChooseMembers() {
  std::vector<Entry*> pinned;  // asked for a node_rank
  std::vector<Entry*> others;
  for (auto& entry : nodes_) {
    if (!entry.second.waiting()) continue;
    (entry.second.join.node_rank() >= 0 ? pinned : others).push_back(&entry);
  }
  // Join refuses duplicate and out-of-range node ranks among parked nodes,
  // so each pinned node has its own slot below max_nodes.
  std::vector<Entry*> slots(config_.max_nodes(), nullptr);
  for (Entry* e : pinned) slots[e->second.join.node_rank()] = e;
  std::sort(others.begin(), others.end(), [](Entry* a, Entry* b) {
    const Node& x = a->second;
    const Node& y = b->second;
    return std::make_tuple(x.previous_rank < 0, x.previous_rank, x.arrival) <
           std::make_tuple(y.previous_rank < 0, y.previous_rank, y.arrival);
  });
  size_t free_slot = 0;
  size_t taken = pinned.size();
  for (Entry* e : others) {
    if (taken >= slots.size()) break;  // the rest wait for the next round
    while (slots[free_slot] != nullptr) ++free_slot;
    slots[free_slot] = e;
    ++taken;
  }
  std::vector<Entry*> ordered;
  for (Entry* e : slots) {
    if (e != nullptr) ordered.push_back(e);
  }
  return ordered;
}

void Job::Close(absl::Time now, Effects* effects) {
  const std::vector<Entry*> ordered = ChooseMembers();
  for (auto& [id, node] : nodes_) {
    node.member = false;
    node.previous_rank = -1;
    node.rank_offset = -1;
    node.ranks.Clear();
  }
  stragglers_.Reset();  // ranks move between rounds
  round_steps_.Reset();
  round_sync_.Reset();
  last_members_.clear();
  last_peers_.clear();
  int offset = 0;
  for (size_t i = 0; i < ordered.size(); ++i) {
    Node& node = ordered[i]->second;
    node.member = true;
    node.previous_rank = static_cast<int>(i);
    node.rank_offset = offset;
    v1::Peer& peer = last_peers_.emplace_back();
    peer.set_node_id(ordered[i]->first);
    peer.set_node_rank(static_cast<int>(i));
    peer.set_address(node.join.address());
    peer.set_local_world_size(node.join.local_world_size());
    peer.set_rank_offset(offset);
    offset += node.join.local_world_size();
    last_members_.push_back(ordered[i]->first);
  }
  world_size_ = offset;
  state_ = v1::JOB_STATE_RUNNING;
  round_decided_here_ = true;
  min_reached_at_.reset();
  poll_pacing_.RoundFormed();
  next_scan_ = absl::InfinitePast();  // new heartbeat clocks and timeout
  heartbeat_clock_start_ = now;
  effects->closed.push_back({run_id_, round_});

  v1::Assignment base;
  base.set_round(round_);
  base.set_num_nodes(static_cast<int>(ordered.size()));
  base.set_world_size(world_size_);
  base.set_master_addr(ordered[0]->second.join.address());
  base.set_master_port(ordered[0]->second.join.master_port());
  base.set_restart_count(restart_count_);
  base.set_max_restarts(config_.max_restarts());
  ScaleRoundHeartbeats(static_cast<int64_t>(ordered.size()));
  base.set_heartbeat_interval_ms(heartbeat_interval_ms_);
  base.set_heartbeat_timeout_ms(heartbeat_timeout_ms_);
  base.set_figures_interval_ms(figures_interval_ms_);
  if (static_cast<int>(last_peers_.size()) <=
      options_.max_peers_in_assignment) {
    for (const auto& peer : last_peers_) *base.add_peers() = peer;
  }
  for (Entry* e : ordered) {
    Node& node = e->second;
    v1::JoinResponse response;
    v1::Assignment* a = response.mutable_assignment();
    *a = base;
    a->set_node_rank(node.previous_rank);
    a->set_rank_offset(node.rank_offset);
    node.last_seen = now;  // the heartbeat clock starts with the round
    node.heard_in_round = false;
    Answer(node, std::move(response), effects);
  }
  const std::optional<absl::Time> told_close = poll_pacing_.TakeToldClose();
  spdlog::info("job '{}': round {} closed with {} nodes, world size {}{}{}",
               run_id_, round_, ordered.size(), world_size_,
               parked_ > 0 ? absl::StrFormat(" (%d nodes wait)", parked_)
                           : std::string(),
               told_close.has_value()
                   ? absl::StrFormat(
                         "; the first polling node was told to expect "
                         "the close %d ms %s",
                         std::abs(absl::ToInt64Milliseconds(*told_close - now)),
                         *told_close >= now ? "later" : "earlier")
                   : std::string());
  events_.Add(now, "round", round_, -1,
              absl::StrFormat("round %d closed with %d nodes, world size %d",
                              round_, ordered.size(), world_size_));
}

void Job::EndRound(absl::Time now, Effects* effects) {
  resuming_.reset();
  ++round_;
  state_ = v1::JOB_STATE_JOINING;
  for (auto& [id, node] : nodes_) node.member = false;
  min_reached_at_.reset();
  poll_pacing_.RoundFormed();
  effects->released.push_back({run_id_, round_});
  MaybeClose(now, effects);
}

void Job::Finish(v1::JobState state, absl::Time now, Effects* effects) {
  state_ = state;
  ended_at_ = now;
  resuming_.reset();
  for (auto& [id, node] : nodes_) {
    if (node.waiting()) Answer(node, EndedResponse(), effects);
  }
  effects->released.push_back({run_id_, round_ + 1});
  spdlog::info("job '{}' ended: {}", run_id_, Ended().message());
  events_.Add(now, "ended", round_, -1, Ended().message());
}

void Job::DropNode(const std::string& node_id, absl::Time now) {
  if (auto it = nodes_.find(node_id); it != nodes_.end()) {
    ClearAnswerForPoll(it->second);
    nodes_.erase(it);
  }
  last_activity_ = now;
}

void Job::ClearAnswerForPoll(Node& node) {
  if (!node.answer_for_poll.has_value()) return;
  node.answer_for_poll.reset();
  --answers_for_poll_;
}

void Job::AddFailures(const v1::ReportFailureRequest& request, absl::Time now) {
  const size_t first_new = failures_.size();
  auto add = [&](v1::WorkerFailure failure) {
    if (static_cast<int>(failures_.size()) >= options_.max_failures_kept) {
      return;
    }
    common::NormalizeFailureCause(failure);
    if (failure.node_id().empty()) failure.set_node_id(request.node_id());
    if (failure.round() == 0) failure.set_round(request.round());
    if (static_cast<int64_t>(failure.message().size()) >
        options_.max_failure_message_bytes) {
      failure.mutable_message()->resize(options_.max_failure_message_bytes);
      failure.mutable_message()->append(" [cut]");
    }
    if (failure.time_unix_ms() == 0) {
      failure.set_time_unix_ms(absl::ToUnixMillis(now));
    }
    failures_.push_back(std::move(failure));
  };
  if (request.failures().empty()) {
    v1::WorkerFailure failure;
    failure.set_failure_cause(v1::FAILURE_CAUSE_REPORTED);
    failure.set_message(absl::StrFormat(
        "node '%s' reported a failure in round %d without details",
        request.node_id(), request.round()));
    add(std::move(failure));
  }
  for (const auto& f : request.failures()) add(f);
  // Each failure in the event log too, with its cause.
  for (size_t i = first_new; i < failures_.size(); ++i) {
    const v1::WorkerFailure& f = failures_[i];
    events_.Add(now, "failure", f.round(), f.rank(),
                absl::StrFormat("rank %d (node '%s', local rank %d) %s: %s",
                                f.rank(), f.node_id(), f.local_rank(),
                                common::FailureCauseWord(f.failure_cause()),
                                f.message()));
  }
}

v1::ReportFailureResponse Job::ReportFailure(
    const v1::ReportFailureRequest& request, absl::Time now, Effects* effects) {
  last_activity_ = now;
  if (auto it = nodes_.find(request.node_id()); it != nodes_.end()) {
    it->second.last_seen = now;
    it->second.heard_in_round = true;
  }
  if (!ended() && state_ == v1::JOB_STATE_RUNNING &&
      request.round() == round_) {
    AddFailures(request, now);
    failed_round_ = round_;
    ++restart_count_;
    if (restart_count_ <= config_.max_restarts()) {
      events_.Add(now, "restart", round_, -1,
                  absl::StrFormat("round %d ends: restart %d of %d", round_,
                                  restart_count_, config_.max_restarts()));
    }
    spdlog::info(
        "job '{}': node '{}' reported a failure in round {} "
        "(restart {} of {})",
        run_id_, request.node_id(), round_, restart_count_,
        config_.max_restarts());
    if (restart_count_ > config_.max_restarts()) {
      Finish(v1::JOB_STATE_FAILED, now, effects);
    } else {
      EndRound(now, effects);
    }
  } else if (request.round() == failed_round_) {
    // Another agent saw the same incident: keep its records, count nothing.
    AddFailures(request, now);
  }
  v1::ReportFailureResponse response;
  response.set_restart_count(restart_count_);
  response.set_restarts_exhausted(state_ == v1::JOB_STATE_FAILED);
  return response;
}

v1::HeartbeatResponse Job::Heartbeat(const v1::HeartbeatRequest& request,
                                     absl::Time now) {
  last_activity_ = now;
  if (auto it = nodes_.find(request.node_id()); it != nodes_.end()) {
    it->second.last_seen = now;
    it->second.heard_in_round = true;
    if (it->second.member && request.round() == round_ &&
        state_ == v1::JOB_STATE_RUNNING) {
      if (!request.ranks().empty()) TakeFigures(it->second, request, now);
      round_steps_.Take(request.steps(), request.steps_age_ms(), now);
      round_sync_.Take(request.sync(), request.sync_age_ms(), now);
      // Every heartbeat, not only those with figures: a large job's nodes
      // send figures every few seconds (figures_interval_ms), and the
      // straggler windows must still pass once a second.
      EvaluateStragglers(now);
    }
  }
  v1::HeartbeatResponse response =
      HeartbeatAnswer(request.node_id(), request.round());
  if (response.round_steps() > 0) {
    response.set_round_steps_age_ms(round_steps_.AgeMs(now));
  }
  if (response.round_sync() > 0) {
    response.set_round_sync_age_ms(round_sync_.AgeMs(now));
  }
  return response;
}

v1::HeartbeatResponse Job::HeartbeatAnswer(const std::string& node_id,
                                           int64_t round) const {
  auto it = nodes_.find(node_id);
  const bool member = it != nodes_.end() && it->second.member;
  v1::HeartbeatResponse response;
  response.set_round(round_);
  response.set_state(state_);
  response.set_nodes_waiting(parked_);
  if (ended()) {
    *response.mutable_ended() = Ended();
  } else if (resuming_.has_value() && !member && round == round_) {
    // The server restarted and this member has not re-registered yet.
    response.set_resume(true);
  } else {
    response.set_rejoin(round != round_ || state_ != v1::JOB_STATE_RUNNING ||
                        !member);
    if (!response.rejoin()) {
      response.set_round_steps(round_steps_.value());
      response.set_round_sync(round_sync_.value());
      for (const StragglerDetector::Straggler& s : stragglers_.stragglers()) {
        if (s.sample.node_id == node_id) {
          response.add_straggler_local_ranks(s.sample.local_rank);
        }
      }
    }
  }
  return response;
}

void Job::TakeFigures(Node& node, const v1::HeartbeatRequest& request,
                      absl::Time now) {
  // At most the node's local world size, so that a confused agent cannot
  // make the server hold more than its ranks.
  const int n = std::min(request.ranks_size(), node.join.local_world_size());
  node.ranks.Clear();
  for (int i = 0; i < n; ++i) {
    const v1::RankFigures& figures = request.ranks(i);
    if (figures.local_rank() < 0 ||
        figures.local_rank() >= node.join.local_world_size()) {
      continue;
    }
    *node.ranks.Add() = figures;
    RankSample sample;
    sample.node_id = request.node_id();
    sample.local_rank = figures.local_rank();
    sample.samples = figures.samples();
    sample.compute_s = figures.compute_mean_s();
    stragglers_.Report(node.rank_offset + figures.local_rank(), sample, now);
  }
}

void Job::EvaluateStragglers(absl::Time now) {
  for (const StragglerDetector::Change& change : stragglers_.Evaluate(now)) {
    const StragglerDetector::Straggler& s = change.straggler;
    std::string message =
        change.named
            ? absl::StrFormat(
                  "rank %d (node '%s', local rank %d) is a straggler: %.1f ms "
                  "of compute per step, %.2fx the other ranks' median %.1f ms",
                  s.rank, s.sample.node_id, s.sample.local_rank,
                  s.sample.compute_s * 1e3, s.ratio, s.job_median_s * 1e3)
            : absl::StrFormat(
                  "rank %d (node '%s', local rank %d) keeps pace "
                  "again",
                  s.rank, s.sample.node_id, s.sample.local_rank);
    if (change.named) {
      spdlog::warn("job '{}': {}", run_id_, message);
    } else {
      spdlog::info("job '{}': {}", run_id_, message);
    }
    events_.Add(now, change.named ? "straggler" : "straggler-cleared", round_,
                s.rank, std::move(message));
  }
}

void Job::HeartbeatStreamEnded(const std::string& node_id, int64_t round,
                               absl::Time now) {
  auto it = nodes_.find(node_id);
  if (it == nodes_.end() || state_ != v1::JOB_STATE_RUNNING ||
      round != round_ || !it->second.member || it->second.done) {
    return;
  }
  it->second.stream_lost_at = now;
  next_scan_ = std::min(next_scan_, now + StreamLossGrace());
}

absl::Duration Job::FirstBeatGrace() const {
  return std::min(std::max(absl::Milliseconds(4 * heartbeat_interval_ms_),
                           absl::Seconds(2)),
                  absl::Milliseconds(heartbeat_timeout_ms_));
}

absl::Duration Job::StreamLossGrace() const {
  return std::min(std::max(absl::Milliseconds(2 * heartbeat_interval_ms_),
                           absl::Seconds(1)),
                  absl::Milliseconds(heartbeat_timeout_ms_));
}

void Job::Leave(const v1::LeaveRequest& request, absl::Time now,
                Effects* effects) {
  last_activity_ = now;
  auto it = nodes_.find(request.node_id());
  if (it == nodes_.end()) return;
  Node& node = it->second;
  if (node.waiting()) {
    Answer(node,
           absl::CancelledError(absl::StrFormat(
               "node '%s' left job '%s' while its Join was parked",
               request.node_id(), run_id_)),
           effects);
  }
  ClearAnswerForPoll(node);  // it left: it polls no more
  if (request.reason() == v1::LeaveRequest::REASON_SUCCEEDED) {
    node.done = true;
    node.last_seen = now;
    if (ended()) return;
    if (state_ == v1::JOB_STATE_RUNNING && node.member &&
        request.round() == round_) {
      bool all_done = true;
      for (const std::string& id : last_members_) {
        auto m = nodes_.find(id);
        // (An empty id: a member of a resumed round not yet back.)
        if (id.empty() || (m != nodes_.end() && !m->second.done)) {
          all_done = false;
        }
      }
      if (all_done) Finish(v1::JOB_STATE_SUCCEEDED, now, effects);
      return;
    }
    MaybeClose(now, effects);
    return;
  }
  bool was_member = state_ == v1::JOB_STATE_RUNNING && node.member;
  DropNode(request.node_id(), now);
  if (ended()) return;
  if (was_member) {
    const bool lost = request.reason() == v1::LeaveRequest::REASON_AGENT_LOST;
    spdlog::info(
        "job '{}': member '{}' {}; round {} ends", run_id_, request.node_id(),
        lost ? "lost its agent (its orphan guard says so)" : "left", round_);
    if (lost) {
      events_.Add(now, "node-lost", round_, -1,
                  absl::StrFormat("node '%s' lost its agent (its orphan "
                                  "guard says so); round %d ends",
                                  request.node_id(), round_));
    }
    EndRound(now, effects);
  } else {
    MaybeClose(now, effects);
  }
}

std::string Job::JoinTimeoutMessage() const {
  return absl::StrFormat(
      "no round of job '%s' took this node within join_timeout_ms=%d: %d "
      "nodes were waiting, min_nodes is %d, max_nodes %d; start the missing "
      "nodes or raise join_timeout",
      run_id_, config_.join_timeout_ms(), parked_, config_.min_nodes(),
      config_.max_nodes());
}

void Job::AnswersDelivered(int64_t round, absl::Time now) {
  if (round != round_ || state_ != v1::JOB_STATE_RUNNING) return;
  heartbeat_clock_start_ = std::max(heartbeat_clock_start_, now);
  next_scan_ = absl::InfinitePast();
}

void Job::HeldAnswersDelivered(absl::Span<const std::string> node_ids,
                               absl::Time now) {
  for (const std::string& id : node_ids) {
    auto it = nodes_.find(id);
    if (it == nodes_.end() || !it->second.answer_held) continue;
    it->second.answer_held = false;
    it->second.last_seen = std::max(it->second.last_seen, now);
    next_scan_ =
        std::min(next_scan_, now + absl::Milliseconds(heartbeat_timeout_ms_));
  }
}

void Job::Tick(absl::Time now, Effects* effects) {
  if (ended()) return;
  const absl::Duration since_last_tick = now - last_tick_;
  last_tick_ = now;
  if (since_last_tick > options_.forgive_stalls_over &&
      since_last_tick != absl::InfiniteDuration()) {
    ForgiveStall(since_last_tick, now);
  }
  if (resuming_.has_value() && now >= resuming_->deadline()) {
    AbandonResuming(now, effects);
  }
  if (now < next_scan_) {
    MaybeClose(now, effects);  // rule (c)'s last call
    return;
  }
  const Overdue overdue = FindOverdue(now);
  if (!overdue.timed_out.empty()) {
    absl::Status status = absl::DeadlineExceededError(JoinTimeoutMessage());
    for (const std::string& id : overdue.timed_out) {
      Node& node = nodes_.at(id);
      const bool polling = node.polling;
      Answer(node, status, effects);
      // A polling node is dropped when it collects the answer (or stops
      // polling).
      if (!polling) DropNode(id, now);
    }
  }
  for (const std::string& id : overdue.stopped_polling) {
    spdlog::warn("job '{}': node '{}' stopped polling for its round; dropped",
                 run_id_, id);
    Node& node = nodes_.at(id);
    node.polling = false;
    --polling_;
    --parked_;
    DropNode(id, now);
  }
  bool lost_member = false;
  for (const std::string& id : overdue.silent) {
    lost_member |= DropSilent(id, now);
  }
  if (lost_member) {
    EndRound(now, effects);
  } else {
    MaybeClose(now, effects);
  }
}

void Job::ForgiveStall(absl::Duration stall, absl::Time now) {
  // The server did not run for `stall`: heartbeats sent meanwhile are still
  // queued behind this Tick. Nobody's silence grows by the stall.
  spdlog::warn(
      "job '{}': the server did not tick for {}; that time is not counted "
      "as silence of the job's nodes",
      run_id_, absl::FormatDuration(stall));
  for (auto& [id, node] : nodes_) {
    node.last_seen = std::min(now, node.last_seen + stall);
    node.poll_deadline += stall;
  }
  heartbeat_clock_start_ = std::min(now, heartbeat_clock_start_ + stall);
  next_scan_ = absl::InfinitePast();
}

absl::Time Job::SilenceDeadline(const Node& node) const {
  const absl::Time heard = std::max(node.last_seen, heartbeat_clock_start_);
  absl::Time deadline = heard + absl::Milliseconds(heartbeat_timeout_ms_);
  if (node.member && node.stream_lost_at >= node.last_seen) {
    deadline = std::min(deadline, node.stream_lost_at + StreamLossGrace());
  }
  if (node.member && !node.heard_in_round) {
    deadline = std::min(deadline, heard + FirstBeatGrace());
  }
  return deadline;
}

Job::Overdue Job::FindOverdue(absl::Time now) {
  Overdue overdue;
  // A full scan at least once a second whatever the deadlines say.
  next_scan_ = now + absl::Seconds(1);
  for (const auto& [id, node] : nodes_) {
    if (node.waiter.has_value()) {
      // A parked Join proves liveness: a dead client cancels its call.
      if (now >= node.join_deadline) {
        overdue.timed_out.push_back(id);
      } else {
        next_scan_ = std::min(next_scan_, node.join_deadline);
      }
    } else if (node.polling) {
      if (now >= node.join_deadline) {
        overdue.timed_out.push_back(id);
      } else if (now >= node.poll_deadline) {
        overdue.stopped_polling.push_back(id);
      } else {
        next_scan_ = std::min(next_scan_,
                              std::min(node.join_deadline, node.poll_deadline));
      }
    } else if (node.answer_for_poll.has_value()) {
      // Its answer waits for its next poll, which is its liveness.
      if (now >= node.poll_deadline) {
        overdue.silent.push_back(id);
      } else {
        next_scan_ = std::min(next_scan_, node.poll_deadline);
      }
    } else if (!node.done && !node.answer_held) {
      const absl::Time deadline = SilenceDeadline(node);
      if (now >= deadline) {
        overdue.silent.push_back(id);
      } else {
        next_scan_ = std::min(next_scan_, deadline);
      }
    }
  }
  return overdue;
}

bool Job::DropSilent(const std::string& id, absl::Time now) {
  const Node& node = nodes_.at(id);
  const bool member = state_ == v1::JOB_STATE_RUNNING && node.member;
  spdlog::info("job '{}': node '{}' silent for {} ms{}; dropped{}", run_id_, id,
               absl::ToInt64Milliseconds(now - node.last_seen),
               node.stream_lost_at >= node.last_seen
                   ? " since its heartbeat stream ended"
               : !node.heard_in_round ? " since its round began"
                                      : "",
               member ? absl::StrFormat(", round %d ends", round_) : "");
  if (member) {
    events_.Add(now, "node-lost", round_, -1,
                absl::StrFormat("node '%s' silent for %d ms; round %d ends", id,
                                absl::ToInt64Milliseconds(now - node.last_seen),
                                round_));
  }
  DropNode(id, now);
  return member;
}

absl::Time Job::NextTick() const {
  if (ended()) return absl::InfiniteFuture();
  absl::Time next = next_scan_;
  if (resuming_.has_value()) next = std::min(next, resuming_->deadline());
  if (state_ == v1::JOB_STATE_JOINING && min_reached_at_.has_value()) {
    next =
        std::min(next, *min_reached_at_ +
                           absl::Milliseconds(config_.last_call_timeout_ms()));
  }
  return next;
}

void Job::CancelAllJoins(const absl::Status& status, Effects* effects) {
  for (auto& [id, node] : nodes_) {
    if (node.waiter.has_value()) Answer(node, status, effects);
  }
}

v1::JobStatus Job::Status(absl::Time now, bool events) const {
  v1::JobStatus status;
  status.set_run_id(run_id_);
  status.set_round(round_);
  status.set_state(state_);
  *status.mutable_config() = config_;
  status.set_restart_count(restart_count_);
  status.set_world_size(world_size_);
  status.set_resuming(resuming_.has_value());
  status.set_figures_interval_ms(figures_interval_ms_);
  for (const auto& f : failures_) *status.add_failures() = f;
  std::vector<const std::pair<const std::string, Node>*> sorted;
  for (const auto& entry : nodes_) sorted.push_back(&entry);
  std::sort(sorted.begin(), sorted.end(), [](auto* a, auto* b) {
    return std::make_tuple(a->second.previous_rank < 0, a->second.previous_rank,
                           a->first) <
           std::make_tuple(b->second.previous_rank < 0, b->second.previous_rank,
                           b->first);
  });
  for (const auto* entry : sorted) {
    const Node& node = entry->second;
    v1::NodeStatus* n = status.add_nodes();
    n->set_node_id(entry->first);
    n->set_address(node.join.address());
    n->set_node_rank(node.member ? node.previous_rank : -1);
    n->set_local_world_size(node.join.local_world_size());
    n->set_rank_offset(node.member ? node.rank_offset : -1);
    n->set_last_heartbeat_age_ms(
        absl::ToInt64Milliseconds(now - node.last_seen));
    v1::NodeState state = v1::NODE_STATE_REJOINING;  // its Join is due
    if (node.done) {
      state = v1::NODE_STATE_DONE;
    } else if (node.waiting()) {
      state = state_ == v1::JOB_STATE_RUNNING ? v1::NODE_STATE_WAITING
                                              : v1::NODE_STATE_JOINING;
    } else if (node.member) {
      state = v1::NODE_STATE_RUNNING;
    }
    n->set_node_state(state);
    n->set_state(common::NodeStateWord(state));
    if (node.member && state_ == v1::JOB_STATE_RUNNING) {
      *n->mutable_ranks() = node.ranks;
    }
  }
  if (state_ == v1::JOB_STATE_RUNNING) {
    status.set_compute_median_s(stragglers_.job_median_s());
    for (const StragglerDetector::Straggler& s : stragglers_.stragglers()) {
      v1::Straggler* out = status.add_stragglers();
      out->set_rank(s.rank);
      out->set_node_id(s.sample.node_id);
      out->set_local_rank(s.sample.local_rank);
      out->set_compute_s(s.sample.compute_s);
      out->set_job_median_s(s.job_median_s);
      out->set_ratio(s.ratio);
      out->set_since_unix_ms(absl::ToUnixMillis(s.since));
    }
  }
  if (events) {
    for (const v1::JobEvent& e : events_.events()) *status.add_events() = e;
  }
  return status;
}

// ---- Learning the job again after a server restart ----

void Job::LearnFromRecord(const v1::RoundRecord& record, bool round_over,
                          absl::Time now, Effects* effects) {
  const int restarts = JobResumption::RestartsIn(record);
  if (restarts > restart_count_) {
    spdlog::info("job '{}': restart count {} learned from a node's record",
                 run_id_, restarts);
    restart_count_ = restarts;
    if (restart_count_ > config_.max_restarts()) {
      Finish(v1::JOB_STATE_FAILED, now, effects);
      return;
    }
  }
  const int64_t next = record.assignment().round() + 1;
  if (round_over && !round_decided_here_ && !resuming_.has_value() &&
      state_ == v1::JOB_STATE_JOINING && next > round_) {
    spdlog::info(
        "job '{}': round {} learned from a node's record; round {} "
        "forms",
        run_id_, next - 1, next);
    round_ = next;
    effects->released.push_back({run_id_, round_});
  }
}

v1::ResumeResponse Job::ResumeRefused(std::string why) {
  v1::ResumeResponse response;
  response.set_rejoin(std::move(why));
  return response;
}

v1::ResumeResponse Job::Resume(const v1::JoinRequest& request, absl::Time now,
                               Effects* effects) {
  last_activity_ = now;
  v1::ResumeResponse response;
  if (ended()) {
    *response.mutable_ended() = Ended();
    return response;
  }
  if (request.node_id().empty() || !request.has_record()) {
    return ResumeRefused(absl::StrFormat(
        "Resume to job '%s' needs a node_id and the node's record", run_id_));
  }
  const v1::RoundRecord& record = request.record();
  const int64_t round = record.assignment().round();
  LearnFromRecord(record, /*round_over=*/false, now, effects);
  if (ended()) {
    *response.mutable_ended() = Ended();
    return response;
  }
  if (JobResumption::Starts(
          round, round_, state_ == v1::JOB_STATE_JOINING, round_decided_here_,
          resuming_.has_value() ? std::optional<int64_t>(round_)
                                : std::nullopt)) {
    StartResuming(record, now, effects);
  }
  if (resuming_.has_value() && round == round_) {
    return AddResumed(request, now, effects);
  }
  // Already resumed (the agent retried after a lost answer).
  auto it = nodes_.find(request.node_id());
  if (state_ == v1::JOB_STATE_RUNNING && round == round_ &&
      it != nodes_.end() && it->second.member &&
      it->second.previous_rank == record.assignment().node_rank()) {
    it->second.last_seen = now;
    *response.mutable_assignment() = record.assignment();
    response.mutable_assignment()->set_restart_count(restart_count_);
    return response;
  }
  return ResumeRefused(absl::StrFormat(
      "job '%s' is in round %d (%s); node '%s' ran round %d, which cannot go "
      "on",
      run_id_, round_, v1::JobState_Name(state_), request.node_id(), round));
}

void Job::StartResuming(const v1::RoundRecord& record, absl::Time now,
                        Effects* effects) {
  const v1::Assignment& a = record.assignment();
  for (auto& [id, node] : nodes_) {
    if (node.member) {
      node.member = false;
      node.previous_rank = -1;
      node.rank_offset = -1;
    }
  }
  round_ = a.round();
  round_steps_.Reset();
  round_sync_.Reset();
  state_ = v1::JOB_STATE_RUNNING;
  min_reached_at_.reset();
  heartbeat_interval_ms_ = a.heartbeat_interval_ms() > 0
                               ? a.heartbeat_interval_ms()
                               : config_.heartbeat_interval_ms();
  heartbeat_timeout_ms_ = a.heartbeat_timeout_ms() > 0
                              ? a.heartbeat_timeout_ms()
                              : config_.heartbeat_timeout_ms();
  SetFiguresInterval(
      a.figures_interval_ms() > 0
          ? a.figures_interval_ms()
          : absl::ToInt64Milliseconds(options_.figures_interval));
  resuming_.emplace(a, heartbeat_timeout_ms_, now);
  const int num_nodes = resuming_->num_nodes();
  last_members_.assign(num_nodes, std::string());
  last_peers_.assign(num_nodes, v1::Peer());
  world_size_ = a.world_size();
  effects->released.push_back({run_id_, round_});
  spdlog::info(
      "job '{}' learned again after a server restart: round {} of {} nodes "
      "(world size {}), restart count {}; waiting up to {} ms for its "
      "members to re-register",
      run_id_, round_, num_nodes, world_size_, restart_count_,
      heartbeat_timeout_ms_);
}

v1::ResumeResponse Job::AddResumed(const v1::JoinRequest& request,
                                   absl::Time now, Effects* effects) {
  const v1::Assignment& a = request.record().assignment();
  const std::string& id = request.node_id();
  const int rank = a.node_rank();
  if (std::optional<std::string> why =
          resuming_->Refusal(request, last_members_, run_id_, round_)) {
    return ResumeRefused(*std::move(why));
  }
  if (!nodes_.contains(id) &&
      static_cast<int64_t>(nodes_.size()) >= options_.max_nodes) {
    return ResumeRefused(absl::StrFormat(
        "job '%s' already has %d nodes, the server's limit max_nodes_per_job",
        run_id_, nodes_.size()));
  }
  Node& node = NodeFor(id, request, "a Resume", effects);
  node.join.clear_record();
  node.join.set_master_port(a.master_port());
  node.last_seen = now;
  node.member = true;
  node.done = false;
  node.previous_rank = rank;
  node.rank_offset = a.rank_offset();
  last_members_[rank] = id;
  last_peers_[rank] = JobResumption::PeerOf(request);

  v1::ResumeResponse response;
  *response.mutable_assignment() = a;
  response.mutable_assignment()->set_restart_count(restart_count_);
  spdlog::info("job '{}': node '{}' resumed round {} as node rank {}", run_id_,
               id, round_, rank);
  if (JobResumption::Whole(last_members_)) FinishResuming(now, effects);
  return response;
}

void Job::FinishResuming(absl::Time now, Effects* effects) {
  // The members' offsets must tile the world, as Close would have made them.
  std::optional<std::string> disagreement =
      resuming_->Disagreement(last_peers_, run_id_, round_);
  resuming_.reset();
  round_decided_here_ = true;
  if (disagreement.has_value()) {
    spdlog::warn("{}", *disagreement);
    EndRound(now, effects);
    return;
  }
  spdlog::info(
      "job '{}': round {} resumed with all {} members; restart count {}",
      run_id_, round_, last_members_.size(), restart_count_);
  if (parked_ > 0 &&
      static_cast<int>(last_members_.size()) < config_.max_nodes()) {
    spdlog::info(
        "job '{}': {} nodes wait to join; round {} ends to admit "
        "them",
        run_id_, parked_, round_);
    EndRound(now, effects);
  }
}

void Job::AbandonResuming(absl::Time now, Effects* effects) {
  const std::string missing = JobResumption::MissingRanks(last_members_);
  spdlog::info(
      "job '{}': node ranks {} of round {} did not re-register within {} "
      "ms; round {} ends",
      run_id_, missing, round_, heartbeat_timeout_ms_, round_);
  round_decided_here_ = true;
  EndRound(now, effects);
}

}  // namespace ddprun::rendezvous
