#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "common/auth.h"

namespace ddprun::launcher {

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
  int progress_fd = -1;    // -1: not set
  int control_fd = -1;     // DDPRUN_CONTROL_FD; -1: not set
  std::string shm_dir;     // DDPRUN_SHM_DIR; empty: not set
};

// The worker's complete environment: `base` (the agent's own, NAME=value)
// with the contract's names set over it. OMP_NUM_THREADS defaults to 1 when
// `base` does not set it and the node runs several workers, as torchrun does.
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
