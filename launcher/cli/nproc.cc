#include "launcher/cli/nproc.h"

#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"

namespace ddprun::launcher {
namespace {

std::vector<std::string> Entries(absl::string_view list) {
  std::vector<std::string> out;
  for (absl::string_view item : absl::StrSplit(list, ',')) {
    out.emplace_back(absl::StripAsciiWhitespace(item));
  }
  return out;
}

}  // namespace

int CountGpus(const GpuProbe& probe) {
  int gpus = probe.device_nodes;
  if (probe.nvidia_visible_devices.has_value()) {
    std::string v = absl::AsciiStrToLower(
        absl::StripAsciiWhitespace(*probe.nvidia_visible_devices));
    if (v.empty() || v == "none" || v == "void") {
      gpus = 0;
    } else if (v != "all") {
      gpus = std::min<int>(gpus, Entries(v).size());
    }
  }
  if (probe.cuda_visible_devices.has_value()) {
    int visible = 0;
    for (const std::string& entry : Entries(*probe.cuda_visible_devices)) {
      int index = 0;
      if (absl::SimpleAtoi(entry, &index)) {
        if (index < 0 || index >= gpus) break;
      } else if (!absl::StartsWith(entry, "GPU-") &&
                 !absl::StartsWith(entry, "MIG-")) {
        break;
      }
      ++visible;
    }
    gpus = std::min(gpus, visible);
  }
  return gpus;
}

absl::StatusOr<int> ResolveNprocPerNode(absl::string_view text,
                                        const GpuProbe& probe) {
  if (text == "cpu") return std::max(1, probe.cpus);
  if (text == "gpu" || text == "auto") {
    int gpus = CountGpus(probe);
    if (gpus > 0) return gpus;
    if (text == "auto") return std::max(1, probe.cpus);
    return absl::InvalidArgumentError(
        "--nproc-per-node gpu: no GPU found (no /dev/nvidia<N>, or "
        "CUDA_VISIBLE_DEVICES / NVIDIA_VISIBLE_DEVICES hide them); write "
        "--nproc-per-node auto (one per CPU without GPUs) or a number");
  }
  int n = 0;
  if (!absl::SimpleAtoi(text, &n) || n < 1) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--nproc-per-node: '%s' is not a positive integer, cpu, gpu or auto; "
        "write e.g. --nproc-per-node 2",
        text));
  }
  return n;
}

GpuProbe ProbeThisHost() {
  GpuProbe probe;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/dev", ec)) {
    std::string name = entry.path().filename().string();
    if (name.size() > 6 && absl::StartsWith(name, "nvidia") &&
        std::all_of(name.begin() + 6, name.end(), absl::ascii_isdigit)) {
      ++probe.device_nodes;
    }
  }
  if (const char* v = getenv("CUDA_VISIBLE_DEVICES")) {
    probe.cuda_visible_devices = v;
  }
  if (const char* v = getenv("NVIDIA_VISIBLE_DEVICES")) {
    probe.nvidia_visible_devices = v;
  }
  probe.cpus = std::max(1L, sysconf(_SC_NPROCESSORS_ONLN));
  return probe;
}

}  // namespace ddprun::launcher
