#pragma once

#include <cstdint>

namespace ddprun::rendezvous {

// A round's heartbeat interval and timeout.
struct HeartbeatTiming {
  int64_t interval_ms = 0;
  int64_t timeout_ms = 0;
};

// The heartbeat interval and timeout of a round of `nodes` nodes, from the
// job's configured ones: every node beats once per interval, so n nodes
// send n / interval heartbeats per second. When that is over `budget_per_s`
// the interval grows to n / budget and the timeout in proportion (rounded
// up), so that a large job neither floods the server nor has live nodes
// declared lost because their heartbeats queued. A budget or interval of 0
// or less: the configured ones.
HeartbeatTiming ScaleHeartbeats(int64_t interval_ms, int64_t timeout_ms,
                                int64_t nodes, int64_t budget_per_s);

// How often each node of a round of `nodes` nodes sends its ranks' figures
// (the straggler figures ride on a heartbeat): `interval_ms`, or longer when
// `nodes` figures messages per interval would pass `budget_per_s`, so that
// the figures of a large job cost the server a bounded share of a core
// (each message is a few hundred bytes through gRPC). A budget or interval
// of 0 or less: `interval_ms`.
int64_t ScaleFiguresInterval(int64_t interval_ms, int64_t nodes,
                             int64_t budget_per_s);

}  // namespace ddprun::rendezvous
