#include "launcher/agent/supervisor_policy.h"

#include <algorithm>

namespace ddprun::launcher {

using common::Phase;
using common::ProgressRecord;

namespace {

// How far back a worker's looks are kept (Worker::looks): longer than a
// heartbeat answer may come after the wait it tells of began.
constexpr absl::Duration kLooksKept = absl::Seconds(5);
// What a worker asleep for good may still be charged while it stays idle
// (OnProcessState): a deadlocked rank's other threads (Gloo's, gRPC's) wake
// now and then, and /proc counts CPU in ticks of 10 ms, so one such wake
// can add a whole tick. Taken as work, one tick 0.8 s into a deadlock
// started its blocked bound again (found after 1.9 s, not 1.1 s, in the
// fault harness: seed 43). A rank at work uses its core; one that waits
// on threads of its own that read or decode uses more than this.
constexpr absl::Duration kStrayCpu = absl::Milliseconds(10);
constexpr double kStrayCpuShare = 0.01;

// The work a program reports between two steps: an evaluation, a
// checkpoint write (worker/phase.h).
bool BetweenSteps(Phase phase) {
  return phase == Phase::kEval || phase == Phase::kCheckpoint;
}

}  // namespace

SupervisorPolicy::SupervisorPolicy(SupervisorPolicyOptions options,
                                   PhaseBounds& bounds,
                                   const common::Clock& clock)
    : options_(std::move(options)),
      bounds_(bounds),
      clock_(clock),
      workers_(options_.num_workers),
      figured_steps_(options_.figured_steps),
      reports_between_steps_(options_.reports_between_steps) {
  const absl::Time now = clock_.Now();
  for (int i = 0; i < static_cast<int>(workers_.size()); ++i) {
    Worker& w = workers_[i];
    w.rank = options_.first_rank + i;
    w.last_record = now;
    w.reports = i < static_cast<int>(options_.expect_reports.size()) &&
                options_.expect_reports[i];
    if (i < static_cast<int>(options_.in_place.size())) {
      w.in_place = options_.in_place[i];
    }
    if (i < static_cast<int>(options_.survivors.size()) &&
        options_.survivors[i]) {
      // It learns the round from its control pipe and forms a new group.
      w.phase = Phase::kJoin;
      w.reports = true;
      w.survivor = true;
    }
  }
}

void SupervisorPolicy::OnExit(int local_rank, ExitStatus status) {
  if (local_rank < 0 || local_rank >= static_cast<int>(workers_.size())) return;
  Worker& worker = workers_[local_rank];
  if (worker.exit) return;
  worker.exit = status;
  // A worker already declared hung was killed by us; its exit is not news.
  if (!status.success() && !worker.hung) {
    failures_.push_back({local_rank, status,
                         status.signal != 0 ? v1::FAILURE_CAUSE_SIGNALED
                                            : v1::FAILURE_CAUSE_EXITED,
                         clock_.Now()});
  }
}

void SupervisorPolicy::OnRecord(int local_rank, const ProgressRecord& record) {
  if (local_rank < 0 || local_rank >= static_cast<int>(workers_.size())) return;
  Worker& w = workers_[local_rank];
  if (w.exit || w.hung) return;
  const absl::Time now = clock_.Now();
  // What the phase took so far teaches its bound; a record within the
  // stepping phases is the end of one step.
  bounds_.Observe(w.phase, now - w.last_record, w.rank);
  w.last_record = now;
  w.reports = true;
  if (!w.first_record) w.first_record = now;
  switch (record.kind) {
    case ProgressRecord::Kind::kPhase:
      if (!w.first_phase) w.first_phase = now;
      w.gave_up.reset();
      reports_between_steps_ |= BetweenSteps(record.phase);
      if (w.phase == Phase::kSync && record.phase != Phase::kSync) {
        w.left_sync = now;
      }
      w.collectives = 0;
      w.collectives_done = 0;
      // Entering the stepping phase: no step is done yet.
      SetPhase(w,
               record.phase == Phase::kStep ? Phase::kFirstStep : record.phase);
      w.stepped_in_phase = false;
      // Steps count from the round's start of stepping, which every rank
      // reports (libddp's DataParallel): a survivor's step records of the
      // round before, read at this one's start, must not put it ahead.
      if (record.phase == Phase::kJoin || record.phase == Phase::kSync ||
          record.phase == Phase::kStep) {
        w.steps = 0;
      }
      break;
    case ProgressRecord::Kind::kStep:
      ++w.steps;
      w.last_step = now;
      figured_steps_ |= record.compute_seconds.has_value();
      // A step's own compute bounds a blocked rank (not the first after an
      // evaluation or a checkpoint: that one's figure has the pause in it).
      if (record.compute_seconds.has_value() && w.phase == Phase::kStep) {
        bounds_.ObserveStepCompute(absl::Seconds(*record.compute_seconds));
      }
      // An evaluation or a checkpoint write ends with the next step done,
      // and the first step record after it does not say that: libddp
      // writes a step's record once its compute is done, before the
      // gradient sync, where the ranks that report it wait for rank 0 still
      // evaluating or writing. Taken as the phase's end, it left them
      // bounded as a step through rank 0's whole evaluation, and they were
      // found hung. The second record ends it (a rank hung in that one step
      // is bounded as the phase, not as a step).
      if (BetweenSteps(w.phase) && !w.stepped_in_phase) {
        w.stepped_in_phase = true;
        break;
      }
      SetPhase(w, Phase::kStep);
      w.stepped_in_phase = false;
      break;
    case ProgressRecord::Kind::kInPlace:
      w.in_place = true;
      break;
    case ProgressRecord::Kind::kReportsBetweenSteps:
      reports_between_steps_ = true;
      break;
    case ProgressRecord::Kind::kRoundFailed:
      if (!w.gave_up) w.gave_up = now;
      break;
    case ProgressRecord::Kind::kCollective:
      ++w.collectives;
      w.last_collective = now;
      break;
    case ProgressRecord::Kind::kCollectiveDone:
      ++w.collectives_done;
      break;
    case ProgressRecord::Kind::kOther:
      break;
  }
}

void SupervisorPolicy::SetPhase(Worker& w, Phase next) {
  // What an evaluation or a checkpoint write costs its rank in CPU
  // (PhaseBounds::SpinBound): from the last look before it began to the
  // first after it ended, a little more than the phase itself (the step
  // that ends it is in it), which only widens the bound. Not from its
  // records: libddp's phase records carry no CPU figure.
  if (next != w.phase) {
    if (BetweenSteps(w.phase) && w.cpu_before_phase) {
      w.ended_phases.push_back({w.phase, *w.cpu_before_phase});
    }
    w.cpu_before_phase.reset();
    if (BetweenSteps(next)) w.cpu_before_phase = w.cpu;
  }
  w.phase = next;
}

void SupervisorPolicy::OnInPlaceDeclared(int local_rank) {
  if (local_rank < 0 || local_rank >= static_cast<int>(workers_.size())) return;
  workers_[local_rank].in_place = true;
}

void SupervisorPolicy::OnProcessState(int local_rank,
                                      const ProcessState& state) {
  if (local_rank < 0 || local_rank >= static_cast<int>(workers_.size())) return;
  Worker& w = workers_[local_rank];
  if (w.exit) return;
  const absl::Time now = clock_.Now();
  w.stopped = state.stopped();
  if (!w.stopped) {
    w.stopped_since.reset();
  } else if (!w.stopped_since) {
    w.stopped_since = now;
  }
  // Idle: asleep at this look, with the CPU time of the last one. From
  // this look on, not the last: it may have run until just before this.
  // Once idle, it stays so while asleep at each look and charged no more
  // than stray ticks since (kStrayCpu).
  bool idle = false;
  if (state.sleeping() && w.idle_since) {
    const absl::Duration used = state.cpu - w.cpu_at_idle;
    idle = used >= absl::ZeroDuration() &&
           used <= kStrayCpu + kStrayCpuShare * (now - *w.idle_since);
  } else if (state.sleeping()) {
    idle = w.cpu.has_value() && *w.cpu == state.cpu;
  }
  if (!idle) {
    w.idle_since.reset();
  } else if (!w.idle_since) {
    w.idle_since = now;
    w.cpu_at_idle = state.cpu;
  }
  // Quiet: idle, with no child process, and its I/O as at the first quiet
  // look (QuietBound).
  bool quiet = idle && state.io.has_value() && state.has_children == false;
  if (quiet && w.quiet_since) quiet = *state.io == w.io_at_quiet;
  if (!quiet) {
    w.quiet_since.reset();
  } else if (!w.quiet_since) {
    w.quiet_since = now;
    w.io_at_quiet = *state.io;
  }
  // What a step costs in CPU: what it used between two looks at which its
  // step count moved, per step. A look may fall inside a step, so this is a
  // mean over a few steps, a little more than one's own (its wait in the
  // sync is in it too), which only widens the spin bound.
  const bool stepping = w.phase == Phase::kStep || w.phase == Phase::kFirstStep;
  if (!stepping || w.steps < w.steps_at_look) {
    w.steps_at_look = -1;
  }
  if (stepping && w.steps != w.steps_at_look) {
    if (w.steps_at_look >= 0 && state.cpu >= w.cpu_at_steps) {
      bounds_.ObserveStepCpu((state.cpu - w.cpu_at_steps) /
                             (w.steps - w.steps_at_look));
    }
    w.steps_at_look = w.steps;
    w.cpu_at_steps = state.cpu;
  }
  for (const Worker::PhaseCpu& ended : w.ended_phases) {
    if (state.cpu >= ended.cpu_before) {
      bounds_.ObservePhaseCpu(ended.phase, state.cpu - ended.cpu_before,
                              w.rank);
    }
  }
  w.ended_phases.clear();
  w.looks.push_back({now, state.cpu});
  while (w.looks.size() > 1 && now - w.looks.front().time > kLooksKept) {
    w.looks.pop_front();
  }
  // The CPU it uses while a peer waits counts from the first look since the
  // wait began: this one for a wait that began since the last, an earlier
  // one for a wait learned late (never from before it began: the step it
  // computed then is no spin).
  const std::optional<Held> held = SpinHeld(w);
  if (!held) {
    w.held_since.reset();
  } else if (w.held_since != held->since) {
    w.held_since = held->since;
    w.cpu_at_held = state.cpu;
    for (const Worker::Look& look : w.looks) {
      if (look.time >= held->since) {
        w.cpu_at_held = look.cpu;
        break;
      }
    }
  }
  w.cpu = state.cpu;
  w.last_look = now;
}

void SupervisorPolicy::OnRoundSteps(int64_t steps, absl::Time since) {
  if (steps <= round_steps_) return;
  round_steps_ = steps;
  round_steps_since_ = std::min(since, clock_.Now());
}

void SupervisorPolicy::OnRoundSync(int64_t sync, absl::Time since) {
  if (sync <= round_sync_) return;
  round_sync_ = sync;
  round_sync_since_ = std::min(since, clock_.Now());
}

void SupervisorPolicy::OnStraggler(int local_rank) {
  if (local_rank < 0 || local_rank >= static_cast<int>(workers_.size())) return;
  Worker& w = workers_[local_rank];
  if (w.exit || w.hung) return;
  // Killed by us, as a hung worker is: its exit is not news.
  w.hung = true;
  failures_.push_back(
      {local_rank, ExitStatus{}, v1::FAILURE_CAUSE_STRAGGLER, clock_.Now()});
}

std::optional<absl::Time> SupervisorPolicy::HangDeadline(
    const Worker& w) const {
  if (w.exit || w.hung) return std::nullopt;
  std::optional<absl::Time> deadline;
  if (w.stopped_since && bounds_.stopped_bound() != absl::InfiniteDuration()) {
    deadline = *w.stopped_since + bounds_.stopped_bound();
  }
  // A worker a step ahead of a local peer waits for it in its sync: its
  // silence is the peer's, which its own bounds judge. Killing the waiting
  // ones first replaced healthy ranks and left the culprit in place.
  const absl::Duration bound = bounds_.Bound(BoundPhase(w));
  if (w.reports && bound != absl::InfiniteDuration() &&
      !AwaitedPeer(w).has_value()) {
    absl::Time since = SilentSince(w);
    // A peer a step ahead says the sync this one waited in is over: its
    // step is timed from then, not from its record before that wait (an
    // evaluation of rank 0's, seconds long, would count against it).
    if (std::optional<Held> ahead = AheadPeer(w)) {
      since = std::max(since, ahead->since);
    }
    absl::Time silent = since + bound;
    if (!deadline || silent < *deadline) deadline = silent;
  }
  // Its round could not form and it waits for the next: the round ends
  // elsewhere within about a heartbeat when a peer was lost; when none
  // comes, nobody else will end it (a network cut while it formed).
  if (w.gave_up) {
    const absl::Time gave_up = *w.gave_up + bounds_.round_failed_bound();
    if (!deadline || gave_up < *deadline) deadline = gave_up;
  }
  const absl::Duration blocked_bound = BlockedBound(w);
  if (blocked_bound != absl::InfiniteDuration()) {
    if (std::optional<Held> blocked = BlockedSince(w)) {
      absl::Time blocked_deadline = blocked->since + blocked_bound;
      if (!deadline || blocked_deadline < *deadline) {
        deadline = blocked_deadline;
      }
    }
  }
  const absl::Duration quiet_bound = QuietBound(w);
  if (quiet_bound != absl::InfiniteDuration()) {
    if (std::optional<Held> quiet = QuietSince(w)) {
      absl::Time quiet_deadline = quiet->since + quiet_bound;
      if (!deadline || quiet_deadline < *deadline) deadline = quiet_deadline;
    }
  }
  return deadline;
}

std::optional<int> SupervisorPolicy::WaitingPeer(const Worker& w) const {
  // libddp writes a step's record when its compute is done, before its
  // sync; so a peer one record ahead has seen the sync of this one's last
  // step complete, and waits in the next for this one, still computing.
  // More than one ahead is no lockstep: nothing is inferred.
  // A hung peer still waits (until the agent kills it): only an ended one
  // does not.
  if (!figured_steps_ || !w.reports || w.exit) return std::nullopt;
  for (int i = 0; i < static_cast<int>(workers_.size()); ++i) {
    const Worker& peer = workers_[i];
    if (&peer != &w && !peer.exit && peer.steps == w.steps + 1) return i;
  }
  return std::nullopt;
}

std::optional<SupervisorPolicy::Held> SupervisorPolicy::AheadPeer(
    const Worker& w) const {
  if (std::optional<int> peer = WaitingPeer(w)) {
    return Held{workers_[*peer].last_step, *peer};
  }
  // The server's figure: some rank of the round, on this node or another,
  // recorded the next step, and waits for this one in its sync, since it
  // got there (as its agent dated it).
  if (figured_steps_ && w.reports && !w.exit && round_steps_ > 0 &&
      round_steps_ == w.steps + 1) {
    return Held{round_steps_since_, -1};
  }
  return std::nullopt;
}

std::optional<int> SupervisorPolicy::AwaitedPeer(const Worker& w) const {
  // Found hung, the peer is still awaited: the waiting ones are not hung
  // for it (and are kept, when the round goes on in place).
  if (!figured_steps_) return std::nullopt;
  for (int i = 0; i < static_cast<int>(workers_.size()); ++i) {
    const Worker& peer = workers_[i];
    if (&peer != &w && peer.reports && !peer.exit &&
        w.steps == peer.steps + 1) {
      return i;
    }
  }
  return std::nullopt;
}

Phase SupervisorPolicy::BoundPhase(const Worker& w) const {
  // Past an evaluation or a checkpoint (a step recorded since), with a
  // peer a step ahead: it computes a step, not waiting for a rank still
  // evaluating, and is bounded as a step.
  if (BetweenSteps(w.phase) && w.stepped_in_phase && AheadPeer(w).has_value()) {
    return Phase::kStep;
  }
  return w.phase;
}

std::optional<int> SupervisorPolicy::JoinedPeer(const Worker& w) const {
  // Survivors are told the round on their control pipes at once, and
  // libddp reports the join as it takes it (CreateProcessGroup); a peer in
  // the join, survivor or replacement, waits there for every local rank.
  if (!w.survivor || w.phase != Phase::kJoin || w.first_record || w.exit) {
    return std::nullopt;
  }
  for (int i = 0; i < static_cast<int>(workers_.size()); ++i) {
    const Worker& peer = workers_[i];
    if (&peer != &w && peer.first_phase && !peer.exit) return i;
  }
  return std::nullopt;
}

std::optional<SupervisorPolicy::Held> SupervisorPolicy::JoinWaiter(
    const Worker& w) const {
  if (std::optional<int> peer = JoinedPeer(w)) {
    return Held{*workers_[*peer].first_phase, *peer};
  }
  // Told the round at the policy's start (last_record), it reads it at
  // once: libddp aborts the collective in flight when its control pipe
  // says so, and reports the join as it takes it.
  if (options_.multi_node && w.survivor && w.phase == Phase::kJoin &&
      !w.first_record && !w.exit) {
    return Held{w.last_record, -1};
  }
  return std::nullopt;
}

std::optional<SupervisorPolicy::Held> SupervisorPolicy::HeldBy(
    const Worker& w) const {
  if (w.exit || w.hung) return std::nullopt;
  // Since when the peer waits: it got ahead, or it took the round...
  std::optional<Held> held;
  if (BoundPhase(w) == Phase::kStep) {
    held = AheadPeer(w);
  } else {
    held = JoinWaiter(w);
  }
  if (!held) return std::nullopt;
  // ... or the worker last reported, whichever came last.
  held->since = std::max(held->since, w.last_record);
  return held;
}

std::optional<SupervisorPolicy::Held> SupervisorPolicy::HeldBetweenSteps(
    const Worker& w) const {
  // A step recorded since the phase began: BoundPhase bounds it as a step
  // (HeldBy), or no peer is ahead.
  if (!BetweenSteps(w.phase) || w.stepped_in_phase || w.exit || w.hung) {
    return std::nullopt;
  }
  // Every rank reports the phase (worker/phase.h) and the ones with
  // nothing to do there go on to their next step: one that recorded it
  // waits in its sync for this one, still writing or evaluating.
  std::optional<Held> held = AheadPeer(w);
  if (!held) return std::nullopt;
  held->since = std::max(held->since, w.last_record);
  return held;
}

std::optional<SupervisorPolicy::Held> SupervisorPolicy::HeldInSync(
    const Worker& w) const {
  // Inside a collective it may wait for a rank elsewhere that has not
  // entered it: a broadcast relayed through that rank completed on the
  // peer, not here (the soak's replacement deadlocked in a sync on one
  // node, an innocent rank killed on the other).
  if (w.phase != Phase::kSync || w.exit || w.hung ||
      w.collectives_done < w.collectives) {
    return std::nullopt;
  }
  // libddp records each collective of the sync as it enters it and as it
  // completes, and every rank makes the same ones: a peer that entered
  // more, or went on to its first step, while this one is in its own code
  // between two, waits for it in the next.
  std::optional<Held> held;
  for (int i = 0; i < static_cast<int>(workers_.size()); ++i) {
    const Worker& peer = workers_[i];
    if (&peer == &w || peer.exit) continue;
    std::optional<absl::Time> since;
    if (peer.phase == Phase::kSync && peer.collectives > w.collectives) {
      since = peer.last_collective;
    } else if (peer.phase != Phase::kSync && peer.left_sync) {
      since = peer.left_sync;
    }
    if (since && (!held || *since < held->since)) held = Held{*since, i};
  }
  // The server's figure: a rank of the round, on this node or another,
  // entered more of the sync's collectives or finished it, and waits.
  if (round_sync_ > w.collectives &&
      (!held || round_sync_since_ < held->since)) {
    held = Held{round_sync_since_, -1};
  }
  if (!held) return std::nullopt;
  held->since = std::max(held->since, w.last_record);
  return held;
}

std::optional<SupervisorPolicy::Held> SupervisorPolicy::BlockedSince(
    const Worker& w) const {
  if (!w.idle_since) return std::nullopt;
  std::optional<Held> blocked = HeldBy(w);
  if (!blocked) blocked = HeldBetweenSteps(w);
  if (!blocked) blocked = HeldInSync(w);
  if (!blocked) return std::nullopt;
  blocked->since = std::max(blocked->since, *w.idle_since);
  return blocked;
}

absl::Duration SupervisorPolicy::BlockedBound(const Worker& w) const {
  return bounds_.BlockedBound(BoundPhase(w), w.rank);
}

std::optional<SupervisorPolicy::Held> SupervisorPolicy::QuietSince(
    const Worker& w) const {
  if (!w.quiet_since) return std::nullopt;
  std::optional<Held> quiet = BlockedSince(w);
  if (!quiet) return std::nullopt;
  quiet->since = std::max(quiet->since, *w.quiet_since);
  return quiet;
}

absl::Duration SupervisorPolicy::QuietBound(const Worker& w) const {
  return bounds_.QuietBound(BoundPhase(w), w.rank);
}

std::optional<SupervisorPolicy::Held> SupervisorPolicy::SpinHeld(
    const Worker& w) const {
  if (std::optional<Held> held = HeldBy(w)) return held;
  return HeldBetweenSteps(w);
}

absl::Duration SupervisorPolicy::SpinBound(const Worker& w) const {
  return bounds_.SpinBound(BoundPhase(w), w.rank);
}

std::optional<absl::Duration> SupervisorPolicy::SpunCpu(const Worker& w) const {
  if (!reports_between_steps_ || !w.held_since || !w.cpu || w.stopped) {
    return std::nullopt;
  }
  // A wait that changed since the last look (a record came) is counted
  // from the next one.
  const std::optional<Held> held = SpinHeld(w);
  if (!held || held->since != *w.held_since) return std::nullopt;
  return *w.cpu - w.cpu_at_held;
}

std::optional<absl::Duration> SupervisorPolicy::SpunPastBound(
    const Worker& w) const {
  if (w.exit || w.hung) return std::nullopt;
  std::optional<absl::Duration> spun = SpunCpu(w);
  if (!spun || *spun < SpinBound(w)) return std::nullopt;
  return spun;
}

absl::Time SupervisorPolicy::SilentSince(const Worker& w) const {
  if (w.phase != Phase::kJoin) return w.last_record;
  // A worker joining the round's group waits for every local member: its
  // silence counts from the last one's arrival, or, while one is still
  // starting (a replacement, cold under load), from when that one would be
  // found hung in its start. Else a fixed join bound shorter than a cold
  // start (--worker-timeout 2) found the survivors hung while their
  // replacement loaded LibTorch, and replaced the ranks that held the state.
  absl::Time since = w.last_record;
  const absl::Duration start_bound = bounds_.Bound(Phase::kStart);
  for (const Worker& peer : workers_) {
    if (&peer == &w || peer.exit || peer.hung) continue;
    if (peer.phase == Phase::kJoin) {
      since = std::max(since, peer.last_record);
    } else if (peer.phase == Phase::kStart && peer.reports) {
      if (start_bound == absl::InfiniteDuration()) {
        return absl::InfiniteFuture();
      }
      since = std::max(since, peer.last_record + start_bound);
    }
  }
  return since;
}

void SupervisorPolicy::MarkHung(int local_rank, absl::Time now) {
  Worker& w = workers_[local_rank];
  const bool stopped_too_long =
      w.stopped_since && now - *w.stopped_since >= bounds_.stopped_bound();
  // Which bound it is hung past, judged while it still counts as running.
  std::optional<Held> blocked;
  std::optional<Held> quiet;
  std::optional<absl::Duration> spun;
  if (!stopped_too_long) {
    blocked = BlockedSince(w);
    if (blocked && now - blocked->since < BlockedBound(w)) {
      blocked.reset();
    }
    if (!blocked) {
      quiet = QuietSince(w);
      if (quiet && now - quiet->since < QuietBound(w)) quiet.reset();
    }
    if (!blocked && !quiet) spun = SpunPastBound(w);
  }
  const std::optional<Held> held = SpinHeld(w);
  const Phase phase = BoundPhase(w);
  LocalFailure failure{local_rank, ExitStatus{}, v1::FAILURE_CAUSE_HUNG, now};
  failure.phase = phase;
  if (stopped_too_long) {
    w.hung_bound = bounds_.stopped_bound();
    failure.stopped = true;
    failure.silent = now - *w.stopped_since;
  } else if (blocked) {
    w.hung_bound = BlockedBound(w);
    failure.blocked = true;
    failure.waited_by = blocked->waited_by;
    failure.silent = now - blocked->since;
  } else if (quiet) {
    w.hung_bound = QuietBound(w);
    failure.first_time = bounds_.FirstTimeThere(phase, w.rank);
    bounds_.ObserveFoundQuiet(phase, w.rank);
    failure.blocked = true;
    failure.quiet = true;
    failure.waited_by = quiet->waited_by;
    failure.silent = now - quiet->since;
  } else if (w.gave_up && now - *w.gave_up >= bounds_.round_failed_bound()) {
    w.hung_bound = bounds_.round_failed_bound();
    failure.gave_up_round = true;
    failure.silent = now - *w.gave_up;
  } else if (spun && held) {
    w.hung_bound = SpinBound(w);
    failure.spinning = true;
    failure.cpu = *spun;
    failure.waited_by = held->waited_by;
    failure.silent = now - held->since;
  } else {
    w.hung_bound = bounds_.Bound(phase);
    failure.silent = now - w.last_record;
  }
  w.hung = true;
  failures_.push_back(failure);
}

RecoveryDecision SupervisorPolicy::DecideRecovery() const {
  RecoveryDecision decision;
  bool some_declared = false;
  for (const Worker& w : workers_) {
    if (w.exit && w.exit->success()) return decision;
    some_declared |= w.in_place;
  }
  if (!some_declared) return decision;
  bool some_stopped = false;
  for (const LocalFailure& f : failures_) {
    if (f.cause == v1::FAILURE_CAUSE_HUNG && workers_[f.local_rank].stopped)
      some_stopped = true;
  }
  for (const LocalFailure& f : failures_) {
    if (f.cause == v1::FAILURE_CAUSE_HUNG && some_stopped &&
        !workers_[f.local_rank].stopped) {
      continue;  // silent because it waits for the stopped one
    }
    if (std::find(decision.replace.begin(), decision.replace.end(),
                  f.local_rank) != decision.replace.end()) {
      continue;
    }
    decision.replace.push_back(f.local_rank);
    if (!workers_[f.local_rank].exit) decision.kill.push_back(f.local_rank);
  }
  std::sort(decision.replace.begin(), decision.replace.end());
  std::sort(decision.kill.begin(), decision.kill.end());
  // Every worker kept must recover in place. One that has not declared it
  // yet is fine only when it is replaced: a replacement that failed before
  // it got that far (stopped or killed in its start-up). Restarting the
  // whole node for it would throw away its survivors' state and start its
  // workers afresh beside the other nodes' survivors.
  for (int i = 0; i < static_cast<int>(workers_.size()); ++i) {
    if (!workers_[i].in_place &&
        !std::binary_search(decision.replace.begin(), decision.replace.end(),
                            i)) {
      return RecoveryDecision{};
    }
  }
  decision.in_place = true;
  return decision;
}

std::vector<bool> SupervisorPolicy::in_place_declared() const {
  std::vector<bool> out;
  for (const Worker& w : workers_) out.push_back(w.in_place);
  return out;
}

SupervisorPolicy::Verdict SupervisorPolicy::Evaluate() {
  const absl::Time now = clock_.Now();
  for (int i = 0; i < static_cast<int>(workers_.size()); ++i) {
    const Worker& w = workers_[i];
    std::optional<absl::Time> deadline = HangDeadline(w);
    if ((deadline && now >= *deadline) || SpunPastBound(w).has_value()) {
      MarkHung(i, now);
    }
  }
  if (!failures_.empty()) {
    // Once one is hung, every worker stopped now is a culprit, whatever its
    // own bound: the silent others wait for it.
    for (int i = 0; i < static_cast<int>(workers_.size()); ++i) {
      const Worker& w = workers_[i];
      if (w.stopped && !w.hung && !w.exit) MarkHung(i, now);
    }
    return Verdict::kFailed;
  }
  for (const Worker& w : workers_) {
    if (!w.exit) return Verdict::kRunning;
  }
  return Verdict::kSucceeded;
}

std::optional<absl::Time> SupervisorPolicy::NextHangDeadline() const {
  std::optional<absl::Time> next;
  for (const Worker& w : workers_) {
    std::optional<absl::Time> deadline = HangDeadline(w);
    // A spin is judged by CPU time, read at each look: the next look is due
    // when it could have used the rest of its bound on one core.
    if (std::optional<absl::Duration> spun = SpunCpu(w);
        spun && !w.exit && !w.hung &&
        SpinBound(w) != absl::InfiniteDuration()) {
      const absl::Time spin =
          w.last_look + std::max(absl::ZeroDuration(), SpinBound(w) - *spun);
      if (!deadline || spin < *deadline) deadline = spin;
    }
    if (deadline && (!next || *deadline < *next)) next = deadline;
  }
  return next;
}

absl::Duration SupervisorPolicy::WaitBefore(
    absl::Duration monitor_interval) const {
  std::optional<absl::Time> hang = NextHangDeadline();
  if (!hang.has_value()) return monitor_interval;
  return std::max(absl::ZeroDuration(),
                  std::min(monitor_interval, *hang - clock_.Now()));
}

bool SupervisorPolicy::Forming() const {
  for (const Worker& w : workers_) {
    if (w.exit.has_value() || w.hung || !w.reports) continue;
    if (w.phase == common::Phase::kStart || w.phase == common::Phase::kJoin ||
        w.phase == common::Phase::kSync) {
      return true;
    }
  }
  return false;
}

bool SupervisorPolicy::AwaitsRemoteCause(int num_nodes) const {
  if (num_nodes <= 1 || failures_.empty()) return false;
  for (const LocalFailure& f : failures_) {
    const Worker& w = workers_[f.local_rank];
    // One that a peer waits for (blocked or not) is the cause.
    if (f.cause != v1::FAILURE_CAUSE_HUNG || w.stopped || f.blocked ||
        f.spinning || f.gave_up_round || AheadPeer(w).has_value() ||
        clock_.Now() - f.time >= w.hung_bound) {
      return false;
    }
  }
  return true;
}

}  // namespace ddprun::launcher
