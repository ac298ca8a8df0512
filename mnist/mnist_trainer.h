#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"

namespace ddprun::worker {

// Everything ddprun-mnist's flags set; defaults are the seed program's.
struct MnistTrainOptions {
  int epochs = 10;
  std::string data_dir;  // empty: data/mnist, or Debian's fashion-mnist
  std::string dataset = "mnist";  // mnist | fashion-mnist
  std::string model = "mlp";      // mlp (the seed) | cnn
  int hidden = 128;  // mlp: width of the hidden layer (the seed's: 128)
  uint64_t seed = 0;
  int batch_size = 32;  // per rank
  double lr = 0.01;
  // Micro-batches per optimizer step; all but the last backward run under
  // DataParallel::NoSync (gradient accumulation).
  int accumulate = 1;
  int64_t max_steps = 0;    // > 0: stop after this many steps (tests)
  int64_t train_limit = 0;  // > 0: the first N training samples only
  int64_t test_limit = 0;   // > 0: the first N test samples only
  std::string save_path = "mnist_model.pt";  // final model, rank 0
  std::string checkpoint_dir;                // empty: no checkpoints
  int64_t checkpoint_every = 0;  // steps; 0: only at the end of each epoch
  std::string summary_json;      // rank 0 writes the final figures here
  // Every rank appends "<step> <unix microseconds> <pid>\n" here as it
  // completes a step (the fault harness measures the gaps from it and finds
  // the training processes by it); empty: nothing.
  std::string step_times;
  std::string backend = "auto";  // auto | gloo | nccl
  double bucket_mb = 25.0;
  // auto: libddp's choice (ProcessGroupOptions::gradient_sync);
  // process-group: GradientSync::kProcessGroup.
  std::string gradient_sync = "auto";
  bool progress = true;  // rank 0 shows a progress line
  // Recover in place under ddprun (worker/recovery.h): a failed rank is
  // replaced while the others keep running; false: every worker restarts
  // (from the last checkpoint), as under torchrun.
  bool in_place = true;
  // Tests only (a second fault in the middle of an in-place recovery):
  // "ROLE:PATH". The first worker of the job that reaches the middle of a
  // state sync (worker::SyncFromSurvivor: source chosen, record sent, the
  // tensors not) in ROLE, `source` (it sends its state) or `receiver` (a
  // new member that receives one), and that creates PATH, writes its step
  // there and kills itself (SIGKILL). Empty: none.
  std::string test_die_in_sync;
  // The same, but the worker stops itself (SIGSTOP) instead: it hangs in
  // the middle of the sync until the agent's --worker-timeout kills it.
  std::string test_stop_in_sync;
  // The same, but the worker blocks for good instead (a deadlock: asleep,
  // using no CPU, alive and not stopped) while its peers wait for it in the
  // sync's next collective; its agent finds it blocked.
  std::string test_block_in_sync;
  // Tests only (a deadlock on demand): on SIGUSR2 the worker blocks for
  // good once its current step is done: asleep, using no CPU, alive and
  // not stopped, while its peers wait for it in the next step's sync (or
  // in the middle of a state sync, when the signal finds it before that). A
  // worker signalled before it installed the handler dies of the signal.
  bool test_block_on_sigusr2 = false;
  // The same, but it spins for good instead: a loop on one core that never
  // ends, running and using CPU. It spins at the end of a checkpoint write
  // or an evaluation, in its phase, when the signal came there and this
  // process went through that phase before (its agent then knows what the
  // phase costs it in CPU); else after its step. At most one of the two.
  bool test_spin_on_sigusr2 = false;
  // As test_block_on_sigusr2, but only at the end of its next checkpoint
  // write (--checkpoint-dir), in the checkpoint's phase: a deadlock in a
  // checkpoint, while its peers wait for it in their next step's sync.
  bool test_block_in_checkpoint_on_sigusr2 = false;
  // As test_spin_on_sigusr2, but only at the end of its next checkpoint
  // write that is not its first: a loop that never ends in a checkpoint.
  bool test_spin_in_checkpoint_on_sigusr2 = false;
};

// Trains the seed MLP on MNIST with data parallelism over the ranks the
// environment describes (a world of one without a launcher). Rank 0 logs
// each epoch, saves the model and writes the summary. Errors the
// environment causes (missing data, unreachable store) come back as a status
// with one clear message; a failing collective too.
absl::Status RunMnistTraining(const MnistTrainOptions& options);

}  // namespace ddprun::worker
