#include "mnist/mnist_model.h"

#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/pooling.h>

#include "absl/strings/str_format.h"

namespace ddprun::worker {

at::Tensor MnistLinearImpl::forward(const at::Tensor& input) {
  if (!input.device().is_cpu() || input.dim() != 2) {
    return LinearImpl::forward(input);
  }
  at::Tensor out = at::mm(weight, input.t()).t();
  return bias.defined() ? out + bias : out;
}

torch::nn::Sequential MakeMnistMlp(int hidden) {
  return torch::nn::Sequential(torch::nn::Flatten(), MnistLinear(784, hidden),
                               torch::nn::ReLU(), MnistLinear(hidden, 10));
}

torch::nn::Sequential MakeMnistCnn() {
  return torch::nn::Sequential(
      torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 8, 5)), torch::nn::ReLU(),
      torch::nn::MaxPool2d(torch::nn::MaxPool2dOptions(2)),
      torch::nn::Flatten(), MnistLinear(8 * 12 * 12, 10));
}

absl::StatusOr<torch::nn::Sequential> MakeMnistModel(const std::string& name,
                                                     int hidden) {
  if (name == "mlp") {
    if (hidden < 1 || hidden > kMaxHidden) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "--hidden %d is out of range; the MLP's hidden layer takes 1 to %d "
          "units (the seed's: %d)",
          hidden, kMaxHidden, kSeedHidden));
    }
    return MakeMnistMlp(hidden);
  }
  if (name == "cnn") {
    if (hidden != kSeedHidden) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "--hidden %d applies to --model mlp only; drop --hidden for --model "
          "cnn",
          hidden));
    }
    return MakeMnistCnn();
  }
  return absl::InvalidArgumentError(
      absl::StrFormat("unknown model '%s'; use mlp or cnn", name));
}

}  // namespace ddprun::worker
