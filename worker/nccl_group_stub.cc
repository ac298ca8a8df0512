#include "absl/status/status.h"
#include "worker/nccl_group.h"

namespace ddprun::worker {

bool NcclUsable() { return false; }

absl::StatusOr<c10::intrusive_ptr<Collectives>> CreateNcclCollectives(
    const c10::intrusive_ptr<::c10d::Store>& /*store*/,
    const WorkerEnv& /*env*/, std::chrono::milliseconds /*timeout*/) {
  return absl::FailedPreconditionError(
      "BackendKind::kNccl: this build of libddp has no NCCL (its LibTorch "
      "has no CUDA); use BackendKind::kGloo, or rebuild against a CUDA "
      "LibTorch "
      "(tests/gpu/run.sh shows how)");
}

}  // namespace ddprun::worker
