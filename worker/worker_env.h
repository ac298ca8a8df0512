#pragma once

#include <functional>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "common/auth.h"

namespace ddprun::worker {

// What a worker learns from its launcher (ddprun or torchrun) through the
// environment; the names are common/worker_env.h. Without a launcher every
// field keeps its default: a world of one process, no store.
struct WorkerEnv {
  int rank = 0;
  int local_rank = 0;
  int world_size = 1;
  int local_world_size = 1;
  std::string master_addr;  // empty when unset
  int master_port = 0;      // 0 when unset
  int restart_count = 0;
  std::string error_file;  // TORCHELASTIC_ERROR_FILE; empty when unset

  // The rendezvous store (ddprun only): "host:port", run id and round.
  std::string store_endpoint;  // empty: no ddprun store
  std::string store_run_id;
  int64_t round = 0;
  // This node's address as peers reach it; Gloo binds its device to it.
  std::string local_addr;
  // How store calls authenticate: DDPRUN_TOKEN_FILE (the token read from
  // it) or DDPRUN_TOKEN, and DDPRUN_TLS_* (TLS on when the CA is set).
  common::Credentials credentials;
  // TORCHELASTIC_USE_AGENT_STORE: the launcher's agent serves the TCPStore
  // on MASTER_PORT, so rank 0 must not. Only "True" is true: torchrun sets
  // "False" when rank 0 is to serve it.
  bool use_agent_store = false;
  // GLOO_SOCKET_IFNAME: the interfaces Gloo binds to, comma-separated;
  // empty: the one of the host name.
  std::string gloo_socket_ifname;
  // Where one progress record per step goes; -1 when nobody listens.
  int progress_fd = -1;
  // Where the agent sends the next round's environment (in-place recovery,
  // worker/recovery.h); -1 when it does not.
  int control_fd = -1;

  bool distributed() const { return world_size > 1; }
  // "rank R of W (local L of LW)", for log lines.
  std::string Describe() const;
};

// The one reader of the worker environment in libddp: no other file of
// worker/ calls getenv but standby.cc, for the process name at start
// (scripts/check-layers.py checks it).
//
// Reads the environment of this process. A malformed value (a rank that is
// not a number, a rank outside the world) is an InvalidArgument error that
// names the variable, its value and the fix.
absl::StatusOr<WorkerEnv> ReadWorkerEnv();

// The same, from a lookup function; lets tests pass a map instead of setenv.
using EnvLookup = common::EnvLookup;
absl::StatusOr<WorkerEnv> ReadWorkerEnvFrom(const EnvLookup& lookup);

// DDPRUN_SHM_DIR, the node's shared-memory folder; empty when unset. Unlike
// ReadWorkerEnv it may be read by a prewarmed worker before its round.
std::string ReadShmDir(const EnvLookup& lookup = common::ProcessEnv);

// DDPRUN_STANDBY_FD as set; nullopt when unset (not a prewarmed process).
// AwaitActivation's input, read before the round's environment exists.
std::optional<std::string> ReadStandbyFd(
    const EnvLookup& lookup = common::ProcessEnv);

// TORCHELASTIC_ERROR_FILE; empty when unset. Read on its own where the rest
// of the environment may not exist yet (a prewarmed worker before its
// round, the error path of RunWorkerMain).
std::string ReadErrorFilePath(const EnvLookup& lookup = common::ProcessEnv);

}  // namespace ddprun::worker
