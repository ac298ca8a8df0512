#pragma once

#include <optional>
#include <string>

#include "absl/strings/string_view.h"

namespace ddprun::common {

// The records a worker writes on its progress pipe (DDPRUN_PROGRESS_FD), one
// line each, and the agent reads (launcher/posix/progress_channel.h). The one
// definition of that wire format: libddp (worker/phase.h), ddprun-mnist and
// the Python module (python/ddprun/progress.py, which repeats the words)
// write it; the agent parses it.
//
//   phase <name>       the worker enters a phase of its life (below)
//   step ...           one training step done. What follows is free text,
//                      except a `compute=SECONDS` word: the time this rank
//                      computed for the step, its wait in the gradient sync
//                      left out (libddp writes "step compute=0.012345", older
//                      workers "step"; a step without it carries no figure)
//   inplace            the program recovers in place (worker/recovery.h)
//   reports between-steps
//                      the program reports every evaluation and checkpoint
//                      it does between steps (worker/phase.h)
//   round-failed       the round it was joining could not form (a peer not
//                      reached); it waits for the next (worker/recovery.h)
//   collective         it enters the next collective of its state sync
//                      (worker::SyncFromSurvivor): every rank of the round
//                      makes the same ones in the same order
//   collective done    that collective completed here
//
// Any other line counts as a sign of life and nothing more, so that a newer
// worker's records never break an older agent.

// The phases of a worker's life, each with its own hang bound
// (launcher/agent/phase_bounds.h). A worker is in kStart from its spawn
// until its first record.
enum class Phase {
  kStart,       // from spawn to the first record
  kJoin,        // forming the round's process group (store rendezvous)
  kSync,        // taking or giving state in place (SyncFromSurvivor)
  kFirstStep,   // stepping declared, no step completed yet
  kStep,        // between two completed steps
  kCheckpoint,  // writing a checkpoint
  kStop,        // finishing: saving results, tearing down
  // Evaluating between steps (a validation pass): the other ranks wait for
  // it in their next step, and it may take far longer than a step. Last, so
  // that the earlier phases keep their numbers.
  kEval,
};
inline constexpr int kNumPhases = 8;

// "start", "join", "sync", "first-step", "step", "checkpoint", "stop",
// "eval".
absl::string_view PhaseName(Phase phase);
// The inverse of PhaseName; nullopt for an unknown word.
std::optional<Phase> ParsePhase(absl::string_view name);

// What one line on the pipe says.
struct ProgressRecord {
  enum class Kind {
    kPhase,
    kStep,
    kInPlace,
    kReportsBetweenSteps,
    kRoundFailed,
    kCollective,
    kCollectiveDone,
    kOther
  };
  Kind kind = Kind::kOther;
  Phase phase = Phase::kStart;  // for kPhase
  // For kStep: the rank's own compute time for the step (the straggler
  // figure); nullopt when the record carries none or a malformed one.
  std::optional<double> compute_seconds;
};

// Parses one line (without its newline).
ProgressRecord ParseProgressRecord(absl::string_view line);

// The lines as written, newline included. A worker entering the stepping
// phase writes PhaseLine(kStep): the agent applies the first-step bound
// until the first StepLine.
std::string PhaseLine(Phase phase);
inline constexpr char kStepLine[] = "step\n";
// A step record with the rank's compute time (negative: none, as kStepLine).
std::string StepLine(double compute_seconds);
inline constexpr char kInPlaceLine[] = "inplace\n";
inline constexpr char kReportsBetweenStepsLine[] = "reports between-steps\n";
inline constexpr char kRoundFailedLine[] = "round-failed\n";
inline constexpr char kCollectiveLine[] = "collective\n";
inline constexpr char kCollectiveDoneLine[] = "collective done\n";

}  // namespace ddprun::common
