#include "relay/passthrough_call.h"

#include <atomic>

#include "relay/forwarding.h"

namespace ddprun::relay {
namespace {

// One call, both sides. Messages move one at a time in each direction: a
// downstream message is read only once the previous one was written
// upstream, and an upstream answer only once the previous one was written
// downstream, so each side has at most one read and one write in flight
// (what gRPC's reactors allow) and a slow reader slows its writer.
class PassthroughCall : public grpc::ServerGenericBidiReactor {
 public:
  PassthroughCall(grpc::GenericCallbackServerContext* context,
                  grpc::GenericStub* stub, std::string upstream)
      : upstream_address_(std::move(upstream)),
        method_(context->method()),
        upstream_(this) {
    AttachMetadata(MetadataToForward(*context), &upstream_context_);
    ForwardDeadline(*context, &upstream_context_);
    stub->PrepareBidiStreamingCall(&upstream_context_, method_,
                                   grpc::StubOptions(), &upstream_);
    // Held while the caller may still send: its messages are written
    // upstream from the caller's reactions, which must not meet an upstream
    // call gRPC already ended (OnDone).
    upstream_.AddHold();
    upstream_.StartRead(&from_upstream_);
    upstream_.StartCall();
    StartRead(&from_caller_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      upstream_.StartWritesDone();  // the caller closed its side
      upstream_.RemoveHold();
      return;
    }
    upstream_.StartWrite(&from_caller_);
  }

  void OnWriteDone(bool ok) override {
    if (ok) {
      upstream_.StartRead(&from_upstream_);
    } else {  // the caller is gone
      upstream_context_.TryCancel();
    }
    upstream_.RemoveHold();  // taken for this write
  }

  void OnCancel() override { upstream_context_.TryCancel(); }

  void OnDone() override { Release(); }

 private:
  class Upstream
      : public grpc::ClientBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
   public:
    explicit Upstream(PassthroughCall* call) : call_(call) {}
    void OnWriteDone(bool ok) override {
      if (ok) {
        call_->StartRead(&call_->from_caller_);
      } else {
        // The upstream call is over: the caller sends nothing more that
        // could go anywhere; OnDone finishes the caller's call.
        RemoveHold();
      }
    }
    void OnReadDone(bool ok) override {
      if (!ok) return;
      // Held until the caller has this answer: the next read upstream is
      // started from the caller's reaction.
      AddHold();
      call_->StartWrite(&call_->from_upstream_);
    }
    void OnDone(const grpc::Status& status) override {
      call_->Finish(FromUpstream(status, call_->upstream_address_));
      call_->Release();
    }

   private:
    PassthroughCall* const call_;
  };

  // Deletes the call once both the caller's side and the upstream side
  // are done.
  void Release() {
    if (sides_left_.fetch_sub(1) == 1) delete this;
  }

  const std::string upstream_address_;
  const std::string method_;  // gRPC keeps a pointer to it
  grpc::ClientContext upstream_context_;
  Upstream upstream_;
  grpc::ByteBuffer from_caller_;
  grpc::ByteBuffer from_upstream_;
  std::atomic<int> sides_left_{2};
};

}  // namespace

grpc::ServerGenericBidiReactor* StartPassthrough(
    grpc::GenericCallbackServerContext* context, grpc::GenericStub* stub,
    const std::string& upstream, RelayCounters* counters) {
  counters->passthrough_calls.Increment();
  return new PassthroughCall(context, stub, upstream);
}

}  // namespace ddprun::relay
