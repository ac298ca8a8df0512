#pragma once

#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ddprun::launcher {

// What decides how many GPUs a node has, read without linking CUDA: the
// device nodes (/dev/nvidia0, /dev/nvidia1, ...) and the two variables that
// narrow them (unset: std::nullopt).
struct GpuProbe {
  int device_nodes = 0;
  std::optional<std::string> cuda_visible_devices;
  std::optional<std::string> nvidia_visible_devices;
  int cpus = 1;
};

// The GPUs a CUDA program would see: the device nodes, narrowed by
// NVIDIA_VISIBLE_DEVICES ("none"/"void"/empty: none; a list: at most that
// many) and by CUDA_VISIBLE_DEVICES (entries up to the first invalid one, as
// CUDA reads it: "-1" or an index past the devices ends the list).
int CountGpus(const GpuProbe& probe);

// --nproc-per-node as torchrun reads it: N, "cpu" (one per CPU), "gpu" (one
// per GPU; an error without one) or "auto" (one per GPU, else one per CPU).
absl::StatusOr<int> ResolveNprocPerNode(absl::string_view text,
                                        const GpuProbe& probe);

// This host's probe: /dev, the environment, sysconf.
GpuProbe ProbeThisHost();

}  // namespace ddprun::launcher
