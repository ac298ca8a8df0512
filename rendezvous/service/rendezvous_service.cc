#include "rendezvous/service/rendezvous_service.h"

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/grpc_status.h"

namespace ddprun::rendezvous {
namespace {

grpc::ServerUnaryReactor* FinishNow(grpc::CallbackServerContext* context,
                                    const absl::Status& status) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(common::ToGrpcStatus(status));
  return reactor;
}

template <typename Response>
grpc::ServerUnaryReactor* FinishWith(grpc::CallbackServerContext* context,
                                     absl::StatusOr<Response> result,
                                     Response* response) {
  if (!result.ok()) return FinishNow(context, result.status());
  *response = *std::move(result);
  return FinishNow(context, absl::OkStatus());
}

}  // namespace

RendezvousService::RendezvousService(JobTable* jobs, StoreService* store,
                                     const TokenCheck* token, int join_queues)
    : jobs_(jobs),
      store_(store),
      token_(token),
      streams_(jobs, token),
      joins_(this, this, join_queues) {}

namespace {

// Held by every call a round's close answered; when the last of them is
// done (its answer sent), the round's heartbeat clocks start. Handing out
// 100,000 answers takes seconds on a loaded host, and no member can beat
// before it has its answer.
class RoundsDelivered {
 public:
  RoundsDelivered(JobTable* jobs, std::vector<ClosedRound> closed)
      : jobs_(jobs), closed_(std::move(closed)) {}
  ~RoundsDelivered() {
    for (const ClosedRound& round : closed_) jobs_->AnswersDelivered(round);
  }

 private:
  JobTable* const jobs_;
  const std::vector<ClosedRound> closed_;
};

// A node's answer as its slot in a batched Join's answer carries it: the
// response, or the error its own Join would have ended with.
v1::JoinResponse SlotAnswer(absl::StatusOr<v1::JoinResponse> response) {
  if (response.ok()) return *std::move(response);
  v1::JoinResponse answer;
  v1::JoinError* error = answer.mutable_error();
  error->set_code(static_cast<int32_t>(response.status().code()));
  error->set_message(std::string(response.status().message()));
  return answer;
}

}  // namespace

// The answers of one batched Join's nodes, filled as each is decided (from
// any thread). Alive while the call is parked or one of its slots is, and
// then while its answer is sent: it holds the rounds its answers closed
// (RoundsDelivered), and when it goes (its answer sent, or its sender gone)
// it tells the job table that the assignments it held were delivered, so
// that neither a round's clock nor a held node's silence runs before.
class JoinBatch {
 public:
  JoinBatch(JobTable* jobs, const v1::JoinRequest& request, WaiterId call,
            std::vector<WaiterId> waiters)
      : jobs_(jobs),
        run_id_(request.run_id()),
        call_(call),
        waiters_(std::move(waiters)),
        answers_(waiters_.size()),
        pending_(static_cast<int>(waiters_.size())) {
    node_ids_.reserve(waiters_.size());
    node_ids_.push_back(request.node_id());
    for (const v1::JoinRequest& more : request.more()) {
      node_ids_.push_back(more.node_id());
    }
  }
  ~JoinBatch() {
    std::vector<std::string> held;
    {
      absl::MutexLock lock(&mu_);
      for (int slot : assigned_) held.push_back(node_ids_[slot]);
    }
    if (!held.empty()) jobs_->HeldAnswersDelivered(run_id_, held);
  }
  JoinBatch(const JoinBatch&) = delete;
  JoinBatch& operator=(const JoinBatch&) = delete;

  WaiterId call() const { return call_; }
  const std::vector<WaiterId>& waiters() const { return waiters_; }

  // True when this was the last slot: the caller answers the call with
  // TakeResponse. Each slot is filled once (its waiter was taken).
  bool Fill(int slot, v1::JoinResponse answer,
            const std::shared_ptr<void>& delivered) {
    absl::MutexLock lock(&mu_);
    if (answer.has_assignment()) assigned_.push_back(slot);
    answers_[slot] = std::move(answer);
    if (delivered != nullptr &&
        (delivered_.empty() || delivered_.back() != delivered)) {
      delivered_.push_back(delivered);
    }
    return --pending_ == 0;
  }

  // The call's answer: slot 0 answers the request's own node, the others
  // its `more`, in order.
  v1::JoinResponse TakeResponse() {
    absl::MutexLock lock(&mu_);
    v1::JoinResponse response = std::move(answers_[0]);
    response.mutable_more()->Reserve(static_cast<int>(answers_.size()) - 1);
    for (size_t i = 1; i < answers_.size(); ++i) {
      *response.add_more() = std::move(answers_[i]);
    }
    answers_.clear();
    return response;
  }

 private:
  JobTable* const jobs_;
  const std::string run_id_;
  const WaiterId call_;
  const std::vector<WaiterId> waiters_;
  std::vector<std::string> node_ids_;  // by slot
  absl::Mutex mu_;
  std::vector<int> assigned_ ABSL_GUARDED_BY(mu_);  // slots with assignments
  std::vector<v1::JoinResponse> answers_ ABSL_GUARDED_BY(mu_);
  std::vector<std::shared_ptr<void>> delivered_ ABSL_GUARDED_BY(mu_);
  int pending_ ABSL_GUARDED_BY(mu_);
};

void RendezvousService::Apply(Effects effects) {
  std::shared_ptr<void> delivered;
  if (!effects.closed.empty()) {
    delivered =
        std::make_shared<RoundsDelivered>(jobs_, std::move(effects.closed));
  }
  for (JoinCompletion& c : effects.joins) {
    std::optional<ParkedJoin> parked = parked_.Take(c.waiter);
    if (!parked.has_value()) {
      // A node of a batched Join, or cancelled meanwhile.
      std::optional<BatchSlot> slot = slots_.Take(c.waiter);
      if (slot.has_value()) FillSlot(*slot, std::move(c.response), delivered);
      continue;
    }
    if (!c.response.ok()) {
      parked->call->Finish(common::ToGrpcStatus(c.response.status()), {},
                           delivered);
      continue;
    }
    parked->call->Finish(grpc::Status::OK, *std::move(c.response), delivered);
  }
  for (const ReleasedRounds& r : effects.released) {
    store_->ReleaseRoundsBefore(r.run_id, r.before_round);
    streams_.PushRoundOver(r.run_id, r.before_round);
  }
}

absl::Time RendezvousService::Tick() {
  Effects effects;
  const absl::Time next = jobs_->Tick(&effects);
  Apply(std::move(effects));
  return next;
}

void RendezvousService::CancelAll(const grpc::Status& status) {
  Effects effects;
  jobs_->CancelAllJoins(common::FromGrpcStatus(status), &effects);
  Apply(std::move(effects));
  // (Every batch was answered above; what is left never reached a job.)
  for (const BatchSlot& slot : slots_.TakeAll()) {
    FillSlot(slot, common::FromGrpcStatus(status), nullptr);
  }
  for (const ParkedJoin& parked : parked_.TakeAll()) {
    parked.call->Finish(status, {}, nullptr);
  }
}

void RendezvousService::FillSlot(const BatchSlot& slot,
                                 absl::StatusOr<v1::JoinResponse> response,
                                 const std::shared_ptr<void>& delivered) {
  if (!slot.batch->Fill(slot.slot, SlotAnswer(std::move(response)),
                        delivered)) {
    return;
  }
  std::optional<ParkedJoin> parked = parked_.Take(slot.batch->call());
  if (!parked.has_value()) return;  // cancelled meanwhile
  // The batch holds the rounds its slots closed until its answer was sent.
  parked->call->Finish(grpc::Status::OK, slot.batch->TakeResponse(),
                       slot.batch);
}

void RendezvousService::OnJoin(JoinCall* call) {
  const v1::JoinRequest& request = call->request();
  if (absl::Status ok = token_->Check(call->context(), request.run_id());
      !ok.ok()) {
    call->Finish(common::ToGrpcStatus(ok), {}, nullptr);
    return;
  }
  if (request.more_size() > 0) return OnJoinBatch(call);
  WaiterId id = parked_.NewId();
  call->set_id(id);
  parked_.Add(id, ParkedJoin{call, nullptr});
  Effects effects;
  jobs_->Join(request, id, &effects);
  Apply(std::move(effects));
}

void RendezvousService::OnJoinBatch(JoinCall* call) {
  const v1::JoinRequest& request = call->request();
  // Refused whole before any node joins (the token admitted request.run_id
  // only: every node must name it).
  if (absl::Status ok = CheckJoinBatch(request); !ok.ok()) {
    call->Finish(common::ToGrpcStatus(ok), {}, nullptr);
    return;
  }
  std::vector<WaiterId> waiters(request.more_size() + 1);
  for (WaiterId& waiter : waiters) waiter = parked_.NewId();
  WaiterId id = parked_.NewId();
  call->set_id(id);
  auto batch = std::make_shared<JoinBatch>(jobs_, request, id, waiters);
  // Every slot is in place before the job table sees a node: a completion
  // from another thread finds it.
  for (size_t i = 0; i < waiters.size(); ++i) {
    slots_.Add(waiters[i], BatchSlot{batch, static_cast<int>(i)});
  }
  parked_.Add(id, ParkedJoin{call, batch});
  Effects effects;
  jobs_->JoinBatch(request, waiters, &effects);
  Apply(std::move(effects));
}

void RendezvousService::OnJoinCancelled(JoinCall* call) {
  std::optional<ParkedJoin> parked = parked_.Take(call->id());
  if (!parked.has_value()) return;  // already answered (or never parked)
  const v1::JoinRequest& request = call->request();
  Effects effects;
  if (parked->batch == nullptr) {
    jobs_->CancelJoin(request.run_id(), request.node_id(), call->id(),
                      &effects);
  } else {
    // Every node of the batch whose answer was not decided yet is dropped,
    // as a cancelled Join drops its node.
    const std::vector<WaiterId>& waiters = parked->batch->waiters();
    for (size_t i = 0; i < waiters.size(); ++i) {
      if (!slots_.Take(waiters[i]).has_value()) continue;  // decided
      const std::string& node_id =
          i == 0 ? request.node_id()
                 : request.more(static_cast<int>(i) - 1).node_id();
      jobs_->CancelJoin(request.run_id(), node_id, waiters[i], &effects);
    }
  }
  call->Finish(grpc::Status(grpc::StatusCode::CANCELLED,
                            parked->batch == nullptr
                                ? "Join cancelled by the client (or its "
                                  "deadline passed); the node was dropped "
                                  "from the job"
                                : "batched Join cancelled by the client (or "
                                  "its deadline passed); its nodes were "
                                  "dropped from the job"),
               {}, nullptr);
  Apply(std::move(effects));
}

grpc::ServerUnaryReactor* RendezvousService::Heartbeat(
    grpc::CallbackServerContext* context, const v1::HeartbeatRequest* request,
    v1::HeartbeatResponse* response) {
  if (absl::Status ok = token_->Check(*context, request->run_id()); !ok.ok()) {
    return FinishNow(context, ok);
  }
  return FinishWith(context, AnswerHeartbeat(jobs_, *request), response);
}

grpc::ServerUnaryReactor* RendezvousService::ReportFailure(
    grpc::CallbackServerContext* context,
    const v1::ReportFailureRequest* request,
    v1::ReportFailureResponse* response) {
  if (absl::Status ok = token_->Check(*context, request->run_id()); !ok.ok()) {
    return FinishNow(context, ok);
  }
  Effects effects;
  auto result = jobs_->ReportFailure(*request, &effects);
  Apply(std::move(effects));
  return FinishWith(context, std::move(result), response);
}

grpc::ServerUnaryReactor* RendezvousService::Leave(
    grpc::CallbackServerContext* context, const v1::LeaveRequest* request,
    v1::LeaveResponse* /*response*/) {
  if (absl::Status ok = token_->Check(*context, request->run_id()); !ok.ok()) {
    return FinishNow(context, ok);
  }
  Effects effects;
  absl::Status status = jobs_->Leave(*request, &effects);
  Apply(std::move(effects));
  return FinishNow(context, status);
}

grpc::ServerUnaryReactor* RendezvousService::Resume(
    grpc::CallbackServerContext* context, const v1::JoinRequest* request,
    v1::ResumeResponse* response) {
  if (absl::Status ok = token_->Check(*context, request->run_id()); !ok.ok()) {
    return FinishNow(context, ok);
  }
  Effects effects;
  auto result = jobs_->Resume(*request, &effects);
  Apply(std::move(effects));
  return FinishWith(context, std::move(result), response);
}

grpc::ServerUnaryReactor* RendezvousService::Status(
    grpc::CallbackServerContext* context, const v1::StatusRequest* request,
    v1::StatusResponse* response) {
  absl::Status ok = token_->CheckStatus(*context, request->run_id());
  if (!ok.ok()) return FinishNow(context, ok);
  return FinishWith(context, jobs_->Status(*request), response);
}

}  // namespace ddprun::rendezvous
