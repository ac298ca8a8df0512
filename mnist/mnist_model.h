#pragma once

#include <string>

#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>

#include "absl/status/statusor.h"

namespace ddprun::worker {

// torch::nn::Linear (same options, initialization and parameters; the same
// result up to float rounding) whose forward on CPU, for a [batch, in]
// input, computes (W x^T)^T + b instead of addmm(b, x, W^T). OpenBLAS runs
// the layer's GEMMs faster in that orientation for batches of tens of rows:
// the MLP's forward plus backward takes 10-15 us less per step (~5% of a
// step; the two forms timed on alternating steps of one process). Anything
// else (CUDA, other shapes) takes Linear's own path.
class MnistLinearImpl : public torch::nn::LinearImpl {
 public:
  using LinearImpl::LinearImpl;
  at::Tensor forward(const at::Tensor& input);
};
TORCH_MODULE(MnistLinear);

// The seed model, built exactly like Python's
// nn.Sequential(nn.Flatten(), nn.Linear(784, 128), nn.ReLU(),
// nn.Linear(128, 10)), so its state dict has the same keys ("1.weight",
// "1.bias", "3.weight", "3.bias") and loads there. Its layers are
// MnistLinear.
torch::nn::Sequential MakeMnistMlp();

// A small CNN, nn.Sequential(nn.Conv2d(1, 8, 5), nn.ReLU(),
// nn.MaxPool2d(2), nn.Flatten(), nn.Linear(8 * 12 * 12, 10)): a second
// shape of model for the data-parallel tests.
torch::nn::Sequential MakeMnistCnn();

// --model: "mlp" (the seed) or "cnn".
absl::StatusOr<torch::nn::Sequential> MakeMnistModel(const std::string& name);

}  // namespace ddprun::worker
