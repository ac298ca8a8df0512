#include "launcher/agent/worker_env.h"

#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/worker_env.h"

extern char** environ;

namespace ddprun::launcher {

namespace env = ::ddprun::common::env;

std::vector<std::string> BuildWorkerEnv(const WorkerEnvSpec& spec,
                                        const std::vector<std::string>& base) {
  std::map<std::string, std::string> vars;
  for (const std::string& entry : base) {
    size_t eq = entry.find('=');
    if (eq == std::string::npos) continue;
    vars[entry.substr(0, eq)] = entry.substr(eq + 1);
  }
  auto set = [&](const char* name, const auto& value) {
    vars[name] = absl::StrCat(value);
  };
  set(env::kRank, spec.rank);
  set(env::kLocalRank, spec.local_rank);
  set(env::kGroupRank, spec.group_rank);
  // One role per job: the role rank is the global rank.
  set(env::kRoleRank, spec.rank);
  set(env::kLocalWorldSize, spec.local_world_size);
  set(env::kWorldSize, spec.world_size);
  set(env::kGroupWorldSize, spec.group_world_size);
  set(env::kRoleWorldSize, spec.world_size);
  set(env::kRoleName, spec.role);
  set(env::kMasterAddr, spec.master_addr);
  set(env::kMasterPort, spec.master_port);
  set(env::kRestartCount, spec.restart_count);
  set(env::kMaxRestarts, spec.max_restarts);
  set(env::kRunId, spec.run_id);
  set(env::kErrorFile, spec.error_file);
  set(env::kUseAgentStore, "False");
  // As torchrun: one thread each only when several workers share the node.
  if (spec.local_world_size > 1 &&
      vars.find(env::kOmpNumThreads) == vars.end()) {
    set(env::kOmpNumThreads, 1);
  }
  // A failed NCCL collective raises instead of hanging, so that the agent
  // sees the worker fail: torchrun 1.13 sets the first name, torchrun 2.x
  // the second (torch >= 2.2 warns about the first). Without a known torch
  // (a LibTorch program, or no torch found) both, so that either reads it.
  std::vector<const char*> nccl_names;
  if (!spec.torch.known() || spec.torch.major < 2) {
    nccl_names.push_back("NCCL_ASYNC_ERROR_HANDLING");
  }
  if (!spec.torch.known() || spec.torch.major >= 2) {
    nccl_names.push_back("TORCH_NCCL_ASYNC_ERROR_HANDLING");
  }
  for (const char* name : nccl_names) {
    if (vars.find(name) == vars.end()) set(name, 1);
  }
  // Rank 0 hosts the env:// TCPStore (TORCHELASTIC_USE_AGENT_STORE=False):
  // torch >= 2.4 starts it with libuv unless USE_LIBUV=0, and a torch built
  // without libuv (Debian 13's 2.6) then fails in init_process_group.
  // torchrun sets no USE_LIBUV, so it is set only where that torch may be
  // the one (a distribution's torch >= 2.4, or an unknown one); torch < 2.4
  // ignores it. A user's own USE_LIBUV wins.
  bool may_lack_libuv = !spec.torch.known() ||
                        (!spec.torch.bundled_libs &&
                         (spec.torch.major > 2 ||
                          (spec.torch.major == 2 && spec.torch.minor >= 4)));
  if (may_lack_libuv && vars.find("USE_LIBUV") == vars.end()) {
    set("USE_LIBUV", 0);
  }
  if (spec.virtual_local_rank) {
    std::string device = absl::StrCat(spec.local_rank);
    auto visible = vars.find("CUDA_VISIBLE_DEVICES");
    if (visible != vars.end()) {
      std::vector<std::string> devices = absl::StrSplit(visible->second, ',');
      // The launch checked that the list has an entry per local rank.
      if (spec.local_rank < static_cast<int>(devices.size())) {
        device =
            std::string(absl::StripAsciiWhitespace(devices[spec.local_rank]));
      }
    }
    set(env::kLocalRank, 0);
    set("CUDA_VISIBLE_DEVICES", device);
  }
  set(env::kStoreEndpoint, spec.store_endpoint);
  set(env::kStoreRunId, spec.run_id);
  set(env::kRound, spec.round);
  set(env::kLocalAddr, spec.local_addr);
  // The agent's own credentials, never ones left in its environment: a
  // worker talks to the store exactly as its agent talks to the rendezvous.
  spec.credentials.ToEnv(vars);
  vars.erase(env::kToken);
  if (!spec.shm_dir.empty()) set(env::kShmDir, spec.shm_dir);
  if (spec.progress_fd >= 0) {
    set(env::kProgressFd, spec.progress_fd);
  } else {
    vars.erase(env::kProgressFd);
  }
  if (spec.control_fd >= 0) {
    set(env::kControlFd, spec.control_fd);
  } else {
    vars.erase(env::kControlFd);
  }
  std::vector<std::string> out;
  out.reserve(vars.size());
  for (const auto& [name, value] : vars) out.push_back(name + "=" + value);
  return out;
}

std::vector<std::string> BuildStandbyEnv(const std::vector<std::string>& base,
                                         const std::string& shm_dir) {
  std::vector<std::string> out;
  bool has_omp = false;
  const std::string shm_prefix = absl::StrCat(env::kShmDir, "=");
  const std::string omp_prefix = absl::StrCat(env::kOmpNumThreads, "=");
  const std::string token_prefix = absl::StrCat(env::kToken, "=");
  for (const std::string& entry : base) {
    if (absl::StartsWith(entry, token_prefix)) continue;  // as BuildWorkerEnv
    // A process sees only the first of two entries of one name.
    if (!shm_dir.empty() && absl::StartsWith(entry, shm_prefix)) continue;
    has_omp |= absl::StartsWith(entry, omp_prefix);
    out.push_back(entry);
  }
  if (!shm_dir.empty()) out.push_back(shm_prefix + shm_dir);
  if (!has_omp) out.push_back(omp_prefix + "1");
  return out;
}

std::vector<std::string> CurrentEnvironment() {
  std::vector<std::string> out;
  for (char** e = environ; *e != nullptr; ++e) out.emplace_back(*e);
  return out;
}

}  // namespace ddprun::launcher
