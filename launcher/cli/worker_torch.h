#pragma once

#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "launcher/agent/worker_env.h"

namespace ddprun::launcher {

// Which torch `python` imports under the environment `env` (NAME=value), so
// that the workers' environment follows the torchrun of that torch (1.13 or
// 2.x). Runs the interpreter once, without importing torch (~50 ms), for up
// to 10 s; unknown (WorkerTorch{}) when it fails or finds no torch.
WorkerTorch ProbeWorkerTorch(const std::string& python,
                             const std::vector<std::string>& env);

// The probe's output: "<version>\n<1|0>\n" (the second line: torch's
// libraries are its own, as in a wheel) or "none\n".
WorkerTorch ParseWorkerTorch(absl::string_view output);

}  // namespace ddprun::launcher
