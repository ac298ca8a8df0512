#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/backoff.h"
#include "ddprun/v1/rendezvous.pb.h"

namespace ddprun::launcher {

// What a restarted server's answer to the node's Resume means for its round.
enum class ResumeAnswer {
  kTookBack,      // the server took the round back: the workers go on
  kJobSucceeded,  // the job succeeded meanwhile: workers here finish, Leave
  kFormingLost,   // taken back, but the workers were forming their group:
                  // the keys they exchanged are lost, the round is over
  kCannotGoOn,    // another round, or the job ended: the round is over
  kNoResume,      // the server is older than Resume: the round is over
  kFailed,        // no answer (the server is still down): try again later
  kNotSent,       // the node has no record to resume with: try again later
};

// Reads the answer to a Resume of `round`. `forming` (whether the node's
// workers may still be exchanging keys through the round's store) is asked
// only when the server took the round back.
ResumeAnswer ReadResumeAnswer(const absl::StatusOr<v1::ResumeResponse>& resumed,
                              int64_t round, absl::FunctionRef<bool()> forming);
// Whether the round goes on after `answer`: kTookBack and kJobSucceeded
// keep it; kFailed and kNotSent leave it to the next heartbeat.
bool EndsRound(ResumeAnswer answer);

struct HeartbeatPolicyOptions {
  // A node whose heartbeats all failed for this long has been dropped by
  // the server (the job's heartbeat_timeout): its round is over.
  absl::Duration timeout = absl::InfiniteDuration();
  // Beat on the server's stream while it has one (else unary).
  bool stream = true;
  // How soon a failed stream is opened again: 0.1 s, growing to 10 s while
  // it keeps failing (unary heartbeats go meanwhile).
  common::BackoffOptions reopen_backoff = {.initial = absl::Milliseconds(100),
                                           .max = absl::Seconds(10)};
  // The node's ranks' figures ride on a heartbeat this often, and at once
  // when a rank's phase changed or its compute time moved by more than
  // figures_change (a rank slowing down is named as soon as it would be
  // with figures at every heartbeat). The server hands out the interval in
  // each round's assignment (Assignment::figures_interval_ms): once a
  // second, longer for a job past its figures budget (rendezvous/core's
  // ScaleFiguresInterval); this is the interval for an older server's
  // rounds. The server keeps a node's last figures fresh for 2.5 intervals
  // and names a straggler after 3 one-second windows; each figures message
  // costs it far more than parsing them (gRPC's thread hand-offs): at 1,000
  // nodes ~4 % of a core at every 250 ms heartbeat, ~2 % once a second
  // (bench/rendezvous/README.md). Every 2 s for a small job, a throttled
  // rank was named after 11 s once, under CI's load (goal 10 s): once a
  // second keeps that margin.
  absl::Duration figures_interval = absl::Seconds(1);
  // Relative: 0.25 sends a mean compute time of 1.25x or 0.8x the last
  // delivered one at once (the straggler factor is 1.5x).
  double figures_change = 0.25;
};

// Decides what the heartbeat loop (HeartbeatLoop, its only user) does
// after each heartbeat and each stream call, apart from the calls, the
// waits and the logs: when the round is over (the server said so, or
// nothing reached it for the timeout), when to Resume a restarted server,
// when an outage starts and ends, whether to beat on the stream or unary,
// and when to reopen a broken stream (capped exponential backoff). Every
// method takes `now` (the caller's clock), so that tests step time by
// hand. Not thread-safe: the loop's thread owns it.
class HeartbeatPolicy {
 public:
  // What the loop does next.
  enum class Next {
    kBeatAgain,   // at the next interval
    kResume,      // send the node's Resume now, then call OnResumed
    kRoundOver,   // the server said so: rejoin, or the job failed
    kNotResumed,  // a restarted server cannot take the round back
    kTimedOut,    // no heartbeat reached the server for the timeout
  };
  struct Step {
    Next next = Next::kBeatAgain;
    // A heartbeat failed after a working one (an outage starts; the loop
    // logs once per outage, not once per interval).
    bool outage_started = false;
    // A heartbeat was answered after an outage.
    bool outage_ended = false;
    // With kTimedOut: how long no heartbeat reached the server.
    absl::Duration unheard_for;
  };
  // What the loop does with a stream after one heartbeat on it.
  enum class StreamNext {
    kKeep,           // answered: the stream stays
    kAnswer,         // dropped; the error is the server's answer to this
                     // heartbeat; the next one opens a new stream
    kAnswerLater,    // dropped; the error is this heartbeat's (a unary
                     // call would wait as long again); reopened later
    kUnaryNow,       // dropped; a unary heartbeat goes now; reopened later
    kUnaryForRound,  // dropped; unary heartbeats from now on (no stream
                     // on the server, or it holds all it takes)
  };

  // `start`: when the server last heard from the node (its Join).
  HeartbeatPolicy(HeartbeatPolicyOptions options, absl::Time start);

  // The answer to the heartbeat sent at `sent`.
  Step OnAnswer(const absl::StatusOr<v1::HeartbeatResponse>& response,
                absl::Time sent, absl::Time now);
  // After kResume: what came of the Resume.
  Step OnResumed(ResumeAnswer answer, absl::Time now);
  // What the server pushed unasked on the stream (HeartbeatResponse.pushed):
  // kRoundOver when it says so as an answer would, else kBeatAgain (the
  // heartbeats go on as before; a push is no heartbeat heard).
  Step OnPush(const v1::HeartbeatResponse& pushed) const;

  // Whether to open a stream now, when the loop holds none.
  bool ShouldOpenStream(absl::Time now) const;
  // Opening one failed with `code`.
  void OnStreamOpenFailed(absl::StatusCode code, absl::Time now);
  // A heartbeat on the stream ended with `code`.
  StreamNext OnStreamBeat(absl::StatusCode code, absl::Time now);
  bool uses_stream() const { return use_stream_; }

  // Whether the heartbeat about to go at `now` carries `figures` (the
  // node's ranks' figures now): none were delivered yet, figures_interval
  // has passed since the last were, or since then a rank's phase changed
  // or its mean compute time moved by more than figures_change.
  bool FiguresDue(const std::vector<v1::RankFigures>& figures,
                  absl::Time now) const;
  // `figures` went with the heartbeat sent at `sent`, and it was answered.
  void FiguresDelivered(const std::vector<v1::RankFigures>& figures,
                        absl::Time sent);

 private:
  Step Failed(absl::Time now);
  void Heard(absl::Time sent);

  HeartbeatPolicyOptions options_;
  // The server heard from this node no earlier than the sending of its
  // last answered heartbeat (or its Join).
  absl::Time last_heard_;
  int failures_in_a_row_ = 0;
  // Why the Resume now in flight was sent: the server did not know the job
  // (then a Resume that fails counts as a failed heartbeat), or it asked.
  bool resume_after_not_found_ = false;
  absl::Time resume_sent_;
  bool use_stream_;
  absl::Time reopen_at_ = absl::InfinitePast();
  common::Backoff reopen_backoff_;
  absl::Time figures_delivered_ = absl::InfinitePast();
  // The last figures delivered (what FiguresDue compares with).
  std::vector<v1::RankFigures> delivered_;
};

}  // namespace ddprun::launcher
