#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "launcher/agent/heartbeat_policy.h"
#include "launcher/agent/rendezvous_api.h"

namespace ddprun::launcher {

struct HeartbeatLoopOptions {
  std::string run_id;
  std::string node_id;
  int64_t round = 0;
  absl::Duration interval = absl::Seconds(1);
  // The server drops a node it has not heard from for this long (the job's
  // heartbeat_timeout). A node whose heartbeats all failed for as long has
  // been dropped, or is about to be: its round is over.
  absl::Duration timeout = absl::InfiniteDuration();
  // The node's Resume request (a JoinRequest with its record of `round`):
  // sent when the server says it does not know the job (NOT_FOUND: it
  // restarted) or asks for it (HeartbeatResponse.resume), so that the round
  // goes on without stopping the workers. Unset: never sent.
  std::optional<v1::JoinRequest> resume;
  // Asked (from the loop's thread) once a restarted server took the round
  // back: true while this node's workers may still be exchanging keys
  // through the round's store (forming their group, syncing state). The
  // server lost those keys, so such a round cannot complete: it is over,
  // and the next one forms from scratch. Unset: never.
  std::function<bool()> forming;
  // Heartbeat on one long-lived stream (Rendezvous.Heartbeats), which costs
  // the server less per heartbeat than a unary call. A server that answers
  // UNIMPLEMENTED (older than the stream) or RESOURCE_EXHAUSTED (it holds
  // --max-heartbeat-streams) gets unary Heartbeats for the rest of the
  // round; a broken stream is reopened with backoff, and unary Heartbeats
  // go meanwhile. False: unary only.
  bool stream = true;
  // The node's local ranks' figures (called on the loop's thread at every
  // heartbeat; they go every figures_interval, and at once when a rank's
  // phase or compute time changed: HeartbeatPolicyOptions). Unset: none.
  std::function<std::vector<v1::RankFigures>()> figures;
  // How often the figures go at the latest (the round's
  // Assignment::figures_interval_ms: HeartbeatPolicyOptions).
  absl::Duration figures_interval = absl::Seconds(1);
  // Called (on the loop's thread) with this node's local ranks that the
  // server names stragglers, whenever an answer names any. Unset: ignored.
  std::function<void(std::vector<int>)> on_stragglers;
  // The most steps a local rank completed in the round, and the furthest
  // one got through the round's state sync, each with how long ago the first
  // got there, sent with every heartbeat (HeartbeatRequest.steps,
  // steps_age_ms, sync, sync_age_ms); and called (on the loop's thread) with
  // the round's, from every answer that carries any (HeartbeatResponse.
  // round_steps, round_sync and their ages). Unset: none sent, or ignored.
  struct Progress {
    int64_t steps = 0;
    absl::Duration steps_age;
    int64_t sync = 0;
    absl::Duration sync_age;
  };
  std::function<Progress()> progress;
  std::function<void(Progress)> on_round_progress;
};

// Heartbeats the rendezvous for one round on a thread of its own, so that a
// slow server never delays supervision. Calls `on_round_over` (once) when the
// server says the node's round is over (rejoin, or the job ended), or when no
// heartbeat has reached the server for `timeout` (a host cut off from the
// network learns so, instead of waiting on its peers forever). A failed
// heartbeat is logged and retried at the next interval. A restarted server
// that lost the job is told the node's round (Resume) and the round goes on;
// when the server cannot take it back, the round is over. Heartbeats go on a
// stream when the server has it (HeartbeatLoopOptions::stream).
// HeartbeatPolicy decides all of that; this class makes the calls, the waits
// and the logs, on the wall clock. The destructor stops the thread (and
// closes the stream).
class HeartbeatLoop {
 public:
  HeartbeatLoop(RendezvousApi& client, HeartbeatLoopOptions options,
                std::function<void()> on_round_over);
  ~HeartbeatLoop();
  HeartbeatLoop(const HeartbeatLoop&) = delete;
  HeartbeatLoop& operator=(const HeartbeatLoop&) = delete;

 private:
  void Run();
  // One heartbeat: on the stream when there is one (opened here, reopened
  // after a failure once its backoff passed), else unary; nullopt when it
  // would be unary and `unary_allowed` is false (nothing was sent).
  std::optional<absl::StatusOr<v1::HeartbeatResponse>> Beat(
      const v1::HeartbeatRequest& request, bool unary_allowed);
  // Re-registers the node's round with a server that lost it.
  ResumeAnswer Resume();
  // Logs what `step` says happened; `response` is the heartbeat's answer.
  void Log(const HeartbeatPolicy::Step& step,
           const absl::StatusOr<v1::HeartbeatResponse>& response) const;

  RendezvousApi& client_;
  HeartbeatLoopOptions options_;
  std::function<void()> on_round_over_;
  // What wakes the loop between heartbeats: the destructor, or a push of
  // the stream (declared before it, which calls in until it is destroyed).
  absl::Mutex wake_mu_;
  bool stopping_ ABSL_GUARDED_BY(wake_mu_) = false;
  std::optional<v1::HeartbeatResponse> pushed_ ABSL_GUARDED_BY(wake_mu_);
  // The loop's decisions and the stream it holds (the loop's thread only).
  HeartbeatPolicy policy_;
  std::unique_ptr<HeartbeatStream> stream_;
  std::thread thread_;
};

}  // namespace ddprun::launcher
