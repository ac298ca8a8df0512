#include "rendezvous/service/store_service.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "absl/strings/str_format.h"
#include "common/grpc_status.h"

namespace ddprun::rendezvous {
namespace {

grpc::ServerUnaryReactor* FinishNow(grpc::CallbackServerContext* context,
                                    const absl::Status& status) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(common::ToGrpcStatus(status));
  return reactor;
}

std::vector<std::string> Keys(
    const google::protobuf::RepeatedPtrField<std::string>& keys) {
  return std::vector<std::string>(keys.begin(), keys.end());
}

}  // namespace

StoreService::StoreService(const JobTable* jobs, StoreState* store,
                           const TokenCheck* token, Limits limits,
                           const common::Clock* clock)
    : jobs_(jobs),
      store_(store),
      token_(token),
      limits_(limits),
      clock_(clock),
      rate_(StoreWriteRateOptions{
          .bytes_per_s = limits.max_job_store_write_bytes_per_s,
          .burst_bytes = limits.job_store_write_burst_bytes,
          .max_parked_bytes = limits.max_job_parked_write_bytes,
          .max_total_parked_bytes = StoreWriteRate::TotalParkedShare(
              limits.max_memory_bytes, limits.max_store_bytes),
          .max_held_refusals = limits.max_held_store_refusals}) {}

absl::Status StoreService::AdmitWriter(
    const grpc::CallbackServerContext& context,
    const v1::StoreScope& scope) const {
  if (absl::Status s = token_->Check(context, scope.run_id()); !s.ok()) {
    return s;
  }
  // The run_id keys the rate: its size first (key and value are checked
  // when the write is applied, so that oversized writes pay the rate too).
  return CheckStoreSizes(limits_, scope, "");
}

absl::Status StoreService::CheckWrite(const v1::StoreScope& scope,
                                      const std::string& key,
                                      size_t value_bytes) const {
  if (absl::Status ok = CheckStoreSizes(limits_, scope, key, value_bytes);
      !ok.ok()) {
    return ok;
  }
  return jobs_->CheckStoreScope(scope);
}

grpc::ServerUnaryReactor* StoreService::Throttle(
    grpc::CallbackServerContext* context, std::string run_id,
    const google::protobuf::Message* request,
    std::function<absl::Status()> apply) {
  const int64_t bytes = static_cast<int64_t>(request->ByteSizeLong());
  WriteDecision decision;
  WaiterId id = 0;
  {
    absl::MutexLock lock(&rate_mu_);
    decision = rate_.Admit(run_id, bytes, clock_->Now());
    if (decision.release_at != absl::InfinitePast()) id = writes_.NewId();
  }
  const bool refused = !decision.refused.ok();
  if (refused) refused_writes_.fetch_add(1);
  if (id == 0) {
    return FinishNow(context, refused ? decision.refused : apply());
  }
  if (refused) {
    // Held: only the call waits, not its payload. The request is this
    // call's own (gRPC destroys it when the call ends) and nothing reads
    // it again, so its fields are swapped into a message freed here.
    auto* mutable_request = const_cast<google::protobuf::Message*>(request);
    std::unique_ptr<google::protobuf::Message> payload(mutable_request->New());
    mutable_request->GetReflection()->Swap(mutable_request, payload.get());
    apply = [status = decision.refused] { return status; };
    held_refusals_.fetch_add(1);
  } else {
    delayed_writes_.fetch_add(1);
  }
  auto* reactor = new ParkedReactor([this, id] {
    std::optional<ParkedWrite> write = writes_.Take(id);
    if (!write.has_value()) return;  // already answered
    GiveBack(*write);
    write->reactor->Finish(grpc::Status(
        grpc::StatusCode::CANCELLED,
        "store write cancelled by the client (or its deadline passed) while "
        "it waited for its job's write rate; it was not applied"));
  });
  // Parked before its due time is queued: ReleaseWrites skips ids it
  // cannot take.
  writes_.Add(
      id, {reactor, std::move(apply), run_id, refused ? 0 : bytes, refused});
  {
    absl::MutexLock lock(&rate_mu_);
    due_.emplace(decision.release_at, id);
  }
  if (wake_by_) wake_by_(decision.release_at);
  return reactor;
}

void StoreService::GiveBack(const ParkedWrite& write) {
  absl::MutexLock lock(&rate_mu_);
  if (write.refusal) {
    rate_.Unhold(write.run_id);
  } else {
    rate_.Unpark(write.run_id, write.bytes);
  }
}

absl::Time StoreService::ReleaseWrites() {
  std::vector<WaiterId> due;
  absl::Time next = absl::InfiniteFuture();
  {
    absl::MutexLock lock(&rate_mu_);
    const absl::Time now = clock_->Now();
    while (!due_.empty() && due_.begin()->first <= now) {
      due.push_back(due_.begin()->second);
      due_.erase(due_.begin());
    }
    if (now - last_forget_ >= absl::Seconds(1)) {
      rate_.ForgetIdle(now);
      last_forget_ = now;
    }
    if (!due_.empty()) next = due_.begin()->first;
  }
  for (WaiterId id : due) {
    std::optional<ParkedWrite> write = writes_.Take(id);
    if (!write.has_value()) continue;  // cancelled meanwhile
    GiveBack(*write);
    write->reactor->Finish(common::ToGrpcStatus(write->apply()));
  }
  return next;
}

absl::Status StoreService::Admit(const grpc::CallbackServerContext& context,
                                 const v1::StoreScope& scope,
                                 const std::string& key,
                                 size_t value_bytes) const {
  if (absl::Status s = token_->Check(context, scope.run_id()); !s.ok()) {
    return s;
  }
  return CheckWrite(scope, key, value_bytes);
}

absl::Status StoreService::AdmitKeys(
    const grpc::CallbackServerContext& context, const v1::StoreScope& scope,
    const google::protobuf::RepeatedPtrField<std::string>& keys) const {
  if (keys.size() > limits_.max_keys_per_request) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%d keys in one request; the limit max_keys_per_request is %d",
        keys.size(), limits_.max_keys_per_request));
  }
  for (const std::string& key : keys) {
    if (absl::Status s = CheckStoreSizes(limits_, scope, key); !s.ok()) {
      return s;
    }
  }
  return Admit(context, scope, "");
}

void StoreService::Complete(std::vector<StoreCompletion> done) {
  for (StoreCompletion& c : done) {
    std::optional<Parked::Call> call = parked_.Take(c.waiter);
    if (!call.has_value()) continue;  // cancelled meanwhile
    if (!c.value.ok()) {
      call->reactor->Finish(common::ToGrpcStatus(c.value.status()));
      continue;
    }
    if (call->response != nullptr) {
      call->response->set_value(*std::move(c.value));
    }
    call->reactor->Finish(grpc::Status::OK);
  }
}

void StoreService::ReleaseRoundsBefore(const std::string& run_id,
                                       int64_t before_round) {
  std::vector<StoreCompletion> done;
  store_->ReleaseRoundsBefore(run_id, before_round, &done);
  Complete(std::move(done));
}

absl::Time StoreService::Tick() {
  std::vector<StoreCompletion> done;
  const absl::Time next_timeout = store_->Tick(&done);
  Complete(std::move(done));
  return std::min(next_timeout, ReleaseWrites());
}

void StoreService::CancelAll(const grpc::Status& status) {
  std::vector<StoreCompletion> done;
  store_->CancelAll(common::FromGrpcStatus(status), &done);
  Complete(std::move(done));
  for (auto& call : parked_.TakeAll()) call.reactor->Finish(status);
  for (auto& write : writes_.TakeAll()) {
    {
      absl::MutexLock lock(&rate_mu_);
      rate_.Unpark(write.run_id, write.bytes);
    }
    write.reactor->Finish(status);  // not applied
  }
}

grpc::ServerUnaryReactor* StoreService::Park(
    grpc::CallbackServerContext* context, v1::GetResponse* response,
    const std::function<void(WaiterId, absl::Duration,
                             std::vector<StoreCompletion>*)>& start,
    const v1::StoreScope& scope, int64_t timeout_ms) {
  if (timeout_ms < 0) {
    return FinishNow(context, absl::InvalidArgumentError(absl::StrFormat(
                                  "timeout_ms %d is negative; give 0 (wait "
                                  "until the call's deadline) or more",
                                  timeout_ms)));
  }
  WaiterId id = parked_.NewId();
  auto* reactor = new ParkedReactor([this, id] {
    std::optional<Parked::Call> call = parked_.Take(id);
    if (!call.has_value()) return;  // already answered
    store_->Cancel(id);
    call->reactor->Finish(grpc::Status(
        grpc::StatusCode::CANCELLED,
        "store call cancelled by the client (or its deadline passed)"));
  });
  parked_.Add(id, {reactor, response});
  std::vector<StoreCompletion> done;
  start(id,
        timeout_ms == 0 ? absl::InfiniteDuration()
                        : absl::Milliseconds(timeout_ms),
        &done);
  Complete(std::move(done));
  // The round may have ended between the scope check and the park; then
  // the release already ran and would never see this waiter.
  std::optional<int64_t> current = jobs_->CurrentRound(scope.run_id());
  if (current.has_value() && scope.round() < *current) {
    ReleaseRoundsBefore(scope.run_id(), *current);
  }
  return reactor;
}

grpc::ServerUnaryReactor* StoreService::Set(
    grpc::CallbackServerContext* context, const v1::SetRequest* request,
    v1::SetResponse* /*response*/) {
  if (absl::Status ok = AdmitWriter(*context, request->scope()); !ok.ok()) {
    return FinishNow(context, ok);
  }
  return Throttle(context, request->scope().run_id(), request, [this, request] {
    if (absl::Status ok = CheckWrite(request->scope(), request->key(),
                                     request->value().size());
        !ok.ok()) {
      return ok;
    }
    std::vector<StoreCompletion> done;
    absl::Status status =
        store_->Set(request->scope(), request->key(), request->value(), &done);
    Complete(std::move(done));
    return status;
  });
}

grpc::ServerUnaryReactor* StoreService::Get(
    grpc::CallbackServerContext* context, const v1::GetRequest* request,
    v1::GetResponse* response) {
  if (absl::Status ok = Admit(*context, request->scope(), request->key());
      !ok.ok()) {
    return FinishNow(context, ok);
  }
  return Park(
      context, response,
      [&](WaiterId id, absl::Duration timeout,
          std::vector<StoreCompletion>* done) {
        store_->Get(request->scope(), request->key(), timeout, id, done);
      },
      request->scope(), request->timeout_ms());
}

grpc::ServerUnaryReactor* StoreService::Add(
    grpc::CallbackServerContext* context, const v1::AddRequest* request,
    v1::AddResponse* response) {
  if (absl::Status ok = AdmitWriter(*context, request->scope()); !ok.ok()) {
    return FinishNow(context, ok);
  }
  return Throttle(
      context, request->scope().run_id(), request,
      [this, request, response]() -> absl::Status {
        if (absl::Status ok = CheckWrite(request->scope(), request->key());
            !ok.ok()) {
          return ok;
        }
        std::vector<StoreCompletion> done;
        absl::StatusOr<int64_t> value = store_->Add(
            request->scope(), request->key(), request->delta(), &done);
        Complete(std::move(done));
        if (!value.ok()) return value.status();
        response->set_value(*value);
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* StoreService::CompareSet(
    grpc::CallbackServerContext* context, const v1::CompareSetRequest* request,
    v1::CompareSetResponse* response) {
  if (absl::Status ok = AdmitWriter(*context, request->scope()); !ok.ok()) {
    return FinishNow(context, ok);
  }
  return Throttle(
      context, request->scope().run_id(), request,
      [this, request, response]() -> absl::Status {
        if (absl::Status ok = CheckWrite(request->scope(), request->key(),
                                         std::max(request->expected().size(),
                                                  request->desired().size()));
            !ok.ok()) {
          return ok;
        }
        std::vector<StoreCompletion> done;
        absl::StatusOr<std::string> value =
            store_->CompareSet(request->scope(), request->key(),
                               request->expected(), request->desired(), &done);
        Complete(std::move(done));
        if (!value.ok()) return value.status();
        response->set_value(*std::move(value));
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* StoreService::Check(
    grpc::CallbackServerContext* context, const v1::CheckRequest* request,
    v1::CheckResponse* response) {
  if (absl::Status ok = AdmitKeys(*context, request->scope(), request->keys());
      !ok.ok()) {
    return FinishNow(context, ok);
  }
  response->set_ready(store_->Check(request->scope(), Keys(request->keys())));
  return FinishNow(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* StoreService::Wait(
    grpc::CallbackServerContext* context, const v1::WaitRequest* request,
    v1::WaitResponse* /*response*/) {
  if (absl::Status ok = AdmitKeys(*context, request->scope(), request->keys());
      !ok.ok()) {
    return FinishNow(context, ok);
  }
  return Park(
      context, /*response=*/nullptr,
      [&](WaiterId id, absl::Duration timeout,
          std::vector<StoreCompletion>* done) {
        store_->Wait(request->scope(), Keys(request->keys()), timeout, id,
                     done);
      },
      request->scope(), request->timeout_ms());
}

grpc::ServerUnaryReactor* StoreService::DeleteKey(
    grpc::CallbackServerContext* context, const v1::DeleteKeyRequest* request,
    v1::DeleteKeyResponse* response) {
  if (absl::Status ok = AdmitWriter(*context, request->scope()); !ok.ok()) {
    return FinishNow(context, ok);
  }
  return Throttle(
      context, request->scope().run_id(), request,
      [this, request, response]() -> absl::Status {
        if (absl::Status ok = CheckWrite(request->scope(), request->key());
            !ok.ok()) {
          return ok;
        }
        response->set_deleted(
            store_->DeleteKey(request->scope(), request->key()));
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* StoreService::NumKeys(
    grpc::CallbackServerContext* context, const v1::NumKeysRequest* request,
    v1::NumKeysResponse* response) {
  if (absl::Status ok = Admit(*context, request->scope(), ""); !ok.ok()) {
    return FinishNow(context, ok);
  }
  response->set_num_keys(store_->NumKeys(request->scope()));
  return FinishNow(context, absl::OkStatus());
}

}  // namespace ddprun::rendezvous
