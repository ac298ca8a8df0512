#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <thread>

#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
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
};

// Heartbeats the rendezvous for one round on a thread of its own, so that a
// slow server never delays supervision. Calls `on_round_over` (once) when the
// server says the node's round is over (rejoin, or the job ended), or when no
// heartbeat has reached the server for `timeout` (a host cut off from the
// network learns so, instead of waiting on its peers forever). A failed
// heartbeat is logged and retried at the next interval. The destructor stops
// the thread.
class HeartbeatLoop {
 public:
  HeartbeatLoop(RendezvousApi& client, HeartbeatLoopOptions options,
                std::function<void()> on_round_over);
  ~HeartbeatLoop();
  HeartbeatLoop(const HeartbeatLoop&) = delete;
  HeartbeatLoop& operator=(const HeartbeatLoop&) = delete;

 private:
  void Run();

  RendezvousApi& client_;
  HeartbeatLoopOptions options_;
  std::function<void()> on_round_over_;
  absl::Notification stop_;
  std::thread thread_;
};

}  // namespace ddprun::launcher
