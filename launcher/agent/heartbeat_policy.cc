#include "launcher/agent/heartbeat_policy.h"

#include <cmath>

namespace ddprun::launcher {
namespace {

// The server's word that the node's round is over. A job that succeeded
// elsewhere does not stop workers still running here; they finish and
// Leave.
bool SaysRoundOver(const v1::HeartbeatResponse& response) {
  return response.rejoin() || response.state() == v1::JOB_STATE_FAILED;
}

}  // namespace

ResumeAnswer ReadResumeAnswer(const absl::StatusOr<v1::ResumeResponse>& resumed,
                              int64_t round,
                              absl::FunctionRef<bool()> forming) {
  if (!resumed.ok()) {
    // A server older than Resume cannot take the round back.
    return resumed.status().code() == absl::StatusCode::kUnimplemented
               ? ResumeAnswer::kNoResume
               : ResumeAnswer::kFailed;
  }
  if (resumed->has_assignment() && resumed->assignment().round() == round) {
    // The server lost the keys of the round's store with its restart: a
    // round whose workers still exchange keys there cannot complete.
    return forming() ? ResumeAnswer::kFormingLost : ResumeAnswer::kTookBack;
  }
  if (resumed->has_ended() &&
      resumed->ended().state() == v1::JOB_STATE_SUCCEEDED) {
    return ResumeAnswer::kJobSucceeded;
  }
  return ResumeAnswer::kCannotGoOn;
}

bool EndsRound(ResumeAnswer answer) {
  switch (answer) {
    case ResumeAnswer::kTookBack:
    case ResumeAnswer::kJobSucceeded:
    case ResumeAnswer::kFailed:
    case ResumeAnswer::kNotSent:
      return false;
    case ResumeAnswer::kFormingLost:
    case ResumeAnswer::kCannotGoOn:
    case ResumeAnswer::kNoResume:
      return true;
  }
  return true;
}

HeartbeatPolicy::HeartbeatPolicy(HeartbeatPolicyOptions options,
                                 absl::Time start)
    : options_(options),
      last_heard_(start),
      use_stream_(options.stream),
      reopen_backoff_(options.reopen_backoff) {}

HeartbeatPolicy::Step HeartbeatPolicy::OnAnswer(
    const absl::StatusOr<v1::HeartbeatResponse>& response, absl::Time sent,
    absl::Time now) {
  if (!response.ok()) {
    if (response.status().code() == absl::StatusCode::kNotFound) {
      // The server does not know the job: it restarted.
      resume_after_not_found_ = true;
      resume_sent_ = sent;
      return {.next = Next::kResume};
    }
    return Failed(now);
  }
  const bool outage_ended = failures_in_a_row_ > 0;
  Heard(sent);
  if (response->resume()) {
    resume_after_not_found_ = false;
    return {.next = Next::kResume, .outage_ended = outage_ended};
  }
  if (SaysRoundOver(*response)) {
    return {.next = Next::kRoundOver, .outage_ended = outage_ended};
  }
  return {.next = Next::kBeatAgain, .outage_ended = outage_ended};
}

HeartbeatPolicy::Step HeartbeatPolicy::OnPush(
    const v1::HeartbeatResponse& pushed) const {
  if (!pushed.resume() && SaysRoundOver(pushed))
    return {.next = Next::kRoundOver};
  return {.next = Next::kBeatAgain};
}

HeartbeatPolicy::Step HeartbeatPolicy::OnResumed(ResumeAnswer answer,
                                                 absl::Time now) {
  if (EndsRound(answer)) return {.next = Next::kNotResumed};
  const bool resumed = answer == ResumeAnswer::kTookBack ||
                       answer == ResumeAnswer::kJobSucceeded;
  if (!resume_after_not_found_) return {};  // the heartbeat was answered
  if (resumed) {
    // The server knows the node again, as of the heartbeat it did not know.
    Heard(resume_sent_);
    return {};
  }
  return Failed(now);
}

HeartbeatPolicy::Step HeartbeatPolicy::Failed(absl::Time now) {
  Step step;
  step.outage_started = failures_in_a_row_++ == 0;
  if (now - last_heard_ >= options_.timeout) {
    step.next = Next::kTimedOut;
    step.unheard_for = now - last_heard_;
  }
  return step;
}

void HeartbeatPolicy::Heard(absl::Time sent) {
  last_heard_ = sent;
  failures_in_a_row_ = 0;
}

bool HeartbeatPolicy::ShouldOpenStream(absl::Time now) const {
  return use_stream_ && now >= reopen_at_;
}

void HeartbeatPolicy::OnStreamOpenFailed(absl::StatusCode code,
                                         absl::Time now) {
  if (code == absl::StatusCode::kUnimplemented) {
    use_stream_ = false;
  } else {
    reopen_at_ = now + reopen_backoff_.Next();
  }
}

HeartbeatPolicy::StreamNext HeartbeatPolicy::OnStreamBeat(absl::StatusCode code,
                                                          absl::Time now) {
  switch (code) {
    case absl::StatusCode::kOk:
      reopen_backoff_.Reset();
      return StreamNext::kKeep;
    case absl::StatusCode::kUnimplemented:      // an older server
    case absl::StatusCode::kResourceExhausted:  // --max-heartbeat-streams
      use_stream_ = false;
      return StreamNext::kUnaryForRound;
    case absl::StatusCode::kNotFound:
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kPermissionDenied:
    case absl::StatusCode::kUnauthenticated:
    case absl::StatusCode::kFailedPrecondition:
      // The server's own answer to this heartbeat, as a unary call would
      // get it (NOT_FOUND: it restarted).
      return StreamNext::kAnswer;
    case absl::StatusCode::kDeadlineExceeded:
      // No answer within rpc_timeout: a unary call now would wait as long
      // again (a frozen or cut-off server) and delay the loop's timeout.
      reopen_at_ = now + reopen_backoff_.Next();
      return StreamNext::kAnswerLater;
    default:
      // A broken stream (UNAVAILABLE: the connection dropped, the server
      // restarted, ...): a unary heartbeat goes now, so that a stream's
      // trouble alone never costs the node its round.
      reopen_at_ = now + reopen_backoff_.Next();
      return StreamNext::kUnaryNow;
  }
}

bool HeartbeatPolicy::FiguresDue(const std::vector<v1::RankFigures>& figures,
                                 absl::Time now) const {
  if (figures.empty()) return false;
  if (now - figures_delivered_ >= options_.figures_interval) return true;
  if (figures.size() != delivered_.size()) return true;
  for (size_t i = 0; i < figures.size(); ++i) {
    const v1::RankFigures& now_f = figures[i];
    const v1::RankFigures& then = delivered_[i];
    if (now_f.local_rank() != then.local_rank() ||
        now_f.phase() != then.phase()) {
      return true;
    }
    const double before = then.compute_mean_s();
    const double after = now_f.compute_mean_s();
    if ((before > 0) != (after > 0)) return true;
    if (before > 0 &&
        std::abs(after - before) > options_.figures_change * before) {
      return true;
    }
  }
  return false;
}

void HeartbeatPolicy::FiguresDelivered(
    const std::vector<v1::RankFigures>& figures, absl::Time sent) {
  figures_delivered_ = sent;
  delivered_ = figures;
}

}  // namespace ddprun::launcher
