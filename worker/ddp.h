#pragma once

#include <ATen/core/Tensor.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "worker/process_group.h"

namespace ddprun::worker {

class GradientArena;  // internal (worker/gradient_arena.h)

struct DataParallelOptions {
  // Gradients are reduced in buckets of about this size, filled in reverse
  // parameter order (the order backward produces them), like
  // torch.nn.parallel.DistributedDataParallel's bucket_cap_mb.
  double bucket_mb = 25.0;
  // Keep a step's large buffers mapped from one step to the next: fixed
  // malloc thresholds for the whole process, set once, unless the
  // environment tunes malloc itself (worker/malloc_tuning.h says why).
  // Without them a rank may page-fault through its buffers every step.
  bool tune_malloc = true;
};

// Data parallelism for a LibTorch model, the C++ counterpart of DDP:
// construct it once with the model's parameters (same order on every rank),
// call BroadcastParameters() before training, and FinishGradientSync()
// between backward() and the optimizer step; after it every parameter's
// grad holds the average over the ranks.
//
// The path is the group's (ProcessGroupOptions::gradient_sync):
// - shared memory (CPU float, ranks sharing a node): while this object
//   lives, a GradientArena places the tensors a backward pass allocates of
//   exactly the parameters' gradient sizes in this rank's buffer in the
//   node's shared memory, and FinishGradientSync sums each bucket where the
//   gradients lie; gradients elsewhere (a program assigned them, the arena
//   was full or could not be made) are copied through the segment, with
//   the same result. Across nodes (hierarchical) they are copied.
// - the process group (NCCL, or Gloo where nothing better applies or
//   GradientSync::kProcessGroup asks): buckets launched from autograd hooks
//   during backward, as DDP does.
// gradient_stats() counts which ran.
//
// Buffers (BatchNorm's running statistics) are not parameters: DDP's
// broadcast_buffers copies rank 0's to every rank before each forward;
// here a program calls BroadcastBuffers() there (or keeps them per rank).
//
// Threading: construction, BroadcastParameters and FinishGradientSync run on
// the training thread; autograd hooks may run on engine threads (CUDA), so
// per-step bucket state is guarded by mu_. Collectives are launched in
// bucket order on every rank, so ranks whose backward produced gradients in
// a different order still match. In a world of one (no collectives) every
// call is a no-op.
class DataParallel {
 public:
  DataParallel(std::vector<at::Tensor> parameters, const ProcessGroup& group,
               const DataParallelOptions& options = {});
  ~DataParallel();
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;

  // Rank 0's values for every parameter (and `extra`, e.g. buffers) are
  // copied to every rank, as one flat broadcast.
  void BroadcastParameters(const std::vector<at::Tensor>& extra = {});
  // Rank 0's values of `buffers` (e.g. the model's buffers()) copied to
  // every rank, as one flat broadcast: DDP's broadcast_buffers, to call
  // before each forward of a model with buffers.
  void BroadcastBuffers(const std::vector<at::Tensor>& buffers);

  // Waits for every bucket (launching those no hook launched: parameters
  // that got no gradient count as zero), averages, and writes the result
  // into each parameter's grad. Throws c10::Error when a collective fails.
  void FinishGradientSync();

  // Drops every parameter's gradient before the next backward, as the
  // model's zero_grad(set_to_none=true): the next backward then allocates
  // them anew, in shared memory on that path.
  void ZeroGrad();

  // Buckets synced so far, by how (tests assert the fast path ran).
  struct GradientStats {
    int64_t in_place = 0;  // summed where backward left them (shared memory)
    int64_t copied = 0;    // copied through the shared segment
    int64_t process_group = 0;  // through the process group's allreduce
  };
  const GradientStats& gradient_stats() const { return gradient_stats_; }

  // While a NoSync is alive, backward only accumulates local gradients
  // (gradient accumulation); the next synced step reduces the sum.
  class NoSync {
   public:
    explicit NoSync(DataParallel& ddp) : ddp_(ddp) { ddp_.sync_ = false; }
    ~NoSync() { ddp_.sync_ = true; }

   private:
    DataParallel& ddp_;
  };

  int num_buckets() const { return static_cast<int>(buckets_.size()); }
  // What carries the gradients: the group's GradientAllreduce path, or the
  // process group.
  GradientPath gradient_path() const;
  // Time spent in FinishGradientSync (launching and waiting), summed; for
  // the benchmark's "time in allreduce per step".
  double sync_seconds() const { return sync_seconds_; }

 private:
  struct Bucket {
    std::vector<int> params;       // indices into parameters_
    std::vector<int64_t> offsets;  // each parameter's offset in flat
    at::Tensor flat;               // the bucket's buffer, reduced in place
                                   // (undefined on the shared-memory path)
    int pending = 0;               // gradients not yet copied in this step
    c10::intrusive_ptr<::c10d::Work> work;  // in flight when set
  };

  void OnGradient(int param, const at::Tensor& grad);
  // Copies a parameter's gradient into its bucket slot.
  void CopyIn(int param, const at::Tensor& grad, bool add_existing)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Launches ready buckets in order, from next_launch_.
  void LaunchReady() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // FinishGradientSync on the process group.
  void ReduceBuckets();
  // FinishGradientSync on the shared-memory path: each bucket's gradients
  // averaged where they lie by direct_.
  void ReduceGradientsInPlace();
  // Maps this rank's buffer in the node's shared memory and installs arena_.
  void ShareGradients(int rank);
  void Broadcast(const std::vector<at::Tensor>& tensors);
  void ResetStep();

  std::vector<at::Tensor> parameters_;
  c10::intrusive_ptr<Collectives> collectives_;
  // When set (CPU float, the group's shared-memory path), buckets are
  // reduced synchronously by it in FinishGradientSync instead of from hooks
  // through collectives_.
  std::shared_ptr<GradientAllreduce> direct_;
  int world_size_ = 1;
  int progress_fd_ = -1;  // the group's: phases and steps (worker/phase.h)
  DataParallelOptions options_;

  std::vector<Bucket> buckets_;
  std::vector<int> bucket_of_;   // parameter index → bucket index
  std::vector<int> slot_of_;     // parameter index → slot in its bucket
  std::vector<unsigned> hooks_;  // hook handles, per parameter
  absl::Mutex mu_;
  std::vector<char> ready_ ABSL_GUARDED_BY(mu_);  // per parameter, this step
  size_t next_launch_ ABSL_GUARDED_BY(mu_) = 0;
  // Places backward's gradients in shared memory; null where it cannot.
  std::unique_ptr<GradientArena> arena_;
  bool warned_fallback_ = false;
  GradientStats gradient_stats_;
  std::atomic<bool> sync_{true};
  double sync_seconds_ = 0;
  // When the last gradient sync ended: a step's compute time runs from it.
  std::optional<std::chrono::steady_clock::time_point> last_sync_end_;
};

}  // namespace ddprun::worker
