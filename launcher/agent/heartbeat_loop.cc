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
    if (!response.ok() &&
        response.status().code() == absl::StatusCode::kNotFound) {
      // The server does not know the job: it restarted.
      switch (Resume()) {
        case Resumed::kYes:
          last_heard = sent;
          failures_in_a_row = 0;
          continue;
        case Resumed::kRoundOver:
          on_round_over_();
          return;
        case Resumed::kRetry:
          break;
      }
    }
    if (!response.ok()) {
      // Logged once per outage, not once per interval.
      if (failures_in_a_row++ == 0) {
        spdlog::warn("{}", std::string(response.status().message()));
      }
      if (absl::Now() - last_heard >= options_.timeout) {
        spdlog::error(
            "no heartbeat reached rendezvous {} for {} (heartbeat_timeout): "
            "the server drops this node from round {}",
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
    if (response->resume()) {
      if (Resume() == Resumed::kRoundOver) {
        on_round_over_();
        return;
      }
      continue;
    }
    // A job that succeeded elsewhere does not stop workers still running
    // here; they finish and Leave.
    if (response->rejoin() || response->state() == v1::JOB_STATE_FAILED) {
      spdlog::info("round {} is over (job round now {})",
                   options_.round, response->round());
      on_round_over_();
      return;
    }
  }
}

HeartbeatLoop::Resumed HeartbeatLoop::Resume() {
  if (!options_.resume.has_value()) return Resumed::kRetry;
  absl::StatusOr<v1::ResumeResponse> resumed = client_.Resume(*options_.resume);
  if (!resumed.ok()) {
    spdlog::warn("{}", std::string(resumed.status().message()));
    // A server older than Resume cannot take the round back.
    return resumed.status().code() == absl::StatusCode::kUnimplemented
               ? Resumed::kRoundOver
               : Resumed::kRetry;
  }
  if (resumed->has_assignment() &&
      resumed->assignment().round() == options_.round) {
    spdlog::info(
        "rendezvous {} restarted; it took round {} back from this node's "
        "record (restart count {}): the workers go on",
        client_.endpoint(), options_.round,
        resumed->assignment().restart_count());
    return Resumed::kYes;
  }
  if (resumed->has_ended() &&
      resumed->ended().state() == v1::JOB_STATE_SUCCEEDED) {
    return Resumed::kYes;  // workers still running here finish and Leave
  }
  spdlog::info("rendezvous {} restarted and round {} cannot go on: {}",
               client_.endpoint(), options_.round,
               resumed->has_ended() ? resumed->ended().message()
                                    : resumed->rejoin());
  return Resumed::kRoundOver;
}

}  // namespace ddprun::launcher
