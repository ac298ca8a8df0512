#include "relay/beat_call.h"

#include <deque>
#include <memory>
#include <optional>

#include "absl/synchronization/mutex.h"
#include "relay/forwarding.h"
#include "relay/messages.h"

namespace ddprun::relay {
namespace {

class BeatCall;

// The call's state, shared with the mux (which may answer after the call is
// gone). Whoever takes the write slot under mu_ (writing_ or finished_ set)
// is the only one to call into the reactor until it gives the slot back;
// Finish is called once, by the slot's holder, and nothing touches the
// reactor after it (gRPC deletes it only after Finish, in OnDone).
class BeatState : public BeatSink,
                  public std::enable_shared_from_this<BeatState> {
 public:
  BeatState(BeatCall* call, bool streaming)
      : call_(call), streaming_(streaming) {}

  void OnAnswer(const v1::HeartbeatResponse& response) override {
    absl::MutexLock lock(&mu_);
    --outstanding_;
    if (!finish_status_.has_value()) to_write_.push_back(response);
    Step();
  }
  void OnError(const grpc::Status& status) override {
    absl::MutexLock lock(&mu_);
    --outstanding_;
    if (!finish_status_.has_value()) finish_status_ = status;
    Step();
  }
  // A message of the caller's went to the mux.
  void Sent() {
    absl::MutexLock lock(&mu_);
    ++outstanding_;
  }
  void ReadsDone() {
    absl::MutexLock lock(&mu_);
    reads_done_ = true;
    Step();
  }
  void WriteDone(bool ok) {
    absl::MutexLock lock(&mu_);
    writing_ = false;
    if (!ok && !finish_status_.has_value()) {
      finish_status_ =
          grpc::Status(grpc::StatusCode::CANCELLED, "the caller went away");
    }
    Step();
  }
  bool finished() {
    absl::MutexLock lock(&mu_);
    return finished_ || finish_status_.has_value();
  }
  void Fail(const grpc::Status& status) {
    absl::MutexLock lock(&mu_);
    if (!finish_status_.has_value()) finish_status_ = status;
    Step();
  }

 private:
  // Takes the write slot when there is something to do, and does it with
  // mu_ released (a reaction may run inline).
  void Step() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  BeatCall* const call_;
  const bool streaming_;
  absl::Mutex mu_;
  std::deque<v1::HeartbeatResponse> to_write_ ABSL_GUARDED_BY(mu_);
  std::optional<grpc::Status> finish_status_ ABSL_GUARDED_BY(mu_);
  int outstanding_ ABSL_GUARDED_BY(mu_) = 0;
  bool reads_done_ ABSL_GUARDED_BY(mu_) = false;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
};

class BeatCall : public grpc::ServerGenericBidiReactor {
 public:
  BeatCall(grpc::GenericCallbackServerContext* context, HeartbeatMux* mux,
           bool streaming, RelayCounters* counters)
      : metadata_(MetadataToForward(*context)),
        mux_(mux),
        streaming_(streaming),
        counters_(counters),
        state_(std::make_shared<BeatState>(this, streaming)) {
    StartRead(&in_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      state_->ReadsDone();
      return;
    }
    v1::HeartbeatRequest request;
    if (!ParseMessage(&in_, &request)) {
      state_->Fail(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                "ddprun-relay: a heartbeat is not a "
                                "ddprun.v1.HeartbeatRequest"));
      return;
    }
    counters_->beats.Increment(1 + request.more_size());
    state_->Sent();
    mux_->Beat(metadata_, state_, std::move(request));
    if (streaming_) {
      if (!state_->finished()) StartRead(&in_);
    } else {
      state_->ReadsDone();
    }
  }
  void OnWriteDone(bool ok) override { state_->WriteDone(ok); }
  void OnDone() override { delete this; }

  // Called by the slot's holder only.
  void Write(const v1::HeartbeatResponse& response, bool last) {
    out_ = SerializeMessage(response);
    if (last) {
      StartWriteAndFinish(&out_, grpc::WriteOptions(), grpc::Status::OK);
    } else {
      StartWrite(&out_);
    }
  }

 private:
  const ForwardedMetadata metadata_;
  HeartbeatMux* const mux_;
  const bool streaming_;
  RelayCounters* const counters_;
  const std::shared_ptr<BeatState> state_;
  grpc::ByteBuffer in_;
  grpc::ByteBuffer out_;
};

void BeatState::Step() {
  if (finished_ || writing_) return;
  if (!to_write_.empty()) {
    v1::HeartbeatResponse response = std::move(to_write_.front());
    to_write_.pop_front();
    // A unary call ends with its one answer.
    bool last = !streaming_;
    if (last) {
      finished_ = true;
    } else {
      writing_ = true;
    }
    mu_.Unlock();
    call_->Write(response, last);
    mu_.Lock();
    return;
  }
  grpc::Status status;
  if (finish_status_.has_value()) {
    status = *finish_status_;
  } else if (reads_done_ && outstanding_ == 0) {
    status = grpc::Status::OK;
    if (!streaming_) {
      status = grpc::Status(grpc::StatusCode::CANCELLED, "no heartbeat");
    }
  } else {
    return;
  }
  finished_ = true;
  mu_.Unlock();
  call_->Finish(status);
  mu_.Lock();
}

}  // namespace

grpc::ServerGenericBidiReactor* StartBeatCall(
    grpc::GenericCallbackServerContext* context, HeartbeatMux* mux,
    bool streaming, RelayCounters* counters) {
  return new BeatCall(context, mux, streaming, counters);
}

}  // namespace ddprun::relay
