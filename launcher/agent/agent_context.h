#pragma once

#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "launcher/agent/agent_metrics.h"
#include "launcher/agent/worker_env.h"

namespace ddprun::launcher {

// What the agent knows of its node beyond the options, prepared by
// RunLaunch: the same for every round.
struct AgentContext {
  std::string store_endpoint;  // the rendezvous server workers talk to
  std::string local_addr;      // this node's address for its peers
  std::string node_id;
  // Passed on to the workers for their store calls.
  common::Credentials credentials;
  // The run's log folder, <--log-dir or a temporary one>/<run_id>_<random>:
  // attempt_<n>/<local_rank>/{error.json,stdout.log,stderr.log}, torchrun's.
  std::string scratch_dir;
  std::vector<std::string> worker_argv;
  std::vector<std::string> base_env;  // the agent's environment
  // The node's shared-memory folder (DDPRUN_SHM_DIR) for workers and
  // standbys; empty: none (the variable is left as the agent has it).
  std::string shm_dir;
  // The command of a standby worker (--prewarm, or the default for a
  // program that is not Python); empty: no prewarming.
  std::vector<std::string> standby_argv;
  // Prewarm only with standbys forked by a zygote that a worker forks where
  // its program waits for its round (StandbyPoolOptions::seed; never by
  // exec): the default, at no process start's cost. False: a zygote or
  // standbys of their own from the start, as --prewarm asks.
  bool prewarm_from_seed = false;
  // Whether global rank 0 of a prewarmed round listens on MASTER_PORT (a
  // Python program: torch's env:// TCPStore), so that the other ranks are
  // activated once it does. libddp programs use the rendezvous store.
  bool rank0_listens_on_master_port = false;
  // The agent's own TORCHELASTIC_ERROR_FILE (set by a scheduler), where the
  // root cause of a failed job goes, as torchrun does; empty: none.
  std::string agent_error_file;
  // The torch the Python workers import (ProbeWorkerTorch); unknown for
  // other programs.
  WorkerTorch worker_torch;
  // --metrics-port: what /metrics shows of this node's workers; null: off.
  AgentMetrics* metrics = nullptr;
  // Picks the MASTER_PORT this node offers for a round (binds port 0 on
  // `local_addr`); null: a HeldPort the agent holds until the round's
  // workers start. Tests pass a fixed port.
  std::function<absl::StatusOr<int>(const std::string& local_addr)>
      reserve_port;
};

}  // namespace ddprun::launcher
