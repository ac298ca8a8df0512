#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

namespace ddprun::worker {

// One training step as reported.
struct StepProgress {
  int epoch = 0;  // 0-based
  int epochs = 1;
  int64_t step = 0;  // global steps done, 1-based after the first
  int64_t steps_per_epoch = 0;
  int64_t step_in_epoch = 0;
  double loss = 0;
  double samples_per_sec = 0;    // all ranks together, over the epoch so far
  int64_t samples_per_step = 0;  // all ranks together
};

struct ProgressOptions {
  int fd = -1;           // DDPRUN_PROGRESS_FD; -1: no heartbeat
  bool display = false;  // rank 0 shows progress
  // A terminal gets one live line, redrawn at most this often; anything else
  // gets a plain line this often.
  std::chrono::milliseconds tty_interval{200};
  std::chrono::milliseconds plain_interval{10000};
  FILE* out = stderr;
};

// Reports training progress: a small record per step on the agent's pipe
// (the heartbeat that tells ddprun the worker is not hung; non-blocking, a
// full pipe drops the record, a closed one is ignored), and for rank 0 a
// human view of epoch, step, loss, samples/s and ETA. Owned by the training
// thread; not thread-safe.
class ProgressReporter {
 public:
  explicit ProgressReporter(const ProgressOptions& options);
  ~ProgressReporter();
  ProgressReporter(const ProgressReporter&) = delete;
  ProgressReporter& operator=(const ProgressReporter&) = delete;

  void OnStep(const StepProgress& progress);
  // Ends a live line so that the next log line starts clean.
  void EndLine();

  // The record written to the pipe: "step <step> epoch <epoch>\n".
  static std::string Record(const StepProgress& progress);
  // The human line: "epoch 1/10 step 120/1875 loss 0.4321 98000 samples/s
  // ETA 3m12s".
  static std::string Line(const StepProgress& progress);

 private:
  ProgressOptions options_;
  bool tty_ = false;
  bool line_open_ = false;
  std::chrono::steady_clock::time_point last_display_;
};

}  // namespace ddprun::worker
