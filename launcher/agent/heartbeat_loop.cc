#include "launcher/agent/heartbeat_loop.h"

#include "absl/time/clock.h"
#include "spdlog/spdlog.h"

namespace ddprun::launcher {
namespace {

// How soon a failed heartbeat stream is opened again: 0.1 s, growing to
// 10 s while it keeps failing (unary heartbeats go meanwhile).
common::BackoffOptions StreamReopenBackoff() {
  common::BackoffOptions options;
  options.initial = absl::Milliseconds(100);
  options.max = absl::Seconds(10);
  return options;
}

}  // namespace

HeartbeatLoop::HeartbeatLoop(RendezvousApi& client,
                             HeartbeatLoopOptions options,
                             std::function<void()> on_round_over)
    : client_(client),
      options_(std::move(options)),
      on_round_over_(std::move(on_round_over)),
      use_stream_(options_.stream),
      reopen_backoff_(StreamReopenBackoff()),
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
    if (options_.figures) {
      request.clear_ranks();
      for (v1::RankFigures& f : options_.figures()) {
        *request.add_ranks() = std::move(f);
      }
    }
    absl::StatusOr<v1::HeartbeatResponse> response = Beat(request);
    if (response.ok() && options_.on_stragglers &&
        !response->straggler_local_ranks().empty()) {
      options_.on_stragglers(
          std::vector<int>(response->straggler_local_ranks().begin(),
                           response->straggler_local_ranks().end()));
    }
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
      spdlog::info("round {} is over (job round now {})", options_.round,
                   response->round());
      on_round_over_();
      return;
    }
  }
}

absl::StatusOr<v1::HeartbeatResponse> HeartbeatLoop::Beat(
    const v1::HeartbeatRequest& request) {
  if (use_stream_ && stream_ == nullptr && absl::Now() >= reopen_at_) {
    absl::StatusOr<std::unique_ptr<HeartbeatStream>> opened =
        client_.OpenHeartbeatStream();
    if (opened.ok()) {
      stream_ = *std::move(opened);
    } else if (opened.status().code() == absl::StatusCode::kUnimplemented) {
      use_stream_ = false;
    } else {
      reopen_at_ = absl::Now() + reopen_backoff_.Next();
    }
  }
  if (stream_ != nullptr) {
    absl::StatusOr<v1::HeartbeatResponse> response = stream_->Beat(request);
    if (response.ok()) {
      reopen_backoff_.Reset();
      return response;
    }
    stream_.reset();
    switch (response.status().code()) {
      case absl::StatusCode::kUnimplemented:
        spdlog::info(
            "rendezvous {} has no heartbeat stream (an older server): unary "
            "heartbeats for round {}",
            client_.endpoint(), options_.round);
        use_stream_ = false;
        break;
      case absl::StatusCode::kResourceExhausted:
        spdlog::info(
            "rendezvous {} holds as many heartbeat streams as it takes: unary "
            "heartbeats for round {}",
            client_.endpoint(), options_.round);
        use_stream_ = false;
        break;
      case absl::StatusCode::kNotFound:
      case absl::StatusCode::kInvalidArgument:
      case absl::StatusCode::kPermissionDenied:
      case absl::StatusCode::kUnauthenticated:
      case absl::StatusCode::kFailedPrecondition:
        // The server's own answer to this heartbeat, as a unary call would
        // get it (NOT_FOUND: it restarted). The next beat opens a new
        // stream.
        return response;
      case absl::StatusCode::kDeadlineExceeded:
        // No answer within rpc_timeout: a unary call now would wait as
        // long again (a frozen or cut-off server) and delay the loop's
        // timeout; the stream is reopened after a backoff.
        reopen_at_ = absl::Now() + reopen_backoff_.Next();
        return response;
      default:
        // A broken stream (UNAVAILABLE: the connection dropped, the server
        // restarted, ...): reopened after a backoff; a unary heartbeat goes
        // now, so that a stream's trouble alone never costs the node its
        // round.
        reopen_at_ = absl::Now() + reopen_backoff_.Next();
        spdlog::debug("heartbeat stream failed ({}); reopened after a backoff",
                      std::string(response.status().message()));
        break;
    }
  }
  return client_.Heartbeat(request);
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
    if (options_.forming && options_.forming()) {
      spdlog::info(
          "rendezvous {} restarted while round {} formed here: the keys its "
          "workers exchanged are lost with it, so the round forms again",
          client_.endpoint(), options_.round);
      return Resumed::kRoundOver;
    }
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
  spdlog::info(
      "rendezvous {} restarted and round {} cannot go on: {}",
      client_.endpoint(), options_.round,
      resumed->has_ended() ? resumed->ended().message() : resumed->rejoin());
  return Resumed::kRoundOver;
}

}  // namespace ddprun::launcher
