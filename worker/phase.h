#pragma once

#include "common/progress_record.h"

namespace ddprun::worker {

// Tells the agent (on DDPRUN_PROGRESS_FD, WorkerEnv::progress_fd) which
// phase of its life this worker enters, so that a hang is found in every
// phase with that phase's bound (launcher/agent/phase_bounds.h). libddp
// reports on its own: CreateProcessGroup the join, SyncFromSurvivor the
// state sync, DataParallel the start of stepping and every step. A program
// reports what only it knows: a checkpoint write (Phase::kCheckpoint), an
// evaluation between steps (Phase::kEval) and its end (Phase::kStop);
// ddprun-mnist is the example. Report a checkpoint or an evaluation on
// every rank, not only on the one that does the work: the others wait for
// it in their next step. Unreported, such a pause is bounded as a step
// (10 s, or 5x the longest step) and its rank is found hung. The next
// phase reported ends a phase; so does the next step completed, which for
// a checkpoint or an evaluation the agent takes to be the second step
// record after it (libddp writes a step's record before the step's
// gradient sync, where the other ranks wait for the one still working).
//
// Non-blocking and async-signal-safe: a full pipe drops the record (the
// agent is behind; the next one counts), a closed one or fd -1 is ignored.
void ReportPhase(int progress_fd, common::Phase phase);
// One training step completed; `compute_seconds`: the rank's own compute
// time for it (the step less its wait in the gradient sync), negative when
// unknown (the first step).
void ReportStep(int progress_fd, double compute_seconds = -1);
// Says, once at start, that this program reports every evaluation and
// checkpoint write it does between steps (ReportPhase). The agent then
// takes a rank that uses CPU without finishing its step, while a local peer
// waits for it, for a loop that never ends: hung after a second of CPU or
// 5x the CPU of its costliest step (--hang-bound spin=SECONDS), not only at
// the step's bound of 10 s; in an evaluation or a checkpoint write, 5x the
// CPU the rank's own took there once it did one. Without it, the agent learns
// the same from the program's first evaluation or checkpoint record.
void DeclareReportsBetweenSteps(int progress_fd);
// Says that the round this worker was joining could not form (a peer it
// could not reach), and that it waits for the next one
// (Membership::JoinNextRound writes it). If no next round comes soon (the
// peer is alive and nobody else ends the round: a network cut while the
// round formed), the agent ends it by replacing this worker.
void ReportRoundFailed(int progress_fd);
// Say that this worker enters the next collective of its state sync, and
// that the collective completed here (SyncFromSurvivor writes both around
// each one). Every rank makes the same ones in the same order, so a local
// peer that entered more of them, or finished the sync, waits for this
// one. Outside any collective (the last one completed, the next not
// entered) and asleep without using CPU meanwhile, it is blocked (a
// deadlock in the sync), and found within a second or so, not at the
// sync's bound. Inside one, it may wait for a rank elsewhere: a broadcast
// relayed through a rank that deadlocked completes on some ranks, not on
// others.
void ReportCollective(int progress_fd);
void ReportCollectiveDone(int progress_fd);

}  // namespace ddprun::worker
