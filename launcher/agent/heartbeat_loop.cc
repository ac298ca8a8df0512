#include "launcher/agent/heartbeat_loop.h"

#include <algorithm>

#include "absl/time/clock.h"
#include "spdlog/spdlog.h"

namespace ddprun::launcher {

HeartbeatLoop::HeartbeatLoop(RendezvousApi& client,
                             HeartbeatLoopOptions options,
                             std::function<void()> on_round_over)
    : client_(client),
      options_(std::move(options)),
      on_round_over_(std::move(on_round_over)),
      // The round's Join counts as a heartbeat the server heard.
      policy_({.timeout = options_.timeout,
               .stream = options_.stream,
               .figures_interval = options_.figures_interval},
              absl::Now()),
      thread_([this] { Run(); }) {}

HeartbeatLoop::~HeartbeatLoop() {
  {
    absl::MutexLock lock(&wake_mu_);
    stopping_ = true;
  }
  thread_.join();
}

void HeartbeatLoop::Run() {
  v1::HeartbeatRequest request;
  request.set_run_id(options_.run_id);
  request.set_node_id(options_.node_id);
  request.set_round(options_.round);
  // On a stream, the first beat goes at once: it tells the server this
  // node's round, and from then on the server pushes that round's end the
  // moment it comes (a round change often ends the round just formed, in
  // its first interval). Unary heartbeats start an interval after the Join,
  // which counts as one; so does the first beat when the stream cannot be
  // had (one more unary beat per round from every node the server holds no
  // stream for would load the largest jobs at each round change).
  absl::Time next_beat =
      options_.stream ? absl::Now() : absl::Now() + options_.interval;
  bool first = true;
  while (true) {
    std::optional<v1::HeartbeatResponse> pushed;
    {
      absl::MutexLock lock(&wake_mu_);
      auto woken = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(wake_mu_) {
        return stopping_ || pushed_.has_value();
      };
      wake_mu_.AwaitWithDeadline(absl::Condition(&woken), next_beat);
      if (stopping_) return;
      pushed.swap(pushed_);
    }
    if (pushed.has_value()) {
      // The server's word that the round ended, the moment it did.
      const HeartbeatPolicy::Step step = policy_.OnPush(*pushed);
      if (step.next == HeartbeatPolicy::Next::kRoundOver) {
        Log(step, *pushed);
        on_round_over_();
        return;
      }
      continue;  // the heartbeats go on at their interval
    }
    absl::Time sent = absl::Now();
    next_beat = sent + options_.interval;
    std::vector<v1::RankFigures> figures;
    if (options_.figures) figures = options_.figures();
    const bool with_figures = policy_.FiguresDue(figures, sent);
    request.clear_ranks();
    if (options_.progress) {
      const HeartbeatLoopOptions::Progress progress = options_.progress();
      request.set_steps(progress.steps);
      request.set_steps_age_ms(
          std::max<int64_t>(0, absl::ToInt64Milliseconds(progress.steps_age)));
      request.set_sync(progress.sync);
      request.set_sync_age_ms(
          std::max<int64_t>(0, absl::ToInt64Milliseconds(progress.sync_age)));
    }
    if (with_figures) {
      for (const v1::RankFigures& f : figures) *request.add_ranks() = f;
    }
    std::optional<absl::StatusOr<v1::HeartbeatResponse>> sent_beat =
        Beat(request, /*unary_allowed=*/!first);
    first = false;
    if (!sent_beat.has_value()) continue;
    absl::StatusOr<v1::HeartbeatResponse>& response = *sent_beat;
    if (with_figures && response.ok()) {
      policy_.FiguresDelivered(figures, sent);
    }
    if (response.ok() && options_.on_round_progress &&
        (response->round_steps() > 0 || response->round_sync() > 0)) {
      options_.on_round_progress(
          {response->round_steps(),
           absl::Milliseconds(response->round_steps_age_ms()),
           response->round_sync(),
           absl::Milliseconds(response->round_sync_age_ms())});
    }
    if (response.ok() && options_.on_stragglers &&
        !response->straggler_local_ranks().empty()) {
      options_.on_stragglers(
          std::vector<int>(response->straggler_local_ranks().begin(),
                           response->straggler_local_ranks().end()));
    }
    HeartbeatPolicy::Step step = policy_.OnAnswer(response, sent, absl::Now());
    Log(step, response);
    if (step.next == HeartbeatPolicy::Next::kResume) {
      step = policy_.OnResumed(Resume(), absl::Now());
      Log(step, response);
    }
    if (step.next != HeartbeatPolicy::Next::kBeatAgain) {
      on_round_over_();
      return;
    }
  }
}

void HeartbeatLoop::Log(
    const HeartbeatPolicy::Step& step,
    const absl::StatusOr<v1::HeartbeatResponse>& response) const {
  // Once per outage, not once per interval.
  if (step.outage_started) {
    spdlog::warn("{}", std::string(response.status().message()));
  }
  if (step.outage_ended) {
    spdlog::info("heartbeat to rendezvous {} works again", client_.endpoint());
  }
  switch (step.next) {
    case HeartbeatPolicy::Next::kTimedOut:
      spdlog::error(
          "no heartbeat reached rendezvous {} for {} (heartbeat_timeout): "
          "the server drops this node from round {}",
          client_.endpoint(), absl::FormatDuration(step.unheard_for),
          options_.round);
      break;
    case HeartbeatPolicy::Next::kRoundOver:
      spdlog::info("round {} is over (job round now {})", options_.round,
                   response->round());
      break;
    case HeartbeatPolicy::Next::kBeatAgain:
    case HeartbeatPolicy::Next::kResume:
    case HeartbeatPolicy::Next::kNotResumed:  // Resume said why
      break;
  }
}

std::optional<absl::StatusOr<v1::HeartbeatResponse>> HeartbeatLoop::Beat(
    const v1::HeartbeatRequest& request, bool unary_allowed) {
  auto unary = [&]() -> std::optional<absl::StatusOr<v1::HeartbeatResponse>> {
    if (!unary_allowed) return std::nullopt;
    return client_.Heartbeat(request);
  };
  if (stream_ == nullptr && policy_.ShouldOpenStream(absl::Now())) {
    absl::StatusOr<std::unique_ptr<HeartbeatStream>> opened =
        client_.OpenHeartbeatStream([this](const v1::HeartbeatResponse& r) {
          absl::MutexLock lock(&wake_mu_);
          pushed_ = r;
        });
    if (opened.ok()) {
      stream_ = *std::move(opened);
    } else {
      policy_.OnStreamOpenFailed(opened.status().code(), absl::Now());
    }
  }
  if (stream_ == nullptr) return unary();
  absl::StatusOr<v1::HeartbeatResponse> response = stream_->Beat(request);
  const absl::StatusCode code = response.status().code();
  switch (policy_.OnStreamBeat(code, absl::Now())) {
    case HeartbeatPolicy::StreamNext::kKeep:
      return response;
    case HeartbeatPolicy::StreamNext::kAnswer:
    case HeartbeatPolicy::StreamNext::kAnswerLater:
      stream_.reset();
      return response;
    case HeartbeatPolicy::StreamNext::kUnaryForRound:
      stream_.reset();
      if (code == absl::StatusCode::kUnimplemented) {
        spdlog::info(
            "rendezvous {} has no heartbeat stream (an older server): unary "
            "heartbeats for round {}",
            client_.endpoint(), options_.round);
      } else {
        spdlog::info(
            "rendezvous {} holds as many heartbeat streams as it takes: unary "
            "heartbeats for round {}",
            client_.endpoint(), options_.round);
      }
      return unary();
    case HeartbeatPolicy::StreamNext::kUnaryNow:
      stream_.reset();
      spdlog::debug("heartbeat stream failed ({}); reopened after a backoff",
                    std::string(response.status().message()));
      return unary();
  }
  return response;
}

ResumeAnswer HeartbeatLoop::Resume() {
  if (!options_.resume.has_value()) return ResumeAnswer::kNotSent;
  absl::StatusOr<v1::ResumeResponse> resumed = client_.Resume(*options_.resume);
  const ResumeAnswer answer = ReadResumeAnswer(resumed, options_.round, [this] {
    return options_.forming && options_.forming();
  });
  switch (answer) {
    case ResumeAnswer::kNoResume:
    case ResumeAnswer::kFailed:
      spdlog::warn("{}", std::string(resumed.status().message()));
      break;
    case ResumeAnswer::kFormingLost:
      spdlog::info(
          "rendezvous {} restarted while round {} formed here: the keys its "
          "workers exchanged are lost with it, so the round forms again",
          client_.endpoint(), options_.round);
      break;
    case ResumeAnswer::kTookBack:
      spdlog::info(
          "rendezvous {} restarted; it took round {} back from this node's "
          "record (restart count {}): the workers go on",
          client_.endpoint(), options_.round,
          resumed->assignment().restart_count());
      break;
    case ResumeAnswer::kCannotGoOn:
      spdlog::info("rendezvous {} restarted and round {} cannot go on: {}",
                   client_.endpoint(), options_.round,
                   resumed->has_ended() ? resumed->ended().message()
                                        : resumed->rejoin());
      break;
    case ResumeAnswer::kJobSucceeded:  // workers here finish and Leave
    case ResumeAnswer::kNotSent:
      break;
  }
  return answer;
}

}  // namespace ddprun::launcher
