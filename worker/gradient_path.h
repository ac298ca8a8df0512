#pragma once

#include <string>

namespace ddprun::worker {

// Which way gradients travel. kProcessGroup is the reference
// (ProcessGroupGloo's allreduce, launched from autograd hooks); the other two
// are GradientAllreduce.
enum class GradientPath {
  kProcessGroup,  // ProcessGroupGloo (or NCCL)
  kSharedMemory,  // one node: ShmAllreduce only, no sockets
  kHierarchical,  // ShmAllreduce in each node, Gloo between node leaders
};
std::string GradientPathName(GradientPath path);

// ProcessGroupOptions::gradient_sync: who decides the gradient path.
enum class GradientSync {
  // libddp, from where the ranks are: on CPU with Gloo, shared memory inside
  // a node (backward's gradients allocated there and summed where they lie)
  // and hierarchical across nodes whenever some node holds two ranks that
  // share a DDPRUN_SHM_DIR (as under ddprun); on CUDA, NCCL; the process
  // group where nothing better applies (e.g. under torchrun, one rank per
  // node). The fastest path measured; correct on every path.
  kAuto,
  // Always the process group (ProcessGroupGloo or NCCL, buckets launched
  // from autograd hooks during backward), PyTorch DDP's path: for debugging
  // and for comparing against it.
  kProcessGroup,
};

}  // namespace ddprun::worker
