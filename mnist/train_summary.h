#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace ddprun::worker {

// The final figures of a training run, for scripts and benchmarks.
struct TrainSummary {
  int world_size = 1;
  int epochs = 0;  // epochs reached (a partial one counts)
  int64_t steps = 0;
  int64_t parameters = 0;      // the model's
  double samples_per_sec = 0;  // all ranks together, training time only
  double test_accuracy = 0;    // in [0, 1]
  double wall_seconds = 0;     // from process start
  double time_to_first_step_seconds = 0;  // from process start
  // Wall-clock time (Unix seconds) when the first step finished, so that a
  // benchmark can measure from its own launch of the whole command.
  double first_step_unix_seconds = 0;
  // Printed rounded (%.6f) for people; final_loss_hex in the JSON holds
  // its exact bits (a hex float, "%a"), for comparisons "bit for bit".
  double final_loss = 0;
  // Fnv1a64 over the raw bytes of the final model's parameters, in the
  // order of named_parameters(): a bit that differs changes it (barring a
  // one-in-2^64 collision), whatever the summary's figures round away.
  uint64_t parameters_fnv1a64 = 0;
  double allreduce_seconds_per_step = 0;  // waiting for gradient sync
  // Gradient buckets (rank 0's) summed where backward placed the gradients,
  // in shared memory (the shared-memory gradient path), and those copied
  // through the segment instead (DataParallel::GradientStats).
  int64_t allreduces_in_place = 0;
  int64_t allreduces_in_place_fallbacks = 0;
  int64_t resumed_from_step = -1;  // -1: started fresh
  // LibTorch's intra-op threads while training: OMP_NUM_THREADS when set
  // (ddprun sets 1 when a node runs several workers and the user set none),
  // else LibTorch's default; ddprun-mnist sets none itself.
  int intra_op_threads = 0;
  // Distinct samples (all ranks, padding left out) of the completed steps
  // of each epoch reached; each equals epoch_size (the data set's size)
  // when no sample was skipped or trained twice, in-place recoveries and
  // changes of the world size included.
  std::vector<int64_t> epoch_samples;
  int64_t epoch_size = 0;
  // The step each in-place recovery resumed at (worker/recovery.h).
  std::vector<int64_t> resumed_at_steps;
  // When the first step after each of them completed (Unix seconds).
  std::vector<double> resumed_step_unix_seconds;
};

inline constexpr uint64_t kFnv1a64Offset = 0xcbf29ce484222325ull;

// FNV-1a (64 bits) of `bytes`, continuing from `hash`: chain the calls to
// digest several buffers as one.
uint64_t Fnv1a64(absl::string_view bytes, uint64_t hash = kFnv1a64Offset);

// Writes the summary as one JSON object.
absl::Status WriteTrainSummary(const std::string& path, const TrainSummary& s);

}  // namespace ddprun::worker
