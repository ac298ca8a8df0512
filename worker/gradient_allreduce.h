#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "worker/gradient_path.h"
#include "worker/shm_allreduce.h"
#include "worker/torch_compat.h"

namespace ddprun::worker {

struct GradientAllreduceOptions {
  // The round's store; keys under "ddp_grad/".
  c10::intrusive_ptr<::c10d::Store> store;
  int rank = 0;
  int world_size = 1;
  // This rank's node: ranks with the same host and shared-memory folder
  // (DDPRUN_SHM_DIR, one per agent) reduce through one segment there. Empty
  // folder: this rank shares memory with nobody (a node of its own).
  // ReadShmDir() (worker_env.h) reads it from the environment.
  std::string host;
  std::string shm_dir;
  // The segment's file name in shm_dir, the same on every rank of a round.
  std::string segment_name;
  std::chrono::milliseconds timeout = std::chrono::minutes(5);
  // Slices of the shared segment inside one node; across nodes each slice
  // is also one Gloo allreduce between the node leaders, whose latency
  // larger slices amortise.
  int64_t slice_floats = ShmAllreduceOptions().slice_floats;
  int64_t hierarchical_slice_floats = 256 * 1024;
  // Forms the Gloo group of the node leaders (rank = node index) on `store`;
  // called on leaders only, when there is more than one node.
  std::function<absl::StatusOr<c10::intrusive_ptr<Collectives>>(
      const c10::intrusive_ptr<::c10d::Store>& store, int rank, int size)>
      make_leaders;
};

// The CPU gradient allreduce of DataParallel (float sums, in place, run in
// the training thread): through shared memory inside a node, and
// hierarchically across nodes (reduce in the node, allreduce between the
// node leaders over Gloo, every local rank copies the result), so that
// every rank ends with the same bits. Correct for any count and any world;
// a dead or stopped peer ends it with an error within the timeout.
class GradientAllreduce {
 public:
  // Collective over all ranks: each publishes its node, all derive the same
  // layout. nullptr (and a log line saying why) when no node has two ranks
  // that share a folder: then the process group is as fast and is used.
  static absl::StatusOr<std::unique_ptr<GradientAllreduce>> Create(
      const GradientAllreduceOptions& options);
  ~GradientAllreduce();

  // Sums `data` over all ranks, in place; blocks until done. Throws
  // c10::Error naming the failed peer when it cannot finish.
  void Run(float* data, int64_t count);
  // The same for a buffer made of parts (e.g. a bucket's gradients where
  // they lie); each element becomes the sum / divisor (DataParallel's
  // average, divided in the same pass).
  void Run(absl::Span<const ShmAllreduce::Part> parts, float divisor);

  // Run for parts that may lie in the ranks' resident buffers (gradients a
  // GradientArena placed there): summed where they lie when every local
  // rank's do (ShmAllreduce::AllreduceInPlace), else as Run. Inside one
  // node with others only (in_place_capable); elsewhere it is Run.
  void RunInPlace(absl::Span<const ShmAllreduce::Part> parts, float divisor);
  // Whether RunInPlace can sum anything in place here: this rank shares
  // its node with others, and the group has one node.
  bool in_place_capable() const { return shm_ != nullptr && !hierarchical_; }
  // Keeps this rank's resident buffer mapped while held (tensors placed in
  // it may outlive this object); null before MapResident or alone.
  std::shared_ptr<void> resident_keep_alive() const {
    return shm_ ? shm_->resident_keep_alive() : nullptr;
  }

  // A buffer of `floats` for this rank in the node's shared memory, which
  // every local rank maps (ShmAllreduce::MapResident): DataParallel's
  // GradientArena places backward's gradients there, and RunInPlace sums
  // them where they lie. Collective over the ranks of a node (the same
  // `floats` on each); once. Inside one node with others only
  // (in_place_capable).
  absl::StatusOr<float*> MapResident(int64_t floats);

  GradientPath path() const { return path_; }
  // How many Run calls completed: tests check that this path ran.
  int64_t runs() const { return runs_.load(); }
  // The node's segment's counters (which schedule ran, how waits ended);
  // all zero where this rank shares its node with no other.
  ShmAllreduce::Stats shm_stats() const {
    return shm_ ? shm_->stats() : ShmAllreduce::Stats();
  }
  // "shared memory (2 local ranks, /dev/shm/ddprun-x/...)", for logs.
  const std::string& description() const { return description_; }

 private:
  GradientAllreduce() = default;
  absl::Status BetweenNodes(float* data, int64_t count);

  GradientPath path_ = GradientPath::kSharedMemory;
  std::string description_;
  std::unique_ptr<ShmAllreduce> shm_;        // null: alone in the node
  c10::intrusive_ptr<Collectives> leaders_;  // set on leaders, >1 node
  // A leaders' allreduce given up when the round ended (WaitUnlessAborted):
  // the destructor hands it, the leaders' group and the segment it writes
  // to a thread that drops them once it completes.
  c10::intrusive_ptr<::c10d::Work> abandoned_;
  bool hierarchical_ = false;
  int64_t slice_floats_ = 0;
  std::atomic<int64_t> runs_{0};
  float* resident_ = nullptr;
};

}  // namespace ddprun::worker
