#pragma once

#include <optional>

#include "common/logging.h"
#include "mnist/mnist_trainer.h"

namespace ddprun::worker {

// What ddprun-mnist's command line asks for.
struct MnistCommandLine {
  MnistTrainOptions train;
  common::LoggingOptions logging{.name = "ddprun-mnist"};
  // Set when the program ends at once with this code: 0 after --help or
  // --version (printed), 2 after a bad flag or value (one line on stderr
  // naming it and the fix).
  std::optional<int> exit_code;
};

// Parses ddprun-mnist's flags (every training option, with its default
// shown in --help, and the hidden fault hooks of the tests).
MnistCommandLine ParseMnistFlags(int argc, const char* const* argv);

}  // namespace ddprun::worker
