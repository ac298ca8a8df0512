#include "rendezvous/service/heartbeat_stream.h"

#include <optional>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "common/grpc_status.h"

namespace ddprun::rendezvous {

absl::StatusOr<v1::HeartbeatResponse> AnswerHeartbeat(
    JobTable* jobs, const v1::HeartbeatRequest& request) {
  if (request.more_size() >= kMaxBeatsPerMessage) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "a heartbeat of job '%s' carries %d nodes, more than %d: split it "
        "into several messages",
        request.run_id(), request.more_size() + 1, kMaxBeatsPerMessage));
  }
  absl::StatusOr<v1::HeartbeatResponse> answer = jobs->Heartbeat(request);
  if (!answer.ok() || request.more_size() == 0) return answer;
  v1::HeartbeatRequest one;
  one.set_run_id(request.run_id());
  answer->mutable_more()->Reserve(request.more_size());
  for (const v1::NodeBeat& beat : request.more()) {
    one.set_node_id(beat.node_id());
    one.set_round(beat.round());
    *one.mutable_ranks() = beat.ranks();
    absl::StatusOr<v1::HeartbeatResponse> each = jobs->Heartbeat(one);
    if (!each.ok()) return each.status();
    *answer->add_more() = *std::move(each);
  }
  return answer;
}

// One stream. Reads are sequential (one outstanding at a time), so
// OnReadDone never runs concurrently with itself; it may run concurrently
// with OnWriteDone, and mu_ orders the two around the one write gRPC allows
// in flight. gRPC is never called with mu_ held (a reaction may run inline).
class HeartbeatStreams::Stream final
    : public grpc::ServerBidiReactor<v1::HeartbeatRequest,
                                     v1::HeartbeatResponse> {
 public:
  // Refused with `refusal` when set: the stream ends at once.
  Stream(HeartbeatStreams* owner, grpc::CallbackServerContext* context,
         std::optional<grpc::Status> refusal)
      : owner_(owner), context_(context) {
    owner_->open_.fetch_add(1);
    if (refusal.has_value()) {
      FinishOnce(*std::move(refusal));
      return;
    }
    StartRead(&request_);
  }

  void OnReadDone(bool ok) override {
    // The agent closed its side, went away, or cancelled: no more beats.
    // The job hears it (a member gone with its stream is dropped soon).
    if (!ok) {
      if (last_beat_.has_value()) {
        owner_->jobs_->HeartbeatStreamEnded(
            admitted_run_id_, last_beat_->node_id, last_beat_->round);
      }
      return FinishOnce(grpc::Status::OK);
    }
    if (!admitted_ || request_.run_id() != admitted_run_id_) {
      absl::Status admitted =
          owner_->token_->Check(*context_, request_.run_id());
      if (!admitted.ok()) return FinishOnce(common::ToGrpcStatus(admitted));
      admitted_ = true;
      admitted_run_id_ = request_.run_id();
    }
    absl::StatusOr<v1::HeartbeatResponse> answer =
        AnswerHeartbeat(owner_->jobs_, request_);
    if (!answer.ok()) return FinishOnce(common::ToGrpcStatus(answer.status()));
    owner_->beats_.fetch_add(1 + request_.more_size(),
                             std::memory_order_relaxed);
    // A relay's stream carries many nodes (`more`); only a stream of one
    // node stands for that node's liveness.
    if (request_.more_size() == 0) {
      last_beat_ = Beat{request_.node_id(), request_.round()};
    } else {
      last_beat_.reset();
    }
    Send(*std::move(answer));
    StartRead(&request_);
  }

  void OnWriteDone(bool ok) override {
    bool write = false;
    std::optional<grpc::Status> finish;
    {
      absl::MutexLock lock(&mu_);
      if (ok && pending_.has_value()) {
        out_ = *std::move(pending_);
        pending_.reset();
        write = true;
      } else {
        writing_ = false;
        pending_.reset();
        if (finishing_ && !finished_) {
          finished_ = true;
          finish = finish_status_;
        }
      }
    }
    if (write) StartWrite(&out_);
    if (finish.has_value()) Finish(*finish);
  }

  void OnDone() override {
    owner_->open_.fetch_sub(1);
    delete this;
  }

 private:
  // Writes `answer`, or keeps it for when the write in flight is done (an
  // answer waiting there is replaced: the newest says all the agent needs).
  void Send(v1::HeartbeatResponse answer) {
    {
      absl::MutexLock lock(&mu_);
      if (writing_) {
        pending_ = std::move(answer);
        return;
      }
      writing_ = true;
      out_ = std::move(answer);
    }
    StartWrite(&out_);
  }

  // Ends the stream with `status` once the write in flight (if any) is done.
  void FinishOnce(grpc::Status status) {
    {
      absl::MutexLock lock(&mu_);
      if (finishing_) return;
      finishing_ = true;
      if (writing_) {
        finish_status_ = std::move(status);
        return;
      }
      finished_ = true;
    }
    Finish(status);
  }

  struct Beat {
    std::string node_id;
    int64_t round = 0;
  };

  HeartbeatStreams* const owner_;
  grpc::CallbackServerContext* const context_;
  // The last heartbeat answered on this stream (reads are sequential: only
  // OnReadDone touches it).
  std::optional<Beat> last_beat_;
  // OnReadDone's alone (reads are sequential).
  v1::HeartbeatRequest request_;
  bool admitted_ = false;
  std::string admitted_run_id_;

  absl::Mutex mu_;
  v1::HeartbeatResponse out_;  // the write in flight (gRPC reads it)
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<v1::HeartbeatResponse> pending_ ABSL_GUARDED_BY(mu_);
  bool finishing_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status finish_status_ ABSL_GUARDED_BY(mu_);
};

grpc::ServerBidiReactor<v1::HeartbeatRequest, v1::HeartbeatResponse>*
HeartbeatStreams::Open(grpc::CallbackServerContext* context) {
  // (Racing opens may pass the cap by a few: it bounds, it need not be
  // exact.)
  if (open_.load() >= max_streams_) {
    refused_.fetch_add(1);
    return new Stream(
        this, context,
        grpc::Status(
            grpc::StatusCode::RESOURCE_EXHAUSTED,
            absl::StrFormat("this server holds %d heartbeat streams "
                            "(ddprun-rendezvous --max-heartbeat-streams): send "
                            "unary Heartbeats",
                            max_streams_)));
  }
  return new Stream(this, context, std::nullopt);
}

}  // namespace ddprun::rendezvous
