#include "launcher/agent/heartbeat_loop.h"

#include "absl/time/clock.h"
#include "spdlog/spdlog.h"

namespace ddprun::launcher {

HeartbeatLoop::HeartbeatLoop(RendezvousApi& client,
                             HeartbeatLoopOptions options,
                             std::function<void()> on_round_over)
    : client_(client),
      options_(std::move(options)),
      on_round_over_(std::move(on_round_over)),
      thread_([this] { Run(); }) {}

HeartbeatLoop::~HeartbeatLoop() {
  stop_.Notify();
  thread_.join();
}

void HeartbeatLoop::Run() {
  v1::HeartbeatRequest request;
  request.set_run_id(options_.run_id);
  request.set_node_id(options_.node_id);
  request.set_round(options_.round);
  int failures_in_a_row = 0;
  // The server heard from this node no earlier than the sending of its last
  // answered heartbeat; the round's Join counts as one.
  absl::Time last_heard = absl::Now();
  while (!stop_.WaitForNotificationWithTimeout(options_.interval)) {
    absl::Time sent = absl::Now();
    absl::StatusOr<v1::HeartbeatResponse> response = client_.Heartbeat(request);
    if (!response.ok()) {
      // Logged once per outage, not once per interval.
      if (failures_in_a_row++ == 0) {
        spdlog::warn("{}", std::string(response.status().message()));
      }
      if (absl::Now() - last_heard >= options_.timeout) {
        spdlog::error(
            "no heartbeat reached rendezvous {} for {} (heartbeat_timeout): "
            "the server drops this node from round {}; stopping workers",
            client_.endpoint(), absl::FormatDuration(absl::Now() - last_heard),
            options_.round);
        on_round_over_();
        return;
      }
      continue;
    }
    last_heard = sent;
    if (failures_in_a_row > 0) {
      spdlog::info("heartbeat to rendezvous {} works again",
                   client_.endpoint());
    }
    failures_in_a_row = 0;
    // A job that succeeded elsewhere does not stop workers still running
    // here; they finish and Leave.
    if (response->rejoin() || response->state() == v1::JOB_STATE_FAILED) {
      spdlog::info("round {} is over (job round now {}); stopping workers",
                   options_.round, response->round());
      on_round_over_();
      return;
    }
  }
}

}  // namespace ddprun::launcher
