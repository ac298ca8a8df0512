#pragma once

#include <string>
#include <vector>

#include "absl/time/time.h"
#include "common/metrics.h"
#include "ddprun/v1/rendezvous.pb.h"

namespace ddprun::launcher {

// What the agent exports about its workers on /metrics (--metrics-port):
// the round and restart count it runs in, how many of its workers run, when
// each last reported progress, and its workers' failures by cause.
// Updated by the agent's thread; read by the metrics server's thread (the
// registry's metrics are atomic).
class AgentMetrics {
 public:
  explicit AgentMetrics(common::MetricsRegistry& registry);

  void RoundStarted(const v1::Assignment& assignment, int num_workers);
  // A worker reported progress.
  void Progress(int local_rank, absl::Time now);
  // Once per supervision pass: progress ages and workers still running.
  void Update(int workers_running, absl::Time now);
  // Counted under the cause's word (exited, signaled, hung, spawn).
  void WorkerFailed(v1::FailureCause cause);
  void RoundEnded();

 private:
  common::GaugeFamily& round_;
  common::GaugeFamily& restart_count_;
  common::GaugeFamily& workers_running_;
  common::GaugeFamily& progress_age_;
  common::CounterFamily& failures_;
  common::CounterFamily& rounds_;
  // Per local rank: the last progress report of the current round, or
  // InfinitePast when none came yet (no age is exported then).
  std::vector<absl::Time> last_progress_;
};

}  // namespace ddprun::launcher
