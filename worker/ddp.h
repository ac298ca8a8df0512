#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include <ATen/core/Tensor.h>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "worker/gradient_arena.h"
#include "worker/process_group.h"

namespace ddprun::worker {

struct DataParallelOptions {
  // Gradients are reduced in buckets of about this size, filled in reverse
  // parameter order (the order backward produces them), like
  // torch.nn.parallel.DistributedDataParallel's bucket_cap_mb.
  double bucket_mb = 25.0;
  // Start a bucket's allreduce from autograd hooks as soon as its gradients
  // are ready, overlapping backward. Off: everything is reduced in
  // FinishGradientSync, after backward.
  bool overlap = true;
  // PyTorch DDP's gradient_as_bucket_view, on the shared-memory gradient
  // path (ProcessGroup::direct): each parameter's grad is a view of its
  // bucket in this rank's resident buffer in the node's shared memory
  // (GradientAllreduce::MapResident), so autograd accumulates gradients
  // there and the allreduce sums them where they lie, in place: nothing is
  // copied in before it or out after it. Keep the views across steps with
  // DataParallel::ZeroGrad() (zeroes them in place) rather than the model's
  // zero_grad(set_to_none=true), which drops them: FinishGradientSync then
  // copies the new gradients into the views first (correct, but no faster
  // than without views). Ignored on the other paths (process group, world
  // of one, non-float or non-CPU parameters).
  bool gradient_as_bucket_view = false;
  // Without views, on the shared-memory path inside one node: backward's
  // gradients are allocated in this rank's buffer in the node's shared
  // memory (a GradientArena serves LibTorch's CPU allocations of exactly
  // the parameters' gradient sizes from it while this DataParallel lives),
  // so the allreduce reads and writes them where they lie instead of
  // copying them into the segment (ddprun-mnist on a 2-core VM: 1.3x the
  // samples/s at world 2, 2.1x with a 26 MB model; bench/collectives
  // README). Costs twice the gradients' size of the
  // node's shared memory per rank; when that cannot be reserved, or another
  // DataParallel's arena is installed, gradients stay private and are
  // copied (a log line says why). Steps whose gradients were not all placed
  // there on every rank are copied too; the results are the same.
  bool shared_gradients = true;
};

// Data parallelism for a LibTorch model, the C++ counterpart of DDP:
// construct it once with the model's parameters (same order on every rank),
// call BroadcastParameters() before training, and FinishGradientSync()
// between backward() and the optimizer step; after it every parameter's
// grad holds the average over the ranks.
//
// Threading: construction, BroadcastParameters and FinishGradientSync run on
// the training thread; autograd hooks may run on engine threads (CUDA), so
// per-step bucket state is guarded by mu_. Collectives are launched in bucket order on every rank, so
// ranks whose backward produced gradients in a different order still match.
// In a world of one (no collectives) every call is a no-op.
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

  // Waits for every bucket (launching those no hook launched: parameters
  // that got no gradient count as zero), averages, and writes the result
  // into each parameter's grad. Throws c10::Error when a collective fails.
  void FinishGradientSync();

  // Clears every parameter's gradient before the next backward: with
  // gradient views, zeroes them in place in the shared buffer (and puts
  // back any a program replaced); otherwise drops them, as the model's
  // zero_grad(set_to_none=true).
  void ZeroGrad();

  // Whether gradients live in the node's shared memory
  // (gradient_as_bucket_view asked for and usable here).
  bool gradient_views() const { return resident_ != nullptr; }
  // Whether backward's gradients are allocated in shared memory
  // (shared_gradients asked for and usable here).
  bool shared_gradients() const { return arena_ != nullptr; }
  // The node's shared-memory allreduce's counters (zero on other paths).
  ShmAllreduce::Stats shm_stats() const {
    return direct_ ? direct_->shm_stats() : ShmAllreduce::Stats();
  }
  // Per parameter and synced step with gradient views: found in place (the
  // fast path: autograd wrote them into the shared buffer), or copied in
  // (a program dropped the views, e.g. zero_grad(set_to_none=true)).
  struct GradientStats {
    int64_t in_place = 0;
    int64_t copied_in = 0;
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
  GradientPath gradient_path() const {
    return direct_ ? direct_->path() : GradientPath::kProcessGroup;
  }
  // Time spent in FinishGradientSync (launching and waiting), summed; for
  // the benchmark's "time in allreduce per step".
  double sync_seconds() const { return sync_seconds_; }

 private:
  struct Bucket {
    std::vector<int> params;      // indices into parameters_
    std::vector<int64_t> offsets;  // each parameter's offset in flat
    at::Tensor flat;              // the bucket's buffer, reduced in place
                                  // (undefined on the direct path)
    int64_t start = 0;            // offset in the resident buffer
    int64_t numel = 0;
    int pending = 0;              // gradients not yet copied in this step
    c10::intrusive_ptr<::c10d::Work> work;  // in flight when set
  };

  void OnGradient(int param, const at::Tensor& grad);
  // Copies a parameter's gradient into its bucket slot.
  void CopyIn(int param, const at::Tensor& grad, bool add_existing)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Launches ready buckets in order, from next_launch_.
  void LaunchReady() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // FinishGradientSync on the direct path: each bucket's gradients are
  // averaged in place by direct_.
  void ReduceGradientsInPlace();
  // Maps this rank's resident buffer and installs arena_ (shared_gradients).
  void ShareGradients(int rank);
  // The same with gradient views: each bucket summed in the shared buffer.
  void ReduceResidentGradients();
  // Parameter `param`'s view in the resident buffer, and whether its grad
  // is that view now.
  at::Tensor View(int param) const;
  bool GradIsView(int param) const;
  void ResetStep();

  std::vector<at::Tensor> parameters_;
  c10::intrusive_ptr<Collectives> collectives_;
  // When set (CPU float with Gloo), buckets are reduced synchronously by it
  // in FinishGradientSync instead of from hooks through collectives_.
  std::shared_ptr<GradientAllreduce> direct_;
  int world_size_ = 1;
  int progress_fd_ = -1;  // the group's: phases and steps (worker/phase.h)
  DataParallelOptions options_;

  std::vector<Bucket> buckets_;
  std::vector<int> bucket_of_;  // parameter index → bucket index
  std::vector<int> slot_of_;    // parameter index → slot in its bucket
  std::vector<unsigned> hooks_;  // hook handles, per parameter
  absl::Mutex mu_;
  std::vector<char> ready_ ABSL_GUARDED_BY(mu_);  // per parameter, this step
  size_t next_launch_ ABSL_GUARDED_BY(mu_) = 0;
  // Gradient views: this rank's resident buffer (owned by direct_) and
  // each parameter's offset in it; null without views.
  float* resident_ = nullptr;
  int64_t resident_floats_ = 0;
  std::vector<int64_t> resident_offset_;
  // Shared gradients (without views): the installed CPU allocator that
  // places them in the resident buffer; null otherwise.
  std::unique_ptr<GradientArena> arena_;
  bool warned_fallback_ = false;
  GradientStats gradient_stats_;
  std::atomic<bool> sync_{true};
  double sync_seconds_ = 0;
};

}  // namespace ddprun::worker
