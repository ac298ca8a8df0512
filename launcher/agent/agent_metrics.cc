#include "launcher/agent/agent_metrics.h"

#include <string>

#include "common/rendezvous_words.h"

namespace ddprun::launcher {

AgentMetrics::AgentMetrics(common::MetricsRegistry& registry)
    : round_(
          registry.AddGauge("ddprun_agent_round",
                            "the rendezvous round this node's workers run in")),
      restart_count_(registry.AddGauge(
          "ddprun_agent_restart_count",
          "restarts of the job so far (TORCHELASTIC_RESTART_COUNT)")),
      workers_running_(registry.AddGauge("ddprun_agent_workers_running",
                                         "this node's workers still running")),
      progress_age_(registry.AddGauge(
          "ddprun_agent_worker_last_progress_age_seconds",
          "seconds since the worker last reported progress (workers that "
          "report through libddp only)",
          {"local_rank"})),
      failures_(registry.AddCounter("ddprun_agent_worker_failures_total",
                                    "this node's worker failures by cause",
                                    {"cause"})),
      rounds_(
          registry.AddCounter("ddprun_agent_rounds_total",
                              "rounds this node's workers were started in")) {
  round_.WithLabels({}).Set(-1);
}

void AgentMetrics::RoundStarted(const v1::Assignment& assignment,
                                int num_workers) {
  round_.WithLabels({}).Set(static_cast<double>(assignment.round()));
  restart_count_.WithLabels({}).Set(assignment.restart_count());
  workers_running_.WithLabels({}).Set(num_workers);
  rounds_.WithLabels({}).Increment();
  progress_age_.Clear();
  last_progress_.assign(num_workers, absl::InfinitePast());
}

void AgentMetrics::Progress(int local_rank, absl::Time now) {
  if (local_rank >= 0 && local_rank < static_cast<int>(last_progress_.size())) {
    last_progress_[local_rank] = now;
  }
}

void AgentMetrics::Update(int workers_running, absl::Time now) {
  workers_running_.WithLabels({}).Set(workers_running);
  for (size_t i = 0; i < last_progress_.size(); ++i) {
    if (last_progress_[i] == absl::InfinitePast()) continue;
    progress_age_.WithLabels({std::to_string(i)})
        .Set(absl::ToDoubleSeconds(now - last_progress_[i]));
  }
}

void AgentMetrics::WorkerFailed(v1::FailureCause cause) {
  failures_.WithLabels({common::FailureCauseWord(cause)}).Increment();
}

void AgentMetrics::RoundEnded() {
  workers_running_.WithLabels({}).Set(0);
  progress_age_.Clear();
  last_progress_.clear();
}

}  // namespace ddprun::launcher
