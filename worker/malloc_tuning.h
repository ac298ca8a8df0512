#pragma once

#include <cstddef>
#include <functional>
#include <optional>
#include <string>

namespace ddprun::worker {

// glibc's malloc serves LibTorch's CPU tensors. A block above its mmap
// threshold is mapped afresh and unmapped on free, and free memory at the top
// of the heap past its trim threshold goes back to the kernel; the dynamic
// threshold that is meant to stop this moves with the order of frees. A
// training step allocates and frees the same large buffers (activations,
// im2col, gradients) every step, so a rank can pay a page fault for every
// page of them, every step: in examples/dist_cnn one rank of a world-2 run
// took 290,000-450,000 faults in 300 steps, its peer 100,000, and trained
// about a fifth slower (bench/examples/README.md, wave 18). Fixed
// thresholds keep the buffers mapped from one step to the next, as a
// caching allocator (jemalloc, tcmalloc, PyTorch's CUDA one) would.
struct MallocTuning {
  // Blocks below this come from the heap: glibc's largest (32 MiB on 64-bit).
  size_t mmap_threshold = size_t{32} << 20;
  // Free memory at the heap's top is kept up to this: the memory was in use
  // at the step's peak, and will be again at the next.
  size_t trim_threshold = size_t{1} << 30;
};

// The decision: the thresholds to set, or nullopt where the environment
// already tunes malloc (GLIBC_TUNABLES with glibc.malloc.*, the MALLOC_*_
// variables) or preloads another allocator (LD_PRELOAD), with `why_not`
// saying which. `lookup` reads the environment (a seam for tests).
std::optional<MallocTuning> ChooseMallocTuning(
    const std::function<const char*(const char*)>& lookup,
    std::string* why_not);

// The effect: sets ChooseMallocTuning's thresholds with mallopt, once per
// process (later calls return the first answer). Whether they were set.
bool TuneMallocForTraining();

}  // namespace ddprun::worker
