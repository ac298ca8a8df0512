#include "mnist/train_summary.h"

#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace ddprun::worker {

uint64_t Fnv1a64(absl::string_view bytes, uint64_t hash) {
  for (unsigned char c : bytes) {
    hash ^= c;
    hash *= 0x100000001b3ull;
  }
  return hash;
}

absl::Status WriteTrainSummary(const std::string& path, const TrainSummary& s) {
  std::ofstream out(path);
  out << absl::StrFormat(
      "{\"world_size\": %d, \"epochs\": %d, \"steps\": %d, "
      "\"parameters\": %d, "
      "\"samples_per_sec\": %.1f, \"test_accuracy\": %.6f, "
      "\"wall_seconds\": %.3f, \"time_to_first_step_seconds\": %.3f, "
      "\"final_loss\": %.6f, \"final_loss_hex\": \"%a\", "
      "\"parameters_fnv1a64\": \"%016x\", "
      "\"allreduce_seconds_per_step\": %.6f, "
      "\"allreduces_in_place\": %d, \"allreduces_in_place_fallbacks\": %d, "
      "\"resumed_from_step\": %d, \"intra_op_threads\": %d, "
      "\"first_step_unix_seconds\": %.3f, "
      "\"epoch_samples\": [%s], \"epoch_size\": %d, "
      "\"in_place_recoveries\": %d, \"resumed_at_steps\": [%s], "
      "\"resumed_step_unix_seconds\": [%s]}\n",
      s.world_size, s.epochs, s.steps, s.parameters, s.samples_per_sec,
      s.test_accuracy, s.wall_seconds, s.time_to_first_step_seconds,
      s.final_loss, s.final_loss, s.parameters_fnv1a64,
      s.allreduce_seconds_per_step, s.allreduces_in_place,
      s.allreduces_in_place_fallbacks, s.resumed_from_step, s.intra_op_threads,
      s.first_step_unix_seconds, absl::StrJoin(s.epoch_samples, ", "),
      s.epoch_size, s.resumed_at_steps.size(),
      absl::StrJoin(s.resumed_at_steps, ", "),
      absl::StrJoin(s.resumed_step_unix_seconds, ", ",
                    [](std::string* out, double v) {
                      absl::StrAppend(out, absl::StrFormat("%.6f", v));
                    }));
  out.close();
  if (!out) {
    return absl::PermissionDeniedError(absl::StrFormat(
        "cannot write the summary %s; choose a writable --summary-json path",
        path));
  }
  return absl::OkStatus();
}

}  // namespace ddprun::worker
