#pragma once

#include <array>
#include <map>
#include <optional>
#include <set>
#include <utility>

#include "absl/time/time.h"
#include "common/progress_record.h"

namespace ddprun::launcher {

// How long a worker may stay in each phase of its life (common/
// progress_record.h) before it is hung, as nvidia-resiliency-ext computes
// its section timeouts: a multiple of the longest time the phase was seen
// to take in this job, never below the phase's floor, unless a flag fixes
// the bound (--hang-bound PHASE=SECONDS; --worker-timeout fixes every phase
// after the first record).
struct PhaseBoundsOptions {
  // The bound is `factor` times the longest observed duration of the phase.
  double factor = 5.0;
  // Lower limits, by common::Phase. The floors are what a phase may take
  // before anything was observed, so they are generous where one instance
  // can legitimately be slow (a cold start of 8 LibTorch processes on two
  // cores, a first step that warms caches, a checkpoint or an evaluation of
  // a large model); a step's floor is what an unannounced pause between two
  // steps (a log flush, an evaluation the program does not report as
  // Phase::kEval) may take before the rank counts as hung.
  std::array<absl::Duration, common::kNumPhases> floor = {
      absl::Seconds(120),  // start
      absl::Seconds(120),  // join
      absl::Seconds(120),  // sync
      absl::Seconds(120),  // first step
      absl::Seconds(10),   // step
      absl::Seconds(600),  // checkpoint
      absl::Seconds(120),  // stop
      absl::Seconds(600),  // eval
  };
  // Once a phase was seen `learn_after` times, its floor is the learned
  // floor instead: what the job showed carries the bound (a multiple of the
  // longest), and a hang in a phase that took a second 3 times is found in
  // half a minute, not two.
  int learn_after = 3;
  std::array<absl::Duration, common::kNumPhases> learned_floor = {
      absl::Seconds(30),  // start
      absl::Seconds(30),  // join
      absl::Seconds(30),  // sync
      absl::Seconds(30),  // first step
      absl::Seconds(10),  // step
      absl::Seconds(30),  // checkpoint
      absl::Seconds(30),  // stop
      absl::Seconds(30),  // eval
  };
  // Fixed bounds by phase (flags); InfiniteDuration: never hung there.
  std::array<std::optional<absl::Duration>, common::kNumPhases> fixed;
  // A worker stopped (state T: SIGSTOP, SIGTSTP) this long is hung, in any
  // phase and whether or not it reports; InfiniteDuration: never. A process
  // held by a debugger (state t) is not stopped in this sense. Zero, the
  // default: hung at the agent's first look. Nothing stops a healthy worker
  // (it leads its own process group, so a terminal's Ctrl-Z stops only
  // ddprun), and state T lasts until someone sends SIGCONT, so there is no
  // passing stop to wait out. The agent adopts every worker, so the stop
  // wakes it (SIGCHLD, CLD_STOPPED) and that first look comes at once;
  // waiting one monitor interval more cost every hang 0.1 s of a 0.5 s goal.
  absl::Duration stopped = absl::ZeroDuration();
  // A worker that sleeps without using any CPU while a local peer waits
  // for it is blocked: a deadlock, a read that never returns. The peer
  // waits when it recorded a later step (it computed that step and waits
  // in its gradient sync), or when it began the round's join and the
  // worker, a survivor, has not taken the round. Blocked, it is hung after
  // this floor, or `factor` x the most compute time a step took when that
  // is longer; a fixed value (--hang-bound blocked=SECONDS,
  // --worker-timeout) instead. InfiniteDuration: never. Compute time is
  // what libddp's step records say (ObserveStepCompute): the rank's own
  // time from its last sync to its next, data loading included, not its
  // waits for peers nor the agent's delay in reading the record. The time
  // between two records has both: one step that waited 4 s for a cut-off
  // node, or read by an agent stopped for 2 s, made every later deadlock
  // wait 10-20 s (the soak's worker-block after an agent-pause).
  absl::Duration blocked_floor = absl::Seconds(1);
  std::optional<absl::Duration> blocked_fixed;
  // A blocked worker that is also quiet (it moved no bytes, /proc/PID/io,
  // since it went idle, and has no child process) is hung after this floor
  // instead, or `factor` x the figure its blocked bound takes when that is
  // longer (PhaseBounds::QuietBound). Nothing it could wait for is under way
  // in it (a read, a write, a program it runs), and a rank that computes
  // is not asleep: a busy machine leaves it runnable (state R), a page
  // fault in disk sleep (D). A deadlock costs half a second less.
  absl::Duration quiet_floor = absl::Milliseconds(500);
  // A worker in an evaluation or a checkpoint write it reported (Phase::
  // kEval, kCheckpoint) is blocked the same way when a peer already did the
  // step after it and waits for it there: hung after the blocked floor, or
  // `factor` x the longest that phase took on the same global rank when
  // that is longer. The rank's own: only the rank that writes or evaluates
  // (rank 0, most often) takes long there, and a write to a socket (a
  // checkpoint uploaded to a store) sleeps without using CPU. Before that
  // rank was seen in the phase in this job, its floor is this one, as long
  // as an unreported pause between two steps may take (the step's floor),
  // unless the worker is quiet there (PhaseBounds::QuietBound).
  absl::Duration blocked_unseen_floor = absl::Seconds(10);
  // A worker that uses CPU while a local peer waits for it (as above)
  // spins: a loop that never ends. It is hung once it used this much CPU
  // time since the peer began to wait, or `factor` x the most CPU time a
  // step took when that is more; a fixed value (--hang-bound spin=SECONDS)
  // instead; InfiniteDuration: never (--worker-timeout sets that: its
  // bound is wall time, which a spin on several threads outruns).
  // Counted in CPU time, not wall time, a rank slowed by a busy machine or
  // a CPU quota (a straggler) is not taken for a spin: it uses no more CPU
  // per step than before. Only for programs that report the work they do
  // between steps (an evaluation, a checkpoint: worker/phase.h), since work
  // of one rank alone that is not reported (an evaluation on rank 0) looks
  // the same from outside; for others, the step's bound (10 s at least).
  // In an evaluation or a checkpoint write it reported, while a peer that
  // did the step after it waits for it, the figure is instead the most CPU
  // time that phase took on the same global rank (ObservePhaseCpu): the
  // rank that evaluates or writes uses seconds of CPU where the others use
  // none. Before that rank was seen to end the phase, a spin there is
  // bounded by the phase's bound only: a first evaluation of a large model
  // may take minutes of CPU.
  absl::Duration spin_floor = absl::Seconds(1);
  std::optional<absl::Duration> spin_fixed;
  // How long a worker whose round could not form (worker::
  // ReportRoundFailed: a peer it could not reach) waits for the next one
  // before its agent ends the round by replacing it. When a peer was lost,
  // the server hears it well within a second (its heartbeat stream ends,
  // its orphan guard reports) and the next heartbeat brings the next round;
  // when none comes, nobody else will end the round (a network cut while
  // it formed: its peers wait in the join for its bound, twice over).
  absl::Duration round_failed = absl::Seconds(3);
};

// Learns phase durations and answers each phase's bound. Owned by the
// agent's thread for the whole job, so that what one round observed bounds
// the next.
class PhaseBounds {
 public:
  explicit PhaseBounds(PhaseBoundsOptions options = {});

  // The worker of global rank `rank` spent `duration` in `phase` (it left
  // the phase, or reported again within it).
  void Observe(common::Phase phase, absl::Duration duration, int rank = -1);
  // The bound of `phase`: fixed, or max(floor, factor x longest observed),
  // the floor being the learned one once the phase was seen often enough.
  // Until steps were seen `learn_after` times, the first step stands for
  // them too: it is the one step observed, and a large model on a loaded
  // machine takes seconds a step (in CI, a rank of a 100 MB model whose 2
  // cores another job's 8 ranks shared was found hung in a step at the 10 s
  // floor).
  absl::Duration Bound(common::Phase phase) const;
  absl::Duration stopped_bound() const { return options_.stopped; }
  // How long the worker of global rank `rank` may stay blocked in `phase`
  // behind its waiting peers (PhaseBoundsOptions::blocked_floor): in a step
  // or the round's join by the costliest step's compute, in an evaluation or a
  // checkpoint write by that rank's longest there
  // (PhaseBoundsOptions::blocked_unseen_floor before it was seen there).
  absl::Duration BlockedBound(common::Phase phase, int rank = -1) const;
  // How long the worker of global rank `rank` may stay quiet in `phase`
  // behind its waiting peers: blocked (asleep, no CPU used), with nothing
  // read or written and no child process to wait for
  // (PhaseBoundsOptions::quiet_floor), or `factor` x the figure of
  // BlockedBound. In an evaluation or a checkpoint write before the rank was
  // seen there, the figure is the longest any rank took there: none of what
  // the unseen floor waits out (an upload, a copy by another program) is
  // under way. InfiniteDuration with a fixed blocked bound, and there once
  // the rank was found quiet there: the next time waits the unseen floor,
  // since a wait the looks cannot see (a store's reply after the last byte)
  // would otherwise cost every attempt.
  absl::Duration QuietBound(common::Phase phase, int rank) const;
  // Whether `phase` is learned by rank (an evaluation, a checkpoint write)
  // and the worker of global rank `rank` was not seen to end it yet.
  bool FirstTimeThere(common::Phase phase, int rank) const;
  // The worker of global rank `rank` was found hung by QuietBound.
  void ObserveFoundQuiet(common::Phase phase, int rank);
  absl::Duration round_failed_bound() const { return options_.round_failed; }
  // A step took `cpu` of CPU time (all of the worker's threads).
  void ObserveStepCpu(absl::Duration cpu);
  // A step's record said it computed for `compute` (ProgressRecord::
  // compute_seconds): its own time, without its wait for peers.
  void ObserveStepCompute(absl::Duration compute);
  // The worker of global rank `rank` used `cpu` of CPU time in `phase` (an
  // evaluation or a checkpoint write, the step that ends it included).
  void ObservePhaseCpu(common::Phase phase, absl::Duration cpu, int rank);
  // How much CPU time a worker may use while its waiting peers wait for it
  // (PhaseBoundsOptions::spin_floor): in a step or the round's join, by the
  // costliest step; in an evaluation or a checkpoint write, by the most that
  // phase took on global rank `rank` (InfiniteDuration before it was seen
  // there, unless fixed).
  absl::Duration SpinBound() const;
  absl::Duration SpinBound(common::Phase phase, int rank) const;
  // The longest observed duration of `phase` (zero when none was).
  absl::Duration longest(common::Phase phase) const {
    return longest_[static_cast<int>(phase)];
  }

 private:
  PhaseBoundsOptions options_;
  std::array<absl::Duration, common::kNumPhases> longest_{};
  std::array<int, common::kNumPhases> seen_{};
  // By global rank: the longest evaluation and checkpoint phase seen there.
  std::map<std::pair<int, common::Phase>, absl::Duration> rank_longest_;
  // By global rank: the most CPU time an evaluation and a checkpoint phase
  // took there.
  std::map<std::pair<int, common::Phase>, absl::Duration> rank_most_cpu_;
  // Ranks and phases where ObserveFoundQuiet was called.
  std::set<std::pair<int, common::Phase>> found_quiet_;
  absl::Duration longest_step_cpu_;
  absl::Duration longest_step_compute_;
};

}  // namespace ddprun::launcher
