#include "relay/join_call.h"

#include <atomic>
#include <memory>

#include "absl/synchronization/mutex.h"
#include "relay/forwarding.h"
#include "relay/messages.h"

namespace ddprun::relay {
namespace {

// Finish is called exactly once: by the answer (through the waiter, which
// lets only one of answer and cancellation win), by a cancellation that
// won, or on a bad request. gRPC runs OnDone, which deletes the call, only
// after that and after every other reaction returned.
class JoinCall : public grpc::ServerGenericBidiReactor {
 public:
  JoinCall(grpc::GenericCallbackServerContext* context, JoinBatcher* batcher,
           grpc::GenericStub* generic, std::string upstream,
           RelayCounters* counters)
      : context_(context),
        batcher_(batcher),
        generic_(generic),
        upstream_(std::move(upstream)),
        counters_(counters) {
    StartRead(&request_bytes_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {  // cancelled before it sent its request
      Finish(grpc::Status(grpc::StatusCode::CANCELLED, "no Join request"));
      return;
    }
    grpc::ByteBuffer original = request_bytes_;  // shares the slices
    v1::JoinRequest request;
    if (!ParseMessage(&request_bytes_, &request)) {
      Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          "ddprun-relay: the Join request is not a "
                          "ddprun.v1.JoinRequest"));
      return;
    }
    if (request.more_size() > 0) {
      PassThrough(std::move(original));
      return;
    }
    counters_->joins.Increment();
    auto waiter = std::make_shared<JoinWaiter>(
        std::move(request), MetadataToForward(*context_), context_->deadline(),
        [this](const grpc::Status& status, const v1::JoinResponse& response) {
          Answer(status, response);
        });
    bool cancelled = false;
    {
      absl::MutexLock lock(&mu_);
      cancelled = cancelled_;
      if (!cancelled) waiter_ = waiter;
    }
    if (cancelled) {  // OnCancel found no waiter and left Finish to us
      Finish(grpc::Status::CANCELLED);
      return;
    }
    batcher_->Add(std::move(waiter));
  }

  void OnCancel() override {
    std::shared_ptr<JoinWaiter> waiter;
    bool passthrough = false;
    {
      absl::MutexLock lock(&mu_);
      cancelled_ = true;
      waiter = waiter_;
      passthrough = passthrough_;
    }
    if (passthrough) {
      upstream_context_.TryCancel();  // its callback finishes the call
      return;
    }
    // No waiter: the read fails and OnReadDone finishes, or it succeeded
    // and OnReadDone sees cancelled_.
    if (waiter != nullptr && waiter->MarkCancelled()) {
      batcher_->Remove(waiter);
      Finish(grpc::Status::CANCELLED);
    }
  }

  void OnWriteDone(bool /*ok*/) override {}

  void OnDone() override { delete this; }

 private:
  void Answer(const grpc::Status& status, const v1::JoinResponse& response) {
    if (!status.ok()) {
      Finish(status);
      return;
    }
    response_bytes_ = SerializeMessage(response);
    StartWriteAndFinish(&response_bytes_, grpc::WriteOptions(),
                        grpc::Status::OK);
  }

  void PassThrough(grpc::ByteBuffer request) {
    counters_->passthrough_calls.Increment();
    request_bytes_ = std::move(request);
    AttachMetadata(MetadataToForward(*context_), &upstream_context_);
    ForwardDeadline(*context_, &upstream_context_);
    bool cancelled = false;
    {
      absl::MutexLock lock(&mu_);
      passthrough_ = true;
      cancelled = cancelled_;
    }
    if (cancelled) upstream_context_.TryCancel();
    generic_->UnaryCall(
        &upstream_context_, context_->method(), grpc::StubOptions(),
        &request_bytes_, &response_bytes_, [this](grpc::Status status) {
          if (!status.ok()) {
            Finish(FromUpstream(status, upstream_));
            return;
          }
          StartWriteAndFinish(&response_bytes_, grpc::WriteOptions(),
                              grpc::Status::OK);
        });
  }

  grpc::GenericCallbackServerContext* const context_;
  JoinBatcher* const batcher_;
  grpc::GenericStub* const generic_;
  const std::string upstream_;
  RelayCounters* const counters_;
  grpc::ByteBuffer request_bytes_;
  grpc::ByteBuffer response_bytes_;
  grpc::ClientContext upstream_context_;
  absl::Mutex mu_;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  bool passthrough_ ABSL_GUARDED_BY(mu_) = false;
  std::shared_ptr<JoinWaiter> waiter_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

grpc::ServerGenericBidiReactor* StartJoinCall(
    grpc::GenericCallbackServerContext* context, JoinBatcher* batcher,
    grpc::GenericStub* generic, const std::string& upstream,
    RelayCounters* counters) {
  return new JoinCall(context, batcher, generic, upstream, counters);
}

}  // namespace ddprun::relay
