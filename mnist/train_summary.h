#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"

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
  double final_loss = 0;
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

// Writes the summary as one JSON object.
absl::Status WriteTrainSummary(const std::string& path, const TrainSummary& s);

}  // namespace ddprun::worker
