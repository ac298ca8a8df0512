// ddprun-mnist: the seed program in C++. Parses flags into
// MnistTrainOptions and runs RunMnistTraining; nothing else lives here.
#include "common/logging.h"
#include "mnist/mnist_flags.h"
#include "mnist/mnist_trainer.h"
#include "worker/error_file.h"
#include "worker/fast_exit.h"

int main(int argc, char** argv) {
  ddprun::worker::MnistCommandLine command =
      ddprun::worker::ParseMnistFlags(argc, argv);
  if (command.exit_code.has_value()) return *command.exit_code;
  ddprun::common::InitLogging(command.logging);
  // Training has closed its files and its process group by now.
  ddprun::worker::ExitWithoutTeardown(ddprun::worker::RunWorkerMain(
      "ddprun-mnist",
      [&] { return ddprun::worker::RunMnistTraining(command.train); }));
}
