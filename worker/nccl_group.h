#pragma once

// The seam to NCCL: the only code that names ProcessGroupNCCL or CUDA.
// nccl_group.cc implements it when LibTorch has CUDA (DDPRUN_WITH_NCCL);
// nccl_group_stub.cc otherwise, where every call says NCCL is unavailable.
#include "absl/status/statusor.h"
#include "worker/torch_compat.h"
#include "worker/worker_env.h"

namespace ddprun::worker {

// Whether this build has NCCL and at least one GPU is visible.
bool NcclUsable();

// One GPU per LOCAL_RANK: selects cuda:LOCAL_RANK (an error when there are
// fewer GPUs than local ranks) and builds ProcessGroupNCCL on `store`; rank
// 0 publishes the ncclUniqueId there and the others read it.
absl::StatusOr<c10::intrusive_ptr<Collectives>> CreateNcclCollectives(
    const c10::intrusive_ptr<::c10d::Store>& store, const WorkerEnv& env,
    std::chrono::milliseconds timeout);

}  // namespace ddprun::worker
