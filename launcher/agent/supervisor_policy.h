#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "common/clock.h"
#include "common/progress_record.h"
#include "ddprun/v1/rendezvous.pb.h"
#include "launcher/agent/phase_bounds.h"
#include "launcher/posix/exit_status.h"
#include "launcher/posix/process_state.h"

namespace ddprun::launcher {

// A failed worker of this node, as the agent reports it.
struct LocalFailure {
  int local_rank = 0;
  ExitStatus exit;  // meaningless when cause is FAILURE_CAUSE_HUNG
  v1::FailureCause cause = v1::FAILURE_CAUSE_UNSPECIFIED;  // exited,
                                                           // signaled, hung
  absl::Time time;
  // For a hang: the phase it was in, and how long it had been silent there
  // (or stopped) when it was found.
  common::Phase phase = common::Phase::kStart;
  absl::Duration silent;
  bool stopped = false;  // for a hang: found stopped (state T)
  // For a hang: found blocked (asleep, no CPU used) while a local peer
  // waited for it; `silent` is then how long it was blocked.
  bool blocked = false;
  // Blocked, found by PhaseBounds::QuietBound: also without I/O or a child
  // process; `first_time`: in an evaluation or a checkpoint write before
  // its rank was seen to end one.
  bool quiet = false;
  bool first_time = false;
  // For a hang: found spinning (using CPU without a step done) while a
  // local peer waited for it; `silent` is how long it was waited for, `cpu`
  // the CPU time it used meanwhile.
  bool spinning = false;
  absl::Duration cpu;
  // For a hang: it said its round could not form (worker::
  // ReportRoundFailed) and no next round came; `silent` is since when.
  bool gave_up_round = false;
  // Blocked or spinning: the local rank that waited; -1: a rank of another
  // node (SupervisorPolicy::OnRoundSteps).
  int waited_by = -1;
};

struct SupervisorPolicyOptions {
  int num_workers = 1;
  // The global rank of local rank 0 this round: PhaseBounds learns what
  // evaluations and checkpoint writes take by rank (BlockedBound).
  int first_rank = 0;
  // By local rank: whether that rank's program reports on its progress
  // pipe (its worker did in an earlier round of this job): then a worker
  // that reports nothing within the start-up bound is hung too. Otherwise a
  // worker is watched for silence only from its first record, so that
  // programs that never report (a Python script without the ddprun module,
  // or whose only rank 0 calls it) are never hung by silence. A stopped
  // worker is hung either way. Missing entries: not expected.
  std::vector<bool> expect_reports;
  // Which local ranks already declared in-place recovery (a previous round
  // of the same processes); missing entries: not declared.
  std::vector<bool> in_place;
  // Which local ranks carry on from the previous round in place (they were
  // just sent this round): they start in the join phase and are expected
  // to report. Missing entries: started afresh.
  std::vector<bool> survivors;
  // The program's step records carry compute figures: libddp writes them,
  // when a step's compute is done and before its sync. Seen in an earlier
  // round of the job (a round's first records carry none); this round's
  // records teach it too. Only then can a worker be blocked
  // (OnProcessState).
  bool figured_steps = false;
  // The program reports the work it does between steps: an evaluation or a
  // checkpoint write (Phase::kEval, Phase::kCheckpoint). Seen in an earlier
  // round of the job; this round's records teach it too: the program's
  // declaration (worker::DeclareReportsBetweenSteps), or its first such
  // phase. Only then can a worker be found spinning (OnProcessState).
  bool reports_between_steps = false;
  // The round has ranks on other nodes. They wait in the round's join for
  // every survivor here to take it, so a survivor that has not, blocked or
  // spinning, is hung even with no local peer in the join (a node's only
  // rank).
  bool multi_node = false;
};

// How the agent answers a failure of its own workers, or a new round that
// another node caused (no local failure).
struct RecoveryDecision {
  // Keep the surviving workers: send them the next round's environment
  // (DDPRUN_CONTROL_FD) instead of stopping them. Otherwise every worker
  // is stopped and the next round starts them afresh (torchrun's way).
  bool in_place = false;
  std::vector<int> replace;  // local ranks to start anew (ascending)
  std::vector<int> kill;     // of those, the ones still running (hung)
};

// Decides, from what was observed of one round's local workers, whether the
// group still runs, succeeded or failed. Pure: no processes, no sockets; time
// comes from the injected clock. Used by one thread (the agent's).
class SupervisorPolicy {
 public:
  enum class Verdict { kRunning, kSucceeded, kFailed };

  // `bounds` (the agent's, for the whole job) learns from what this round
  // observes and bounds each phase; it must outlive the policy.
  SupervisorPolicy(SupervisorPolicyOptions options, PhaseBounds& bounds,
                   const common::Clock& clock);

  void OnExit(int local_rank, ExitStatus status);
  // One record from the worker's progress pipe: a sign of life, and maybe
  // a new phase.
  void OnRecord(int local_rank, const common::ProgressRecord& record);
  // The worker said it recovers in place (libddp: worker/recovery.h).
  void OnInPlaceDeclared(int local_rank);
  // What the agent saw of the process at its last look: stopped (state T)
  // or not. Stopped past the stopped bound, it is hung; while some hung
  // workers are stopped, the others that went silent with them are waiting
  // for them, not hung themselves (DecideRecovery).
  //
  // A worker that sleeps at every look without using CPU, in its step
  // phase, while a local peer that reports the same way recorded a later
  // step (it waits in its gradient sync for this one), is blocked: hung
  // past PhaseBounds::BlockedBound(). Only libddp's step records count
  // here (they carry a compute figure): they are written when the step's
  // compute is done, before its sync, which is what makes "a later step"
  // mean "waits for me".
  //
  // The same holds in an evaluation or a checkpoint write the program
  // reported, before its next step record: a peer that recorded a later
  // step did its step after that phase and waits for it. It is blocked
  // past PhaseBounds::BlockedBound() of that phase on its rank, which
  // learns from the rank's own such phases (a write to a socket sleeps).
  // And in the state sync, outside its collectives (the last one it entered
  // completed), when a local peer entered more of the sync's collectives
  // (libddp's records) or finished it: every rank makes the same ones, so
  // that peer waits for this one (HeldInSync).
  //
  // One that uses CPU instead, while a local peer waits for it (in a step,
  // the round's join, an evaluation or a checkpoint write), spins: it is
  // hung once it used PhaseBounds::SpinBound() of CPU time since the peer
  // began to wait, when the program reports its work between steps
  // (SupervisorPolicyOptions::reports_between_steps). What a step costs in
  // CPU is learned here too, from the looks at which the step count moved,
  // and what an evaluation or a checkpoint write costs its rank, from the
  // looks around it.
  void OnProcessState(int local_rank, const ProcessState& state);
  // The same, knowing only whether it is stopped (never blocked then).
  void OnProcessState(int local_rank, bool stopped) {
    OnProcessState(local_rank, ProcessState{.state = stopped ? 'T' : 'R'});
  }
  // The server names the worker a persistent straggler and the agent
  // replaces stragglers (--straggler-policy replace): it is a failure
  // (FAILURE_CAUSE_STRAGGLER), killed and replaced as a hung one is.
  void OnStraggler(int local_rank);
  // The most steps any rank of the round completed, as the server last
  // answered (HeartbeatResponse.round_steps), and since when the first rank
  // there has been (round_steps_age_ms; the answer's time from older
  // servers). A local rank one step behind it is waited for by a rank of
  // another node, as by a local peer a step ahead, from then: it can be
  // blocked or spinning (OnProcessState) with no local peer, as a node's
  // only rank is.
  void OnRoundSteps(int64_t steps, absl::Time since);
  // The furthest any rank of the round got through the round's state sync,
  // as the server last answered (HeartbeatResponse.round_sync: collectives
  // of the sync entered, one more for leaving it), and since when the first
  // rank there has been. A local rank in the sync that entered fewer of its
  // collectives, outside them, is waited for by that rank (HeldInSync), as
  // by a local peer past it: a node's only rank has none.
  void OnRoundSync(int64_t sync, absl::Time since);

  // Also turns a worker silent past its phase's bound, or stopped past the
  // stopped bound, into a "hung" failure.
  Verdict Evaluate();

  // Oldest first: [0] is the root cause.
  const std::vector<LocalFailure>& failures() const { return failures_; }
  // The earliest time at which a running worker could become hung; nullopt
  // when none can (so the agent knows how long it may sleep).
  std::optional<absl::Time> NextHangDeadline() const;
  // The phase a local rank is in now.
  common::Phase phase(int local_rank) const {
    return workers_[local_rank].phase;
  }
  // How long the agent may sleep before it looks again: `monitor_interval`,
  // or less when a worker could become hung sooner (never negative).
  absl::Duration WaitBefore(absl::Duration monitor_interval) const;

  // In place only when every local worker declared it (or, not yet, is
  // replaced: a replacement lost in its start-up) and none has ended well
  // (a worker that finished cannot take a new round): then the failed
  // ones (after Evaluate said kFailed; none for another node's failure) are
  // replaced and the hung ones among them killed first. A hang replaces only
  // the stopped workers when there are any (the rest wait for them in a
  // collective), else every hung one.
  RecoveryDecision DecideRecovery() const;
  // After kFailed in a round of `num_nodes`: true while every failure is a
  // hang of a worker that is neither stopped nor waited for by a peer
  // (then it is the cause) and has been hung for less than
  // its phase's bound once more. Silent together with nothing stopped or
  // exited here, they most likely wait for a stopped or dead peer on
  // another node, whose agent reports it (a rejoin); killing them as hung
  // would race that report.
  bool AwaitsRemoteCause(int num_nodes) const;
  // By local rank, for the next round of the same processes.
  std::vector<bool> in_place_declared() const;
  // SupervisorPolicyOptions::figured_steps, or learned since.
  bool figured_steps() const { return figured_steps_; }
  // SupervisorPolicyOptions::reports_between_steps, or learned since.
  bool reports_between_steps() const { return reports_between_steps_; }
  // True while a running worker that reports may be exchanging keys
  // through the round's store: it is starting, joining the round, or
  // syncing state. Programs that never report are not counted (they show
  // no phase; under ddprun they use the store only at start-up).
  bool Forming() const;

 private:
  struct Worker {
    int rank = 0;  // global
    std::optional<ExitStatus> exit;
    common::Phase phase = common::Phase::kStart;
    absl::Time last_record;  // or when the phase began, before any record
    bool reports = false;    // watched for silence
    bool hung = false;
    bool in_place = false;
    bool stopped = false;  // at the agent's last look
    std::optional<absl::Time> stopped_since;
    absl::Duration hung_bound;  // the bound it was found hung past
    // A step was recorded since the program entered a phase between steps
    // (an evaluation, a checkpoint): the next one ends it (OnRecord).
    bool stepped_in_phase = false;
    // Step records since it began stepping in this round (its "phase
    // step"), and when the last one came.
    int steps = 0;
    absl::Time last_step;
    // A survivor of the last round (SupervisorPolicyOptions::survivors);
    // when its first record of this round came (a survivor: it took the
    // round), and its first phase record (it began the round's join).
    bool survivor = false;
    std::optional<absl::Time> first_record;
    std::optional<absl::Time> first_phase;
    // When it said its round could not form (it waits for the next).
    std::optional<absl::Time> gave_up;
    // The collectives of its state sync it entered (ProgressRecord::Kind::
    // kCollective; each phase record starts the count again), and when the
    // last one came; those that completed (kCollectiveDone); when it left
    // the round's sync for its next phase.
    int collectives = 0;
    absl::Time last_collective;
    int collectives_done = 0;
    std::optional<absl::Time> left_sync;
    // CPU time at the last look, and since when the looks saw it asleep
    // without using CPU (nullopt: it ran, or was not asleep, at the last),
    // with its CPU time then.
    std::optional<absl::Duration> cpu;
    std::optional<absl::Time> idle_since;
    absl::Duration cpu_at_idle;
    // Since when the looks saw it idle with no child process and no I/O
    // (ProcessState::io as it was then), as PhaseBounds::QuietBound asks.
    std::optional<absl::Time> quiet_since;
    uint64_t io_at_quiet = 0;
    absl::Time last_look;
    // The wait of a local peer for it (HeldBy) seen at the last look: when
    // it began, and the worker's CPU time at the first look after that.
    std::optional<absl::Time> held_since;
    absl::Duration cpu_at_held;
    // Its CPU time at the looks of the last few seconds, oldest first: a
    // wait learned late (another node's, from the server's answer) counts
    // the CPU used since the first look after it began.
    struct Look {
      absl::Time time;
      absl::Duration cpu;
    };
    std::deque<Look> looks;
    // Its step count and CPU time at the last look at which the count
    // moved while it stepped (-1: none since it began stepping), so that
    // the next such look tells what a step costs in CPU.
    int steps_at_look = -1;
    absl::Duration cpu_at_steps;
    // In an evaluation or a checkpoint write: its CPU time at the last look
    // before the phase began (nullopt: none was taken). Ended such phases,
    // with that figure, whose CPU the next look tells (SetPhase).
    std::optional<absl::Duration> cpu_before_phase;
    struct PhaseCpu {
      common::Phase phase;
      absl::Duration cpu_before;
    };
    std::vector<PhaseCpu> ended_phases;
  };

  // Moves `w` to phase `next`, and counts what an evaluation or a
  // checkpoint write it leaves cost in CPU (PhaseBounds::ObservePhaseCpu).
  void SetPhase(Worker& w, common::Phase next);

  // When `w` becomes hung if nothing changes; nullopt: it cannot.
  std::optional<absl::Time> HangDeadline(const Worker& w) const;
  // From when `w`'s silence counts against its phase's bound.
  absl::Time SilentSince(const Worker& w) const;
  // A local peer a step ahead of `w`: it waits for `w` in its sync
  // (libddp's records only: figured_steps_); nullopt: none.
  std::optional<int> WaitingPeer(const Worker& w) const;
  struct Held {
    absl::Time since;
    int waited_by = -1;  // local rank; -1: a rank of another node
  };
  // A rank a step ahead of `w`, local (WaitingPeer) or of another node
  // (round_steps_), and since when it is: it waits for `w`; nullopt: none.
  std::optional<Held> AheadPeer(const Worker& w) const;
  // A local peer a step behind `w`: `w` waits for it; nullopt: none.
  std::optional<int> AwaitedPeer(const Worker& w) const;
  // For a survivor that has not taken this round (no record yet): a local
  // peer, survivor or replacement, that has begun the round's join and
  // waits for it there; nullopt: none.
  std::optional<int> JoinedPeer(const Worker& w) const;
  // Since when a peer waits in the round's join for `w`, a survivor that has
  // not taken the round: a local one (JoinedPeer), or those of other nodes
  // (multi_node: since the round was sent to it); nullopt: none.
  std::optional<Held> JoinWaiter(const Worker& w) const;
  // The phase whose bound `w`'s silence counts against: its own, or the
  // step's once it is past an evaluation or a checkpoint with a peer ahead.
  common::Phase BoundPhase(const Worker& w) const;
  // Since when a peer waits for `w` (a step ahead, or a local one in the
  // round's join), and that peer; nullopt: none does.
  std::optional<Held> HeldBy(const Worker& w) const;
  // In an evaluation or a checkpoint write that `w` reported, with no step
  // recorded since: since when a peer a step ahead waits for it; nullopt:
  // none does, or `w` is elsewhere.
  std::optional<Held> HeldBetweenSteps(const Worker& w) const;
  // In the round's state sync, outside its collectives (the last one `w`
  // entered completed): since when a local peer waits for `w` there, having
  // entered more of the sync's collectives than `w` (it is past the one `w`
  // has yet to enter) or finished the sync (it waits in its first step's
  // gradient sync), or a rank of another node did (round_sync_); nullopt:
  // none does, or `w` is elsewhere. Inside a
  // collective `w` may itself wait for a rank elsewhere (a broadcast relayed
  // through a deadlocked rank completes on some ranks only). Blocked only:
  // receiving a large model uses CPU.
  std::optional<Held> HeldInSync(const Worker& w) const;
  // HeldBy, HeldBetweenSteps or HeldInSync, from when `w` was also blocked
  // (asleep without using CPU); nullopt: it is not (OnProcessState).
  std::optional<Held> BlockedSince(const Worker& w) const;
  // How long `w` may stay blocked where it is (PhaseBounds::BlockedBound).
  absl::Duration BlockedBound(const Worker& w) const;
  // BlockedSince, from when `w` was also quiet (no I/O, no child process);
  // nullopt: it is not.
  std::optional<Held> QuietSince(const Worker& w) const;
  // How long `w` may stay quiet where it is (PhaseBounds::QuietBound).
  absl::Duration QuietBound(const Worker& w) const;
  // HeldBy, or HeldBetweenSteps: since when a peer waits for `w` while it
  // may spin (in a step, the round's join, an evaluation or a checkpoint
  // write); nullopt: none does.
  std::optional<Held> SpinHeld(const Worker& w) const;
  // How much CPU time `w` may use where it is while a peer waits for it
  // (PhaseBounds::SpinBound).
  absl::Duration SpinBound(const Worker& w) const;
  // The CPU time `w` used while a peer waited for it (SpinHeld, since the
  // first look after the wait began); nullopt: none waits, or spins are not
  // watched (reports_between_steps_).
  std::optional<absl::Duration> SpunCpu(const Worker& w) const;
  // SpunCpu once it reached PhaseBounds::SpinBound(): `w` spins; nullopt:
  // it does not (yet).
  std::optional<absl::Duration> SpunPastBound(const Worker& w) const;
  void MarkHung(int local_rank, absl::Time now);

  SupervisorPolicyOptions options_;
  PhaseBounds& bounds_;
  const common::Clock& clock_;
  std::vector<Worker> workers_;
  std::vector<LocalFailure> failures_;
  bool figured_steps_ = false;
  bool reports_between_steps_ = false;
  // OnRoundSteps: the round's most steps, and since when a rank has been
  // there.
  int64_t round_steps_ = 0;
  absl::Time round_steps_since_;
  // OnRoundSync: the round's furthest in the state sync, and since when a
  // rank has been there.
  int64_t round_sync_ = 0;
  absl::Time round_sync_since_;
};

}  // namespace ddprun::launcher
