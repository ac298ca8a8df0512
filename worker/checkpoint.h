#pragma once

#include <map>
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

}  // namespace ddprun::worker
