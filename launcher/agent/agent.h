#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "ddprun/v1/rendezvous.pb.h"
#include "launcher/agent/agent_context.h"
#include "launcher/agent/agent_events.h"
#include "launcher/agent/agent_metrics.h"
#include "launcher/agent/agent_options.h"
#include "launcher/agent/heartbeat_loop.h"
#include "launcher/agent/phase_bounds.h"
#include "launcher/agent/rank_figures.h"
#include "launcher/agent/rendezvous_api.h"
#include "launcher/agent/round_plan.h"
#include "launcher/agent/standby_pool.h"
#include "launcher/agent/supervisor_policy.h"
#include "launcher/posix/control_channel.h"
#include "launcher/posix/local_address.h"
#include "launcher/posix/process_control.h"
#include "launcher/posix/progress_channel.h"
#include "launcher/posix/worker_group.h"
#include "launcher/posix/worker_output.h"

namespace ddprun::launcher {

// The agent's exit status when the rendezvous could not be reached within
// --rdzv-conf read_timeout (sysexits' EX_TEMPFAIL): a supervisor (systemd's
// RestartForceExitStatus=, a Kubernetes pod failure policy) can tell "start
// me again later" from a job that failed (1).
inline constexpr int kExitRendezvousUnreachable = 75;

// The node agent's round lifecycle: join -> plan -> start -> supervise ->
// report -> stop or rejoin -> leave, until the job ends for this node.
// It talks to the rendezvous through RendezvousApi and to the operating
// system through ProcessControl; its round decisions take time from the
// injected clock and it waits in AgentEvents::Wait, so tests drive every
// transition with fakes (tests/launcher/agent_lifecycle_test.cc), as
// job_test.cc drives Job. (A Join parked on the server, and the retries of
// an unreachable one, wait on the wall clock inside RendezvousApi.)
//
// Everything runs on the thread that calls Run (it forks the workers, so it
// must live as long as they do); the heartbeat and signal threads only post
// AgentEvents.
class Agent {
 public:
  Agent(AgentOptions options, AgentContext context, RendezvousApi& client,
        ProcessControl& control, AgentEvents& events,
        const common::Clock& clock);

  // Runs the job to its end; returns ddprun's exit code: 0 when this node's
  // workers all succeeded, 1 when the job failed (after printing the
  // summary) or the rendezvous could not be used, 128+signal when stopped by
  // a signal.
  int Run();

 private:
  // kInPlace: the workers keep running into the next round (in-place
  // recovery); kEnded: the job ended while rejoining.
  enum class RoundEnd { kSucceeded, kRejoin, kStopped, kInPlace, kEnded };
  // How a round ended for this node: what its caller acts on.
  struct RoundOutcome {
    RoundEnd end = RoundEnd::kRejoin;
    // kInPlace: the local ranks to start anew in the next round (none when
    // the round ended elsewhere).
    std::vector<int> replace = {};
    // kEnded: ddprun's exit code.
    int exit_code = 1;
  };
  // A Join's outcome: this node's next round, or the exit code to end with.
  struct Joined {
    std::optional<v1::Assignment> assignment;
    int exit_code = 0;
    // The survivors an in-place Join waited with all ended with success
    // meanwhile: they finished the job in the round just left.
    bool workers_succeeded = false;
  };
  // What Supervise watches of one round.
  struct RunningRound {
    const v1::Assignment& assignment;
    const RoundPlan& plan;
    WorkerGroup& group;  // the workers, their pipes and what they declared
    // By local rank: carried on from the previous round in place (empty: a
    // fresh round).
    std::vector<bool> survivors = {};
  };

  // Joins the round after `last_round`. With `survivors` (the in-place
  // workers waiting for that round), the Join ends when every one of them
  // has ended with success (WorkersAllSucceeded, asked before the Join and
  // whenever a child changes state): their old round's training is done,
  // and nothing would form the next round if the other nodes finished too.
  Joined JoinNextRound(int64_t last_round, WorkerGroup* survivors = nullptr);
  // Reaps `group` into early_exits_; whether every local rank has ended
  // with success. Runs on the agent's thread, inside the Join.
  bool WorkersAllSucceeded(WorkerGroup& group);
  v1::JoinRequest MakeJoinRequest(int master_port) const;
  // Starts the round's workers, supervises them until the round ends for
  // this node, and leaves no worker running. Rounds that the same workers
  // continue into (in-place recovery) run inside it; `assignment` is then
  // the last of them.
  RoundOutcome RunRound(v1::Assignment& assignment);
  // The plan with the prewarmed workers' pipes, or with fresh ones (in new
  // slots of `group`).
  RoundPlan PlanRound(const v1::Assignment& assignment, bool use_standbys,
                      WorkerGroup& group) const;
  void PrepareAttemptDir(const RoundPlan& plan) const;
  // Starts (or activates) the workers of `plan` into `group`. A failed
  // activation falls back to starting them afresh; `plan` is then
  // replanned. Sets `used_standbys`.
  absl::Status StartWorkers(const v1::Assignment& assignment,
                            const WorkerOutput& output, RoundPlan& plan,
                            WorkerGroup& group, bool& used_standbys);
  // Hands the round's environments to the prewarmed workers, global rank 0
  // first; returns their slots.
  absl::StatusOr<std::vector<WorkerSlot>> ActivateStandbys(
      const v1::Assignment& assignment,
      const std::vector<SpawnRequest>& requests);
  HeartbeatLoopOptions HeartbeatOptions(const v1::Assignment& assignment) const;
  // Watches the round's workers and the events until the round ends for
  // this node.
  RoundOutcome Supervise(const RunningRound& round);
  // The agent got a stop signal: forwards it and stops the workers.
  RoundOutcome StopOnSignal(const RunningRound& round, int sig);
  // Acts on the policy's verdict: nothing while the workers run, or how the
  // round ends.
  std::optional<RoundOutcome> OnVerdict(const RunningRound& round,
                                        SupervisorPolicy& policy);
  // The server says the round is over (another node failed or joined):
  // the workers go on in place, or are stopped.
  RoundOutcome OnRoundOverElsewhere(const RunningRound& round,
                                    const SupervisorPolicy& policy);
  // Reaps, drains progress and looks at which workers are stopped; tells
  // the policy and the metrics.
  void Observe(const RunningRound& round, SupervisorPolicy& policy,
               RankFigures& figures, int& exited);
  // Hands the node's zygote seed (StandbyPool::PlantSeed) to the worker
  // `request` starts, where the default prewarming wants one.
  void PlantZygoteSeed(SpawnRequest& request);
  RoundOutcome OnWorkersFailed(const RunningRound& round,
                               const SupervisorPolicy& policy);
  // In-place recovery (libddp programs, worker/recovery.h). The policy
  // decided to keep the survivors: report the failures, kill the hung.
  RoundOutcome OnWorkersFailedInPlace(const RunningRound& round,
                                      const SupervisorPolicy& policy,
                                      const RecoveryDecision& decision);
  // Joins the next round with the survivors still running, sends them its
  // environment on their control pipes, starts the local ranks `replace`
  // names (from a standby when one waits) and supervises the round.
  RoundOutcome ContinueInPlace(v1::Assignment& assignment, RoundPlan& plan,
                               WorkerGroup& group, const WorkerOutput& output,
                               const std::vector<int>& replace);
  // The next round's plan: the survivors keep their pipes, standbys bring
  // theirs, workers started afresh get new ones (in their slots of
  // `group`).
  RoundPlan PlanInPlaceRound(const v1::Assignment& assignment,
                             const InPlaceSources& sources, WorkerGroup& group);
  // Writes each survivor's new environment on its control pipe.
  void SendRoundToSurvivors(const RoundPlan& plan,
                            const InPlaceSources& sources, WorkerGroup& group);
  // Starts local rank `local_rank` of `round` from a standby or afresh.
  absl::Status ReplaceWorker(const RunningRound& round, int local_rank,
                             const InPlaceSources& sources);
  void ReportFailures(const v1::Assignment& assignment,
                      const std::vector<LocalFailure>& failures,
                      const std::vector<std::string>& error_files,
                      const std::string& spawn_error);
  // Tells the server this node leaves `round`. A server that answers
  // NOT_FOUND restarted and has not relearned the job yet (its agents
  // re-register within a heartbeat interval): the node re-registers at once
  // (Resume with its record, as its heartbeats do) and leaves again, so that
  // the new server records the node's end instead of waiting for it.
  absl::Status Leave(int64_t round, v1::LeaveRequest::Reason reason);
  // This node's workers all succeeded: the server must hear it, or a round
  // it rebuilds after a restart (Resume) waits for this node and then ends,
  // restarting the others' workers. A Leave that fails (the server is down)
  // is sent again, each time after a Resume with this node's record (a
  // restarted server then knows the node and its round first), until one
  // is answered, for up to --rdzv-conf close_timeout.
  void LeaveSucceeded(int64_t round);
  // The record a restarted server learns this node's job from: its last
  // assignment and the restart count it last heard.
  void Remember(const v1::Assignment& assignment);
  void RememberReport(
      const absl::StatusOr<v1::ReportFailureResponse>& response);
  // The Resume request for the remembered round (HeartbeatLoop sends it).
  v1::JoinRequest MakeResumeRequest() const;

  const AgentOptions options_;
  AgentContext context_;
  RendezvousApi& client_;
  ProcessControl& control_;
  AgentEvents& events_;
  const common::Clock& clock_;
  std::unique_ptr<StandbyPool> standbys_;  // null where nothing is prewarmed
  // Exits reaped while joining (WorkersAllSucceeded), which the next look
  // at the workers (Observe) takes first.
  std::vector<std::pair<int, ExitStatus>> early_exits_;
  // The MASTER_PORT this node offered in its last Join, held from the Join
  // until its workers start (see HeldPort); empty with a reserve_port seam.
  std::optional<HeldPort> held_master_port_;
  std::optional<v1::RoundRecord> record_;  // none before the first round
  // Hang bounds by phase, learned over the whole job; and, by local rank,
  // whether its program reports on its progress pipe (then its next worker
  // must).
  PhaseBounds phase_bounds_;
  std::vector<bool> workers_report_;
  // Whether a worker of this node declared in-place recovery. Every later
  // worker runs the same program with the same arguments, so it is taken
  // to recover in place from its start: a round that ends while a
  // replacement still loads keeps it and its survivors (it reads the next
  // round on its control pipe once it runs) instead of restarting the
  // node's workers.
  bool program_recovers_in_place_ = false;
  // Whether the program's step records carry compute figures (libddp's),
  // for the rounds after the one that showed it
  // (SupervisorPolicyOptions::figured_steps).
  bool program_figures_steps_ = false;
  // Whether the program reports its evaluations and checkpoints, likewise
  // (SupervisorPolicyOptions::reports_between_steps).
  bool program_reports_between_steps_ = false;
};

}  // namespace ddprun::launcher
