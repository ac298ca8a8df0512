#pragma once

#include <c10/core/Device.h>

#include <chrono>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "worker/collectives.h"
#include "worker/gradient_path.h"
#include "worker/worker_env.h"

namespace ddprun::worker {

// libddp's internals behind ProcessGroup (not installed: worker/README.md).
class GradientAllreduce;
class LazyCollectives;

// The process group's backend. kAuto picks NCCL when LibTorch has CUDA and
// a GPU is visible, Gloo otherwise.
enum class BackendKind { kAuto, kGloo, kNccl };
absl::StatusOr<BackendKind> ParseBackend(const std::string& name);
std::string BackendName(BackendKind kind);

struct ProcessGroupOptions {
  BackendKind backend = BackendKind::kAuto;
  // Bounds the store exchanges of construction and every collective.
  std::chrono::milliseconds timeout = std::chrono::minutes(5);
  // Build the backend even in a world of one (checks of the backend itself);
  // without a configured store it then uses an in-process HashStore.
  bool force_collectives = false;
  // How DataParallel's gradients travel; the one knob of the gradient path.
  GradientSync gradient_sync = GradientSync::kAuto;
  // Bounds each wait of that gradient allreduce inside a node (a stopped or
  // hung local rank is an error after it); zero: `timeout`.
  std::chrono::milliseconds gradient_timeout{0};
};

// The communication side of one worker for one round.
struct ProcessGroup {
  BackendKind backend = BackendKind::kGloo;     // what auto resolved to
  c10::Device device = c10::Device(c10::kCPU);  // where tensors live
  c10::intrusive_ptr<::c10d::Store> store;      // null in a world of one
  c10::intrusive_ptr<Collectives> collectives;  // null in a world of one
  // Set where GradientSync::kAuto chose shared memory (CPU, Gloo, some
  // node with two ranks); gradient_path says what runs.
  std::shared_ptr<GradientAllreduce> direct;
  // When every rank shares one node and gradients go through shared
  // memory: `collectives` is this, a Gloo group formed on its first
  // collective (not at creation) and dropped by ReleaseIdleCollectives;
  // owned by `collectives`. Null otherwise (the group is formed at creation
  // and kept).
  LazyCollectives* lazy = nullptr;
  GradientPath gradient_path = GradientPath::kProcessGroup;
  int rank = 0;
  int world_size = 1;
  // DDPRUN_PROGRESS_FD (-1: none): where libddp reports this worker's
  // phases and steps (worker/phase.h).
  int progress_fd = -1;
};

// Builds the store and the backend from the environment: the rendezvous's
// gRPC store for this (run, round) under ddprun, a TCPStore at
// MASTER_ADDR:MASTER_PORT under torchrun. A world of one needs neither.
// Gloo binds to DDPRUN_LOCAL_ADDR (or loopback), or to the interfaces in
// GLOO_SOCKET_IFNAME. Failures (peer never came, bad interface, nccl without
// CUDA) are errors that say what to do.
absl::StatusOr<ProcessGroup> CreateProcessGroup(
    const WorkerEnv& env, const ProcessGroupOptions& options);

// Drops the Gloo group's threads and sockets until its next collective
// where the group is formed on demand (ProcessGroup::lazy); nothing
// otherwise. Call on every rank at the same point, between collectives:
// after the start-up broadcasts, before the training steps, whose
// gradients go through shared memory.
void ReleaseIdleCollectives(ProcessGroup& group);

}  // namespace ddprun::worker
