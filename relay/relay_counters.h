#pragma once

#include "common/metrics.h"

namespace ddprun::relay {

// What the relay did, as Prometheus counters (tests assert on them that the
// batching ran). Registered in the registry given; thread-safe.
struct RelayCounters {
  explicit RelayCounters(common::MetricsRegistry& registry);

  // Single Joins received from callers, and the upstream Join calls that
  // carried them (batches, and the nodes an old server made us resend).
  common::Counter& joins;
  common::Counter& upstream_join_calls;
  // Heartbeats received (each node of each message, unary or streamed),
  // and the upstream Heartbeats messages that carried them.
  common::Counter& beats;
  common::Counter& upstream_beat_messages;
  // Calls passed through unchanged (everything else, batched Joins too).
  common::Counter& passthrough_calls;
  // Leaves the relay sent for callers that went away after their batch
  // was sent and were then assigned.
  common::Counter& leaves_for_cancelled;
};

}  // namespace ddprun::relay
