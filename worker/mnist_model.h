#pragma once

#include <string>

#include <torch/nn/modules/container/sequential.h>

#include "absl/status/statusor.h"

namespace ddprun::worker {

// The seed model, built exactly like Python's
// nn.Sequential(nn.Flatten(), nn.Linear(784, 128), nn.ReLU(),
// nn.Linear(128, 10)), so its state dict has the same keys ("1.weight",
// "1.bias", "3.weight", "3.bias") and loads there.
torch::nn::Sequential MakeMnistMlp();

// A small CNN, nn.Sequential(nn.Conv2d(1, 8, 5), nn.ReLU(),
// nn.MaxPool2d(2), nn.Flatten(), nn.Linear(8 * 12 * 12, 10)): a second
// shape of model for the data-parallel tests.
torch::nn::Sequential MakeMnistCnn();

// --model: "mlp" (the seed) or "cnn".
absl::StatusOr<torch::nn::Sequential> MakeMnistModel(const std::string& name);

}  // namespace ddprun::worker
