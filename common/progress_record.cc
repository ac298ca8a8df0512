#include "common/progress_record.h"

#include <array>
#include <cmath>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace ddprun::common {
namespace {

constexpr std::array<absl::string_view, kNumPhases> kNames = {
    "start", "join",       "sync", "first-step",
    "step",  "checkpoint", "stop", "eval"};

}  // namespace

absl::string_view PhaseName(Phase phase) {
  return kNames[static_cast<int>(phase)];
}

std::optional<Phase> ParsePhase(absl::string_view name) {
  for (int i = 0; i < kNumPhases; ++i) {
    if (kNames[i] == name) return static_cast<Phase>(i);
  }
  return std::nullopt;
}

ProgressRecord ParseProgressRecord(absl::string_view line) {
  line = absl::StripAsciiWhitespace(line);
  ProgressRecord record;
  if (line == "inplace") {
    record.kind = ProgressRecord::Kind::kInPlace;
  } else if (line == "reports between-steps") {
    record.kind = ProgressRecord::Kind::kReportsBetweenSteps;
  } else if (line == "round-failed") {
    record.kind = ProgressRecord::Kind::kRoundFailed;
  } else if (line == "collective") {
    record.kind = ProgressRecord::Kind::kCollective;
  } else if (line == "collective done") {
    record.kind = ProgressRecord::Kind::kCollectiveDone;
  } else if (line == "step" || absl::StartsWith(line, "step ")) {
    record.kind = ProgressRecord::Kind::kStep;
    for (absl::string_view word :
         absl::StrSplit(line, ' ', absl::SkipEmpty())) {
      double seconds = 0;
      if (absl::ConsumePrefix(&word, "compute=") &&
          absl::SimpleAtod(word, &seconds) && std::isfinite(seconds) &&
          seconds >= 0) {
        record.compute_seconds = seconds;
      }
    }
  } else if (absl::ConsumePrefix(&line, "phase ")) {
    std::optional<Phase> phase = ParsePhase(absl::StripAsciiWhitespace(line));
    // "phase step" enters stepping: no step is done yet.
    if (phase == Phase::kStep) phase = Phase::kFirstStep;
    if (phase.has_value()) {
      record.kind = ProgressRecord::Kind::kPhase;
      record.phase = *phase;
    }
  }
  return record;
}

std::string PhaseLine(Phase phase) {
  // The first step is the agent's notion; a worker just starts stepping.
  if (phase == Phase::kFirstStep) phase = Phase::kStep;
  return absl::StrCat("phase ", PhaseName(phase), "\n");
}

std::string StepLine(double compute_seconds) {
  if (!(compute_seconds >= 0) || !std::isfinite(compute_seconds)) {
    return kStepLine;
  }
  return absl::StrFormat("step compute=%.6f\n", compute_seconds);
}

}  // namespace ddprun::common
