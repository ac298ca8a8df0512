// Compiled only when LibTorch has CUDA (CMake sets DDPRUN_WITH_NCCL).
#include "worker/nccl_group.h"

#include <c10/cuda/CUDAFunctions.h>

#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "worker/exception_text.h"

namespace ddprun::worker {

bool NcclUsable() { return c10::cuda::device_count() > 0; }

absl::StatusOr<c10::intrusive_ptr<Collectives>> CreateNcclCollectives(
    const c10::intrusive_ptr<::c10d::Store>& store, const WorkerEnv& env,
    std::chrono::milliseconds timeout) {
  int gpus = c10::cuda::device_count();
  if (env.local_rank >= gpus) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "LOCAL_RANK %d needs GPU %d but this node has %d GPU(s); run at most "
        "%d processes per node (--nproc-per-node) or set "
        "ProcessGroupOptions::backend to BackendKind::kGloo",
        env.local_rank, env.local_rank, gpus, gpus));
  }
  c10::cuda::set_device(static_cast<c10::DeviceIndex>(env.local_rank));
  try {
    auto options = ::c10d::ProcessGroupNCCL::Options::create();
    options->timeout = timeout;
    return c10::intrusive_ptr<Collectives>(
        c10::make_intrusive<::c10d::ProcessGroupNCCL>(store, env.rank,
                                                      env.world_size, options));
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrFormat(
        "cannot create the NCCL process group (rank %d of %d): %s", env.rank,
        env.world_size, ExceptionText(e)));
  }
}

}  // namespace ddprun::worker
