#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "worker/torch_compat.h"

namespace ddprun::worker {

// Gradient allreduce straight on Gloo, for CPU training: a full mesh of TCP
// pairs in synchronous receive mode, driven by the calling thread, with
// Gloo's chunked ring algorithm bound once to each (fixed) gradient buffer.
// ProcessGroupGloo instead hands every collective to worker threads and its
// transport's event loop; on a few cores those thread hand-offs cost more
// than the transfer of a small model's gradients.
// The chunked ring reduces each chunk once and then copies it, so every rank
// holds bit-identical sums.
// Not thread-safe: one training thread calls Register and Run.
class DirectAllreduce {
 public:
  // False when this build has no Gloo library of its own to link
  // (gloo_direct_stub.cc); then Create fails and callers use the process
  // group.
  static bool Available();

  // Connects to the other ranks through `store` (keys under "ddp_direct/"),
  // binding to `iface` when set, else to `host`. Errors name the rank and
  // what to check.
  static absl::StatusOr<std::unique_ptr<DirectAllreduce>> Create(
      const c10::intrusive_ptr<::c10d::Store>& store, int rank, int size,
      const std::string& host, const std::string& iface,
      std::chrono::milliseconds timeout);
  ~DirectAllreduce();

  // Binds a float buffer that keeps its address; returns its id for Run.
  int Register(float* data, int64_t count);
  // Sums the buffer over all ranks, in place; blocks until done. Throws
  // c10::Error (or Gloo's exception) when a peer is gone.
  void Run(int id);

 private:
  class Impl;
  explicit DirectAllreduce(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace ddprun::worker
