#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/clock.h"
#include "ddprun/v1/rendezvous.pb.h"
#include "launcher/agent/agent_events.h"
#include "launcher/agent/agent_metrics.h"
#include "launcher/cli/launch_options.h"
#include "launcher/posix/process_control.h"
#include "launcher/posix/progress_channel.h"
#include "launcher/agent/rendezvous_client.h"
#include "launcher/agent/standby_pool.h"
#include "launcher/agent/supervisor_policy.h"
#include "launcher/agent/worker_env.h"
#include "launcher/posix/worker_group.h"

namespace ddprun::launcher {

// What the agent needs beyond the options, prepared by RunLaunch.
struct AgentContext {
  std::string store_endpoint;  // the rendezvous server workers talk to
  std::string local_addr;      // this node's address for its peers
  std::string node_id;
  // Passed on to the workers for their store calls.
  StoreCredentials credentials;
  std::string scratch_dir;  // per-attempt error files when no --log-dir
  std::vector<std::string> worker_argv;
  std::vector<std::string> base_env;  // the agent's environment
  // --prewarm: the command of a standby worker; empty: no prewarming.
  std::vector<std::string> standby_argv;
  // Whether global rank 0 of a prewarmed round listens on MASTER_PORT (a
  // Python program: torch's env:// TCPStore), so that the other ranks are
  // activated once it does. libddp programs use the rendezvous store.
  bool rank0_listens_on_master_port = false;
  // --metrics-port: what /metrics shows of this node's workers; null: off.
  AgentMetrics* metrics = nullptr;
};

// The node agent: joins a round, runs the local workers of the round,
// supervises them, reports failures, re-joins, and ends with the job.
// Everything runs on the thread that calls Run (it forks the workers, so it
// must live as long as they do); the heartbeat and signal threads only post
// AgentEvents.
class Agent {
 public:
  Agent(const LaunchOptions& options, AgentContext context,
        RendezvousClient& client, ProcessControl& control, AgentEvents& events,
        const common::Clock& clock);

  // Runs the job to its end; returns ddprun's exit code: 0 when this node's
  // workers all succeeded, 1 when the job failed (after printing the
  // summary) or the rendezvous could not be used, 128+signal when stopped by
  // a signal.
  int Run();

 private:
  enum class RoundEnd { kSucceeded, kRejoin, kStopped };

  v1::JoinRequest MakeJoinRequest(int master_port) const;
  // Starts the round's workers, supervises them until the round ends for
  // this node, and leaves no worker running.
  RoundEnd RunRound(const v1::Assignment& assignment);
  // Hands the round's environments to the prewarmed workers; global rank 0
  // first. Appends their progress channels to `progress`.
  absl::StatusOr<std::vector<pid_t>> ActivateStandbys(
      const v1::Assignment& assignment,
      const std::vector<SpawnRequest>& requests,
      std::vector<ProgressChannel>& progress);
  RoundEnd Supervise(const v1::Assignment& assignment, WorkerGroup& group,
                     std::vector<ProgressChannel>& progress,
                     const std::vector<std::string>& error_files);
  void ReportFailures(const v1::Assignment& assignment,
                      const std::vector<LocalFailure>& failures,
                      const std::vector<std::string>& error_files,
                      const std::string& spawn_error);
  void Leave(long round, v1::LeaveRequest::Reason reason);
  std::string AttemptDir(int restart_count) const;

  const LaunchOptions& options_;
  AgentContext context_;
  RendezvousClient& client_;
  ProcessControl& control_;
  AgentEvents& events_;
  const common::Clock& clock_;
  std::unique_ptr<StandbyPool> standbys_;  // null without --prewarm
};

}  // namespace ddprun::launcher
