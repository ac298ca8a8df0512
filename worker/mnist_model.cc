#include "worker/mnist_model.h"

#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/linear.h>

namespace ddprun::worker {

torch::nn::Sequential MakeMnistMlp() {
  return torch::nn::Sequential(torch::nn::Flatten(),
                               torch::nn::Linear(784, 128),
                               torch::nn::ReLU(),
                               torch::nn::Linear(128, 10));
}

}  // namespace ddprun::worker
