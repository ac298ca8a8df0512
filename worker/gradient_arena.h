#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"

namespace ddprun::worker {

struct GradientArenaOptions {
  // Where the blocks lie: this rank's resident buffer in the node's shared
  // memory (GradientAllreduce::MapResident), and what keeps it mapped
  // (blocks may outlive the group).
  void* base = nullptr;
  size_t bytes = 0;
  std::shared_ptr<void> keep_alive;
  // The allocation sizes it serves, in bytes: a model's gradient sizes.
  std::vector<size_t> sizes;
  // Serve only allocations made while a backward pass runs on the calling
  // thread (autograd's current graph task): forward's activations and the
  // optimizer's state never land here, whatever their size. Off: any
  // allocation of those sizes (tests of the arena itself).
  bool backward_only = true;
};

// DataParallel's gradients in shared memory: installed as LibTorch's CPU
// allocator while a DataParallel on the shared-memory path lives, it serves
// the allocations a backward pass makes of exactly the model's gradient
// sizes from this rank's resident buffer, so that the
// tensors backward hands to AccumulateGrad (and steals as the grads) are
// already where the other local ranks can read them, and
// ShmAllreduce::AllreduceInPlace sums them where they lie: no copy into the
// segment. Every other allocation (other sizes, anything outside backward,
// those sizes once the buffer is full) goes to the allocator that was
// installed before, untouched. The process-wide replacement is scoped: it
// starts with Install, ends with the destructor, and serves nothing else.
// Blocks are kept per size for reuse (a training loop allocates the same
// sizes every step).
//
// Written here rather than taken from a library: LibTorch has no
// allocator that places chosen tensors in a given shared mapping, and
// what is needed (one free list per size, a bump pointer) is a few dozen
// lines.
//
// At most one arena is installed per process; a second Install is refused.
class GradientArena {
 public:
  static absl::StatusOr<std::unique_ptr<GradientArena>> Install(
      GradientArenaOptions options);
  // Puts the previous CPU allocator back (if this one is still installed).
  // Blocks already served stay valid until their tensors free them.
  ~GradientArena();
  GradientArena(const GradientArena&) = delete;
  GradientArena& operator=(const GradientArena&) = delete;

  struct Stats {
    int64_t served = 0;    // allocations placed in the arena
    int64_t declined = 0;  // of a served size, but the arena was full
    int64_t in_use_bytes = 0;
  };
  Stats stats() const;

  class Allocator;  // gradient_arena.cc

 private:
  explicit GradientArena(Allocator* allocator) : allocator_(allocator) {}
  Allocator* allocator_;  // never freed: see gradient_arena.cc
};

}  // namespace ddprun::worker
