#include "rendezvous/service/heartbeat_stream.h"

#include <optional>
#include <string>
#include <utility>
#include <vector>

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
    one.set_steps(beat.steps());
    one.set_steps_age_ms(beat.steps_age_ms());
    one.set_sync(beat.sync());
    one.set_sync_age_ms(beat.sync_age_ms());
    absl::StatusOr<v1::HeartbeatResponse> each = jobs->Heartbeat(one);
    if (!each.ok()) return each.status();
    *answer->add_more() = *std::move(each);
  }
  return answer;
}

// One stream. Reads are sequential (one outstanding at a time), so
// OnReadDone never runs concurrently with itself; it may run concurrently
// with OnWriteDone and with a push (PushRoundOver's thread), and mu_ orders
// them around the one write gRPC allows in flight. gRPC is never called
// with mu_ held (a reaction may run inline). The stream deletes itself once
// gRPC is done with it and no push holds it (refs_).
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
      if (!registered_run_id_.empty()) {
        owner_->Unregister(registered_run_id_, this);
        registered_run_id_.clear();
      }
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
      if (registered_run_id_.empty()) {
        registered_run_id_ = admitted_run_id_;
        owner_->Register(registered_run_id_, this);
      }
    } else {
      last_beat_.reset();
    }
    {
      absl::MutexLock lock(&mu_);
      pushable_ = last_beat_;
    }
    Send(*std::move(answer));
    StartRead(&request_);
  }

  // PushRoundOver's part: pushes what this stream's node would be answered
  // now, when its last beat was of a round before `before_round` and that
  // answer says the round is over or the job ended. Any thread.
  void PushIfRoundBefore(const std::string& run_id, int64_t before_round) {
    std::optional<Beat> beat;
    {
      absl::MutexLock lock(&mu_);
      if (finishing_ || !pushable_.has_value() ||
          pushable_->round >= before_round ||
          pushed_round_ == pushable_->round) {
        return;
      }
      beat = pushable_;
      pushed_round_ = beat->round;
    }
    absl::StatusOr<v1::HeartbeatResponse> answer =
        owner_->jobs_->HeartbeatAnswer(run_id, beat->node_id, beat->round);
    if (!answer.ok() || !(answer->rejoin() || answer->has_ended())) return;
    answer->set_pushed(true);
    owner_->pushes_.fetch_add(1);
    Send(*std::move(answer));
  }

  void Ref() { refs_.fetch_add(1); }
  void Unref() {
    if (refs_.fetch_sub(1) == 1) delete this;
  }

  void OnWriteDone(bool ok) override {
    bool write = false;
    std::optional<grpc::Status> finish;
    {
      absl::MutexLock lock(&mu_);
      // The answer first: the agent's heartbeat waits for it.
      std::optional<v1::HeartbeatResponse>& next =
          pending_.has_value() ? pending_ : pending_push_;
      if (ok && next.has_value()) {
        out_ = *std::move(next);
        next.reset();
        write = true;
      } else {
        writing_ = false;
        pending_.reset();
        pending_push_.reset();
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
    if (!registered_run_id_.empty()) {
      owner_->Unregister(registered_run_id_, this);
    }
    Unref();
  }

 private:
  // Writes `answer`, or keeps it for when the write in flight is done (an
  // answer waiting there is replaced: the newest says all the agent needs;
  // a push waits apart, so that it never takes an answer's place). Nothing
  // once the stream is finishing.
  void Send(v1::HeartbeatResponse answer) {
    {
      absl::MutexLock lock(&mu_);
      if (finishing_) return;
      if (writing_) {
        (answer.pushed() ? pending_push_ : pending_) = std::move(answer);
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
  // The job this stream is registered under for pushes (empty: none); read
  // by OnDone, after the last read.
  std::string registered_run_id_;
  // gRPC's reference, and one per push in progress.
  std::atomic<int> refs_{1};

  absl::Mutex mu_;
  v1::HeartbeatResponse out_;  // the write in flight (gRPC reads it)
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<v1::HeartbeatResponse> pending_ ABSL_GUARDED_BY(mu_);
  std::optional<v1::HeartbeatResponse> pending_push_ ABSL_GUARDED_BY(mu_);
  // The node and round a push is for (the last beat of one node), and the
  // round last pushed for.
  std::optional<Beat> pushable_ ABSL_GUARDED_BY(mu_);
  int64_t pushed_round_ ABSL_GUARDED_BY(mu_) = -1;
  bool finishing_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status finish_status_ ABSL_GUARDED_BY(mu_);
};

void HeartbeatStreams::Register(const std::string& run_id, Stream* stream) {
  absl::MutexLock lock(&registry_mu_);
  by_job_[run_id].insert(stream);
}

void HeartbeatStreams::Unregister(const std::string& run_id, Stream* stream) {
  absl::MutexLock lock(&registry_mu_);
  auto it = by_job_.find(run_id);
  if (it == by_job_.end()) return;
  it->second.erase(stream);
  if (it->second.empty()) by_job_.erase(it);
}

void HeartbeatStreams::PushRoundOver(const std::string& run_id,
                                     int64_t before_round) {
  std::vector<Stream*> streams;
  {
    absl::MutexLock lock(&registry_mu_);
    auto it = by_job_.find(run_id);
    if (it == by_job_.end()) return;
    streams.reserve(it->second.size());
    for (Stream* stream : it->second) {
      stream->Ref();
      streams.push_back(stream);
    }
  }
  for (Stream* stream : streams) {
    stream->PushIfRoundBefore(run_id, before_round);
    stream->Unref();
  }
}

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
