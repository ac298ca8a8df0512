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

torch::nn::Sequential MakeMnistMlp() {
  return torch::nn::Sequential(torch::nn::Flatten(),
                               MnistLinear(784, 128), torch::nn::ReLU(),
                               MnistLinear(128, 10));
}

torch::nn::Sequential MakeMnistCnn() {
  return torch::nn::Sequential(
      torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 8, 5)), torch::nn::ReLU(),
      torch::nn::MaxPool2d(torch::nn::MaxPool2dOptions(2)),
      torch::nn::Flatten(), MnistLinear(8 * 12 * 12, 10));
}

absl::StatusOr<torch::nn::Sequential> MakeMnistModel(const std::string& name) {
  if (name == "mlp") return MakeMnistMlp();
  if (name == "cnn") return MakeMnistCnn();
  return absl::InvalidArgumentError(
      absl::StrFormat("unknown model '%s'; use mlp or cnn", name));
}

}  // namespace ddprun::worker
