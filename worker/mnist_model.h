#pragma once

#include <torch/nn/modules/container/sequential.h>

namespace ddprun::worker {

// The seed model, built exactly like Python's
// nn.Sequential(nn.Flatten(), nn.Linear(784, 128), nn.ReLU(),
// nn.Linear(128, 10)), so its state dict has the same keys ("1.weight",
// "1.bias", "3.weight", "3.bias") and loads there.
torch::nn::Sequential MakeMnistMlp();

}  // namespace ddprun::worker
