#include "relay/relay_counters.h"

namespace ddprun::relay {
namespace {

common::Counter& Add(common::MetricsRegistry& registry, const char* name,
                     const char* help) {
  return registry.AddCounter(name, help).WithLabels({});
}

}  // namespace

RelayCounters::RelayCounters(common::MetricsRegistry& registry)
    : joins(Add(registry, "ddprun_relay_joins_total",
                "single Joins received from agents")),
      upstream_join_calls(
          Add(registry, "ddprun_relay_upstream_join_calls_total",
              "Join calls sent to the rendezvous server for them")),
      beats(Add(registry, "ddprun_relay_beats_total",
                "node heartbeats received from agents")),
      upstream_beat_messages(
          Add(registry, "ddprun_relay_upstream_beat_messages_total",
              "heartbeat messages sent to the rendezvous server for them")),
      passthrough_calls(Add(registry, "ddprun_relay_passthrough_calls_total",
                            "calls passed to the rendezvous server unchanged")),
      leaves_for_cancelled(
          Add(registry, "ddprun_relay_leaves_for_cancelled_total",
              "Leaves sent for callers that went away and were then "
              "assigned")) {}

}  // namespace ddprun::relay
