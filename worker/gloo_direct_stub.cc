// Built when Gloo's own library is not found (e.g. PyTorch's wheels, which
// link Gloo statically and privately): DirectAllreduce is unavailable and
// gradient sync goes through the process group.
#include "absl/status/status.h"
#include "worker/gloo_direct.h"

namespace ddprun::worker {

class DirectAllreduce::Impl {};

bool DirectAllreduce::Available() { return false; }

absl::StatusOr<std::unique_ptr<DirectAllreduce>> DirectAllreduce::Create(
    const c10::intrusive_ptr<::c10d::Store>& /*store*/, int /*rank*/,
    int /*size*/, const std::string& /*host*/, const std::string& /*iface*/,
    std::chrono::milliseconds /*timeout*/) {
  return absl::FailedPreconditionError(
      "this build of libddp has no direct Gloo allreduce (libgloo was not "
      "found); use --no-direct-allreduce");
}

DirectAllreduce::DirectAllreduce(std::unique_ptr<Impl> impl)
    : impl_(std::move(impl)) {}
DirectAllreduce::~DirectAllreduce() = default;
int DirectAllreduce::Register(float* /*data*/, int64_t /*count*/) { return -1; }
void DirectAllreduce::Run(int /*id*/) {}

}  // namespace ddprun::worker
