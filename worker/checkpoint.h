#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <torch/nn/module.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/atomic_file.h"

namespace ddprun::worker {

// A module's parameters and buffers by their dotted names ("1.weight"),
// detached, contiguous, on the CPU.
std::map<std::string, at::Tensor> StateDict(const torch::nn::Module& module);

// `value` (dicts, lists, scalars, strings, tensors) as torch.save writes
// it: a zip archive whose pickle names no global but tensor rebuilding, so
// that a plain `torch.load(path)` reads it under the defaults of every
// PyTorch from 1.13 on, weights_only=True (the default since 2.6) included.
// torch::jit::pickle_save tags each dict and list with
// torch.jit._pickle.restore_type_tag, which weights_only refuses.
// pickle_load reads both.
std::vector<char> PickleForTorchLoad(const c10::IValue& value);

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
  int64_t epoch = 0;                        // the epoch to continue (0-based)
  int64_t epoch_position = 0;  // samples of it trained, all ranks together
  int64_t step = 0;            // global steps done
  uint64_t seed = 0;           // the sampler's (and init's) seed
  int world_size = 1;          // of the run that wrote it
  // Samples (all ranks) trained of each epoch up to `epoch`, as the
  // trainer accounts them (its --summary-json); empty: not recorded (files
  // written before it was).
  std::vector<int64_t> epoch_samples;
};

// Saves `checkpoint` as <dir>/ckpt-<step, 10 digits>.pt, atomically, as a
// dict Python's torch.load reads (PickleForTorchLoad): {"model": state dict,
// "optimizer": {"state": {}, "param_groups": [{"lr": ...}]}, "epoch",
// "epoch_position", "step", "seed", "world_size"}; floats such as "lr" are
// 0-dim float64 tensors, since PyTorch 1.13's weights_only unpickler knows
// no float (files with plain floats still load here). Creates `dir` if needed
// (syncing each new folder's parent); files and folders get the umask's
// modes. Keeps the newest `keep` files and removes older ones. On failure
// (a failed fsync included) the error names the file and the fix; the
// previous checkpoints are intact.
absl::Status SaveCheckpoint(const std::string& dir,
                            const TrainingCheckpoint& checkpoint, int keep = 2,
                            const SyncOptions& sync = {});

// The newest checkpoint in `dir` that reads back, or nullopt when there is
// none (or no folder). A file that does not read is skipped with a warning.
absl::StatusOr<std::optional<TrainingCheckpoint>> LoadNewestCheckpoint(
    const std::string& dir);

}  // namespace ddprun::worker
