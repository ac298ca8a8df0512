#include "relay/join_batcher.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "relay/join_fanout.h"
#include "spdlog/spdlog.h"

namespace ddprun::relay {

bool JoinWaiter::TryAnswer(const grpc::Status& status,
                           const v1::JoinResponse& response) {
  {
    absl::MutexLock lock(&mu_);
    if (done_) return false;
    done_ = true;
  }
  deliver_(status, response);
  return true;
}

bool JoinWaiter::MarkCancelled() {
  absl::MutexLock lock(&mu_);
  if (done_) return false;
  done_ = true;
  cancelled_ = true;
  return true;
}

bool JoinWaiter::cancelled() const {
  absl::MutexLock lock(&mu_);
  return cancelled_;
}

struct JoinBatcher::SentBatch {
  std::vector<std::shared_ptr<JoinWaiter>> waiters;
  std::shared_ptr<grpc::ClientContext> context =
      std::make_shared<grpc::ClientContext>();
  v1::JoinRequest request;
  v1::JoinResponse response;
};

struct JoinBatcher::SentLeave {
  std::shared_ptr<grpc::ClientContext> context =
      std::make_shared<grpc::ClientContext>();
  v1::LeaveRequest request;
  v1::LeaveResponse response;
};

JoinBatcher::JoinBatcher(const RelayOptions& options,
                         v1::Rendezvous::Stub* stub, RelayCounters* counters)
    : options_(options), stub_(stub), counters_(counters) {
  flusher_ = std::thread([this] { FlushLoop(); });
}

JoinBatcher::~JoinBatcher() { Shutdown(); }

void JoinBatcher::Add(std::shared_ptr<JoinWaiter> waiter) {
  // Cancelled between its call's read and here: its call is finished.
  if (waiter->cancelled()) return;
  std::string key = GroupKey(waiter->request().run_id(), waiter->metadata());
  std::vector<std::shared_ptr<JoinWaiter>> full;
  std::shared_ptr<JoinWaiter> superseded;
  bool refused = false;
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) {
      refused = true;
    } else {
      Group& group = groups_[key];
      // A node joins once per message (the server refuses a batch naming
      // a node twice); a newer Join of a node replaces its older one, as
      // the server answers the older ABORTED.
      auto same = std::find_if(
          group.waiters.begin(), group.waiters.end(), [&](const auto& w) {
            return w->request().node_id() == waiter->request().node_id();
          });
      if (same != group.waiters.end()) {
        superseded = std::move(*same);
        group.waiters.erase(same);
      }
      if (group.waiters.empty()) {
        group.first_added = absl::Now();
        changed_.Signal();
      }
      group.waiters.push_back(waiter);
      if (static_cast<int>(group.waiters.size()) >= options_.max_batch) {
        full = std::move(group.waiters);
        groups_.erase(key);
      }
    }
  }
  if (refused) {
    waiter->TryAnswer(grpc::Status(grpc::StatusCode::UNAVAILABLE,
                                   "ddprun-relay is shutting down; join again"),
                      {});
    return;
  }
  if (superseded != nullptr) {
    superseded->TryAnswer(
        grpc::Status(grpc::StatusCode::ABORTED,
                     absl::StrFormat("a newer Join of node '%s' superseded "
                                     "this one",
                                     waiter->request().node_id())),
        {});
  }
  if (!full.empty()) Send(std::move(full));
}

void JoinBatcher::Remove(const std::shared_ptr<JoinWaiter>& waiter) {
  std::string key = GroupKey(waiter->request().run_id(), waiter->metadata());
  absl::MutexLock lock(&mu_);
  auto group = groups_.find(key);
  if (group == groups_.end()) return;
  std::vector<std::shared_ptr<JoinWaiter>>& waiters = group->second.waiters;
  waiters.erase(std::remove(waiters.begin(), waiters.end(), waiter),
                waiters.end());
  if (waiters.empty()) groups_.erase(group);
}

size_t JoinBatcher::num_pending() const {
  absl::MutexLock lock(&mu_);
  size_t pending = 0;
  for (const auto& [key, group] : groups_) pending += group.waiters.size();
  return pending;
}

void JoinBatcher::FlushLoop() {
  while (true) {
    std::vector<std::vector<std::shared_ptr<JoinWaiter>>> due;
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) return;
      absl::Time now = absl::Now();
      absl::Time next = absl::InfiniteFuture();
      for (auto it = groups_.begin(); it != groups_.end();) {
        absl::Time at = it->second.first_added + options_.batch_window;
        if (at <= now) {
          due.push_back(std::move(it->second.waiters));
          it = groups_.erase(it);
        } else {
          next = std::min(next, at);
          ++it;
        }
      }
      if (due.empty()) changed_.WaitWithDeadline(&mu_, next);
    }
    for (auto& waiters : due) Send(std::move(waiters));
  }
}

bool JoinBatcher::BeginUpstreamCall(
    const std::shared_ptr<grpc::ClientContext>& context) {
  absl::MutexLock lock(&mu_);
  if (stopping_) return false;
  in_flight_.push_back(context);
  return true;
}

void JoinBatcher::EndUpstreamCall(
    const std::shared_ptr<grpc::ClientContext>& context) {
  absl::MutexLock lock(&mu_);
  in_flight_.erase(std::find(in_flight_.begin(), in_flight_.end(), context));
}

void JoinBatcher::Send(std::vector<std::shared_ptr<JoinWaiter>> waiters) {
  auto batch = std::make_unique<SentBatch>();
  batch->waiters = std::move(waiters);
  // The latest deadline of the batch, capped; a caller without one gets
  // the cap (its own call never times out; the server's join_timeout
  // answers it first).
  auto cap = absl::ToChronoTime(absl::Now() + options_.max_join_deadline);
  auto deadline = std::chrono::system_clock::time_point::min();
  for (const auto& waiter : batch->waiters) {
    deadline = std::max(deadline, std::min(waiter->deadline(), cap));
  }
  batch->context->set_deadline(deadline);
  const JoinWaiter& first = *batch->waiters.front();
  AttachMetadata(first.metadata(), batch->context.get());
  batch->request = first.request();
  for (size_t i = 1; i < batch->waiters.size(); ++i) {
    *batch->request.add_more() = batch->waiters[i]->request();
  }
  if (!BeginUpstreamCall(batch->context)) {
    for (const auto& waiter : batch->waiters) {
      waiter->TryAnswer(
          grpc::Status(grpc::StatusCode::UNAVAILABLE,
                       "ddprun-relay is shutting down; join again"),
          {});
    }
    return;
  }
  counters_->upstream_join_calls.Increment();
  SentBatch* sent = batch.release();
  stub_->async()->Join(
      sent->context.get(), &sent->request, &sent->response,
      [this, sent](grpc::Status status) { OnAnswer(sent, status); });
}

void JoinBatcher::OnAnswer(SentBatch* sent, const grpc::Status& status) {
  std::unique_ptr<SentBatch> batch(sent);
  std::vector<JoinOutcome> outcomes = SplitJoinAnswer(
      status, batch->response, static_cast<int>(batch->waiters.size()),
      options_.upstream);
  for (size_t i = 0; i < outcomes.size(); ++i) {
    JoinWaiter& waiter = *batch->waiters[i];
    const JoinOutcome& outcome = outcomes[i];
    if (waiter.TryAnswer(outcome.status, outcome.response)) continue;
    if (waiter.cancelled() && outcome.status.ok() &&
        outcome.response.has_assignment()) {
      SendLeave(waiter, outcome.response.assignment().round());
    }
  }
  // A server older than batches joined only the first node: the others
  // join one by one.
  for (size_t i = outcomes.size(); i < batch->waiters.size(); ++i) {
    Send({batch->waiters[i]});
  }
  EndUpstreamCall(batch->context);
}

void JoinBatcher::SendLeave(const JoinWaiter& waiter, int64_t round) {
  auto leave = std::make_unique<SentLeave>();
  leave->request.set_run_id(waiter.request().run_id());
  leave->request.set_node_id(waiter.request().node_id());
  leave->request.set_round(round);
  leave->request.set_reason(v1::LeaveRequest::REASON_SHUTDOWN);
  AttachMetadata(waiter.metadata(), leave->context.get());
  leave->context->set_deadline(
      absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
  if (!BeginUpstreamCall(leave->context)) return;
  spdlog::info(
      "ddprun-relay: node '{}' of job '{}' went away after its Join was "
      "sent and was assigned round {}: leaving for it",
      waiter.request().node_id(), waiter.request().run_id(), round);
  counters_->leaves_for_cancelled.Increment();
  SentLeave* sent = leave.release();
  stub_->async()->Leave(sent->context.get(), &sent->request, &sent->response,
                        [this, sent](grpc::Status status) {
                          std::unique_ptr<SentLeave> done(sent);
                          if (!status.ok()) {
                            spdlog::warn(
                                "ddprun-relay: Leave for node '{}' failed: "
                                "{}; the server drops it at its heartbeat "
                                "timeout",
                                done->request.node_id(),
                                status.error_message());
                          }
                          EndUpstreamCall(done->context);
                        });
}

void JoinBatcher::Shutdown() {
  std::vector<std::shared_ptr<JoinWaiter>> pending;
  std::vector<std::shared_ptr<grpc::ClientContext>> calls;
  {
    absl::MutexLock lock(&mu_);
    if (!stopping_) {
      stopping_ = true;
      changed_.SignalAll();
      for (auto& [key, group] : groups_) {
        for (auto& waiter : group.waiters) pending.push_back(waiter);
      }
      groups_.clear();
      calls = in_flight_;
    }
  }
  // Outside mu_: a cancelled call's callback may run inline and take it.
  for (const auto& context : calls) context->TryCancel();
  if (flusher_.joinable()) flusher_.join();
  for (auto& waiter : pending) {
    waiter->TryAnswer(grpc::Status(grpc::StatusCode::UNAVAILABLE,
                                   "ddprun-relay is shutting down; join again"),
                      {});
  }
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](std::vector<std::shared_ptr<grpc::ClientContext>>* calls) {
        return calls->empty();
      },
      &in_flight_));
}

}  // namespace ddprun::relay
