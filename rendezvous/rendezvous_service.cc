#include "rendezvous/rendezvous_service.h"

#include <memory>
#include <string>
#include <utility>
#include <vector>

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

}  // namespace

void RendezvousService::Apply(Effects effects) {
  std::shared_ptr<void> delivered;
  if (!effects.closed.empty()) {
    delivered =
        std::make_shared<RoundsDelivered>(jobs_, std::move(effects.closed));
  }
  for (JoinCompletion& c : effects.joins) {
    std::optional<JoinCall*> call = parked_.Take(c.waiter);
    if (!call.has_value()) continue;  // cancelled meanwhile
    if (!c.response.ok()) {
      (*call)->Finish(common::ToGrpcStatus(c.response.status()), {},
                      delivered);
      continue;
    }
    (*call)->Finish(grpc::Status::OK, *std::move(c.response), delivered);
  }
  for (const ReleasedRounds& r : effects.released) {
    store_->ReleaseRoundsBefore(r.run_id, r.before_round);
  }
}

void RendezvousService::Tick() {
  Effects effects;
  jobs_->Tick(&effects);
  Apply(std::move(effects));
}

void RendezvousService::CancelAll(const grpc::Status& status) {
  Effects effects;
  jobs_->CancelAllJoins(common::FromGrpcStatus(status), &effects);
  Apply(std::move(effects));
  for (JoinCall* call : parked_.TakeAll()) call->Finish(status, {}, nullptr);
}

void RendezvousService::OnJoin(JoinCall* call) {
  const v1::JoinRequest& request = call->request();
  if (absl::Status ok = token_->Check(call->context(), request.run_id());
      !ok.ok()) {
    call->Finish(common::ToGrpcStatus(ok), {}, nullptr);
    return;
  }
  WaiterId id = parked_.NewId();
  call->set_id(id);
  parked_.Add(id, call);
  Effects effects;
  jobs_->Join(request, id, &effects);
  Apply(std::move(effects));
}

void RendezvousService::OnJoinCancelled(JoinCall* call) {
  std::optional<JoinCall*> parked = parked_.Take(call->id());
  if (!parked.has_value()) return;  // already answered (or never parked)
  Effects effects;
  jobs_->CancelJoin(call->request().run_id(), call->request().node_id(),
                    call->id(), &effects);
  call->Finish(grpc::Status(grpc::StatusCode::CANCELLED,
                            "Join cancelled by the client (or its deadline "
                            "passed); the node was dropped from the job"),
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
  absl::Status ok =
      request->run_id().empty()
          ? token_->CheckAdmin(*context, "Status of every job")
          : token_->Check(*context, request->run_id());
  if (!ok.ok()) return FinishNow(context, ok);
  return FinishWith(context, jobs_->Status(*request), response);
}

}  // namespace ddprun::rendezvous
