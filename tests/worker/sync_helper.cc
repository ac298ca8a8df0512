// A worker for SyncFromSurvivor's multi-process tests
// (recovery_sync_test.cc). Rank 0 holds the newest state (version 9: the
// record {9, 90, 900}, a float and a double tensor of 9s), the others an
// older one (version 5: the record {5}, tensors of 5s). With
// SYNC_HELPER_SOURCE_DIES=1 the source exits (as if killed) once its record
// is sent, before the tensors. Every rank that lives prints one line with
// what it holds afterwards: "rank R synced from S: record ..., tensors A B"
// or "rank R failed (...): record ..., tensors A B", and exits 0.
#include <ATen/ATen.h>
#include <unistd.h>

#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/str_join.h"
#include "worker/process_group.h"
#include "worker/recovery.h"
#include "worker/worker_env.h"

namespace {

int Run() {
  auto env = ddprun::worker::ReadWorkerEnv();
  if (!env.ok()) {
    std::cerr << "sync_helper: " << env.status() << std::endl;
    return 1;
  }
  ddprun::worker::ProcessGroupOptions options;
  options.backend = ddprun::worker::BackendKind::kGloo;
  options.timeout = std::chrono::seconds(20);
  auto group = ddprun::worker::CreateProcessGroup(*env, options);
  if (!group.ok()) {
    std::cerr << "sync_helper: " << group.status() << std::endl;
    return 1;
  }
  const bool newest = env->rank == 0;
  const double value = newest ? 9 : 5;
  std::vector<int64_t> record =
      newest ? std::vector<int64_t>{9, 90, 900} : std::vector<int64_t>{5};
  std::vector<at::Tensor> tensors = {at::full({1000}, value, at::kFloat),
                                     at::full({10}, value, at::kDouble)};
  ddprun::worker::StateSyncOptions sync_options;
  if (std::getenv("SYNC_HELPER_SOURCE_DIES") != nullptr) {
    sync_options.before_tensors = [&](int source) {
      if (source == env->rank) _exit(3);
    };
  }
  std::string outcome;
  try {
    absl::StatusOr<int> source = ddprun::worker::SyncFromSurvivor(
        *group, /*has_state=*/true, newest ? 9 : 5, record, tensors,
        sync_options);
    outcome = source.ok() ? "synced from " + std::to_string(*source)
                          : "failed (" + source.status().ToString() + ")";
  } catch (const std::exception& e) {
    outcome = "failed (" + std::string(e.what()).substr(0, 80) + ")";
  }
  std::cout << "rank " << env->rank << " " << outcome << ": record "
            << absl::StrJoin(record, ",") << ", tensors "
            << tensors[0].min().item<float>() << "-"
            << tensors[0].max().item<float>() << " "
            << tensors[1].min().item<double>() << "-"
            << tensors[1].max().item<double>() << std::endl;
  return 0;
}

}  // namespace

int main() { return Run(); }
