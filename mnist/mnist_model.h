#pragma once

#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>

#include <string>

#include "absl/status/statusor.h"

namespace ddprun::worker {

// The seed MLP's hidden width, and the widest --hidden accepted (about
// 210 MB of weights; the gradient sync is tested up to 256 MB).
inline constexpr int kSeedHidden = 128;
inline constexpr int kMaxHidden = 65536;

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
// nn.Sequential(nn.Flatten(), nn.Linear(784, hidden), nn.ReLU(),
// nn.Linear(hidden, 10)) (hidden = 128 in the seed), so its state dict has
// the same keys ("1.weight", "1.bias", "3.weight", "3.bias") and loads
// there. Its layers are MnistLinear. 795 * hidden + 10 parameters.
torch::nn::Sequential MakeMnistMlp(int hidden = kSeedHidden);

// A small CNN, nn.Sequential(nn.Conv2d(1, 8, 5), nn.ReLU(),
// nn.MaxPool2d(2), nn.Flatten(), nn.Linear(8 * 12 * 12, 10)): a second
// shape of model for the data-parallel tests.
torch::nn::Sequential MakeMnistCnn();

// --model: "mlp" (the seed) or "cnn"; --hidden: the MLP's hidden width,
// 1..kMaxHidden (the CNN has none: any other value than the seed's is an
// error there).
absl::StatusOr<torch::nn::Sequential> MakeMnistModel(const std::string& name,
                                                     int hidden = kSeedHidden);

}  // namespace ddprun::worker
