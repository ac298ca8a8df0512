#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include "absl/status/statusor.h"

namespace ddprun::worker {

// A module's parameters and buffers by their dotted names ("1.weight"),
// detached, contiguous, on the CPU.
std::map<std::string, at::Tensor> StateDict(const torch::nn::Module& module);

// Writes a state dict as a pickled dict of tensors, the format of Python's
// torch.save(model.state_dict()): `torch.load(path)` reads it and
// `model.load_state_dict` accepts it. Atomic (see WriteFileAtomically).
absl::Status SaveStateDict(const std::string& path,
                           const std::map<std::string, at::Tensor>& tensors);

// Reads what SaveStateDict (or Python's torch.save of a state dict) wrote.
absl::StatusOr<std::map<std::string, at::Tensor>> LoadStateDict(
    const std::string& path);

// Where training stands, as rank 0 saves it and every rank resumes it.
struct TrainingCheckpoint {
  std::map<std::string, at::Tensor> model;  // state dict, CPU
  double lr = 0;                            // SGD, no momentum: no state
  int64_t epoch = 0;           // the epoch to continue (0-based)
  int64_t epoch_position = 0;  // samples of it trained, all ranks together
  int64_t step = 0;            // global steps done
  uint64_t seed = 0;           // the sampler's (and init's) seed
  int world_size = 1;          // of the run that wrote it
};

// Saves `checkpoint` as <dir>/ckpt-<step, 10 digits>.pt, atomically, as a
// dict Python's torch.load reads: {"model": state dict, "optimizer":
// {"state": {}, "param_groups": [{"lr": ...}]}, "epoch", "epoch_position",
// "step", "seed", "world_size"}. Creates `dir` if needed; keeps the newest
// `keep` files and removes older ones. On failure the previous checkpoints
// are intact and the error names the file and the fix.
absl::Status SaveCheckpoint(const std::string& dir,
                            const TrainingCheckpoint& checkpoint, int keep = 2);

// The newest checkpoint in `dir` that reads back, or nullopt when there is
// none (or no folder). A file that does not read is skipped with a warning.
absl::StatusOr<std::optional<TrainingCheckpoint>> LoadNewestCheckpoint(
    const std::string& dir);

}  // namespace ddprun::worker
