#include "mnist/mnist_flags.h"

#include "CLI/CLI.hpp"
#include "common/cli.h"

namespace ddprun::worker {

MnistCommandLine ParseMnistFlags(int argc, const char* const* argv) {
  MnistCommandLine command;
  MnistTrainOptions& o = command.train;
  CLI::App app{
      "Trains the MNIST MLP with data parallelism; run it under "
      "ddprun (or alone, as one process)."};
  app.add_option("--epochs", o.epochs, "Epochs")->capture_default_str();
  app.add_option("--data-dir", o.data_dir,
                 "Folder of the IDX files [data/mnist, or "
                 "/usr/share/datasets/fashion-mnist for fashion-mnist]");
  app.add_option("--dataset", o.dataset, "mnist or fashion-mnist")
      ->capture_default_str();
  app.add_option("--model", o.model, "mlp (the seed) or cnn")
      ->capture_default_str();
  app.add_option("--hidden", o.hidden,
                 "Width of the MLP's hidden layer (1 to 65536)")
      ->capture_default_str();
  app.add_option("--seed", o.seed, "Seed of init and shuffling")
      ->capture_default_str();
  app.add_option("--batch-size", o.batch_size, "Batch size per rank")
      ->capture_default_str();
  app.add_option("--lr", o.lr, "SGD learning rate")->capture_default_str();
  app.add_option("--accumulate", o.accumulate,
                 "Micro-batches per optimizer step (gradient accumulation)")
      ->capture_default_str();
  app.add_option("--max-steps", o.max_steps, "Stop after N steps (0: no limit)")
      ->capture_default_str();
  app.add_option("--train-limit", o.train_limit,
                 "Use the first N training samples (0: all)");
  app.add_option("--test-limit", o.test_limit,
                 "Use the first N test samples (0: all)");
  app.add_option("--save", o.save_path, "Final model (rank 0); '' to skip")
      ->capture_default_str();
  app.add_option("--checkpoint-dir", o.checkpoint_dir,
                 "Write checkpoints here and resume from the newest");
  app.add_option("--checkpoint-every", o.checkpoint_every,
                 "Checkpoint every N steps (and each epoch)");
  app.add_option("--summary-json", o.summary_json,
                 "Write the final figures here (rank 0)");
  app.add_option(
      "--step-times", o.step_times,
      "Every rank appends '<step> <unix microseconds> <pid>' here per "
      "completed step (fault tests measure gaps from it)");
  app.add_option("--backend", o.backend, "auto, gloo or nccl")
      ->capture_default_str();
  app.add_option("--bucket-mb", o.bucket_mb, "Gradient bucket size in MB")
      ->capture_default_str();
  app.add_flag("--in-place,!--no-in-place", o.in_place,
               "Recover in place when a rank fails under ddprun (the others "
               "keep running); --no-in-place restarts every worker")
      ->capture_default_str();
  app.add_flag("--progress,!--no-progress", o.progress,
               "Rank 0 shows a progress line")
      ->capture_default_str();
  app.add_option("--gradient-sync", o.gradient_sync,
                 "auto: libddp chooses the gradient path (shared memory in a "
                 "node, hierarchical across nodes, NCCL on CUDA); "
                 "process-group: always the process group (debugging)")
      ->check(CLI::IsMember({"auto", "process-group"}))
      ->capture_default_str();
  // Hidden (group ""): a fault hook for tests.
  app.add_option("--test-die-in-sync", o.test_die_in_sync,
                 "Tests: source:PATH or receiver:PATH; the first worker in "
                 "that role of an in-place state sync to create PATH dies "
                 "in the middle of it")
      ->group("");
  app.add_option("--test-stop-in-sync", o.test_stop_in_sync,
                 "Tests: as --test-die-in-sync, but the worker stops itself "
                 "(SIGSTOP): a hang in the middle of a state sync")
      ->group("");
  app.add_option("--test-block-in-sync", o.test_block_in_sync,
                 "Tests: as --test-die-in-sync, but the worker blocks for "
                 "good: a deadlock in the middle of a state sync")
      ->group("");
  app.add_flag("--test-block-on-sigusr2", o.test_block_on_sigusr2,
               "Tests: on SIGUSR2 the worker blocks for good after its "
               "current step (a deadlock)")
      ->group("");
  app.add_flag("--test-spin-on-sigusr2", o.test_spin_on_sigusr2,
               "Tests: on SIGUSR2 the worker spins for good after its "
               "current step (a loop that never ends)")
      ->group("")
      ->excludes("--test-block-on-sigusr2");
  app.add_flag("--test-block-in-checkpoint-on-sigusr2",
               o.test_block_in_checkpoint_on_sigusr2,
               "Tests: on SIGUSR2 the worker blocks for good at the end of "
               "its next checkpoint write (a deadlock in a checkpoint)")
      ->group("")
      ->excludes("--test-block-on-sigusr2")
      ->excludes("--test-spin-on-sigusr2");
  app.add_flag("--test-spin-in-checkpoint-on-sigusr2",
               o.test_spin_in_checkpoint_on_sigusr2,
               "Tests: on SIGUSR2 the worker spins for good at the end of "
               "its next checkpoint write that is not its first (a loop "
               "that never ends in a checkpoint)")
      ->group("")
      ->excludes("--test-block-on-sigusr2")
      ->excludes("--test-spin-on-sigusr2")
      ->excludes("--test-block-in-checkpoint-on-sigusr2");
  common::AddLogLevelFlag(app, &command.logging.level);
  common::AddVersionFlag(app, "ddprun-mnist");
  command.exit_code = common::ParseFlags(app, argc, argv, "ddprun-mnist");
  return command;
}

}  // namespace ddprun::worker
