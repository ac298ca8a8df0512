#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "common/auth.h"

namespace ddprun::launcher {

// The torch a Python worker imports, as far as the agent found out before
// the first round (ProbeWorkerTorch): torchrun of that generation decides
// which of the variables that differ between torch 1.x and 2.x are set.
struct WorkerTorch {
  int major = 0;  // 0: unknown (not a Python program, or no torch found)
  int minor = 0;
  // Whether torch ships its own libraries (a wheel: libuv built in since
  // 2.4) rather than a distribution's (Debian 13's 2.6 has no libuv).
  bool bundled_libs = true;
  bool known() const { return major > 0; }
};

// What one worker is told about itself; see common/worker_env.h for the
// meaning of each variable.
struct WorkerEnvSpec {
  std::string run_id;
  std::string role = "default";
  int local_rank = 0;
  int local_world_size = 1;
  int rank = 0;  // rank_offset + local_rank
  int world_size = 1;
  int group_rank = 0;        // node rank
  int group_world_size = 1;  // number of nodes
  std::string master_addr;
  int master_port = 0;
  int restart_count = 0;
  int max_restarts = 0;
  int64_t round = 0;
  std::string error_file;
  std::string store_endpoint;  // the rendezvous server, HOST:PORT
  std::string local_addr;
  // The store's token file and TLS settings (absolute paths); empty fields
  // are not set (--standalone is plaintext without a token).
  common::Credentials credentials;
  int progress_fd = -1;  // -1: not set
  int control_fd = -1;   // DDPRUN_CONTROL_FD; -1: not set
  std::string shm_dir;   // DDPRUN_SHM_DIR; empty: not set
  // torchrun 2.x's --virtual-local-rank: LOCAL_RANK=0 and the local rank's
  // entry of the agent's CUDA_VISIBLE_DEVICES (or the local rank itself).
  bool virtual_local_rank = false;
  WorkerTorch torch;
};

// The worker's complete environment: `base` (the agent's own, NAME=value)
// with the contract's names set over it. OMP_NUM_THREADS defaults to 1 when
// `base` does not set it and the node runs several workers, as torchrun does.
// DDPRUN_TOKEN is never passed on: workers get the agent's credentials as a
// file (DDPRUN_TOKEN_FILE), so user code does not find it in its environment.
std::vector<std::string> BuildWorkerEnv(const WorkerEnvSpec& spec,
                                        const std::vector<std::string>& base);

// The environment of a prewarmed worker before its round (--prewarm): `base`
// with DDPRUN_SHM_DIR (when `shm_dir` is set) and OMP_NUM_THREADS=1 when
// `base` does not set it, as the standby imports torch, which reads it once.
std::vector<std::string> BuildStandbyEnv(const std::vector<std::string>& base,
                                         const std::string& shm_dir);

// The agent's own environment as NAME=value strings.
std::vector<std::string> CurrentEnvironment();

}  // namespace ddprun::launcher
