#pragma once

#include <functional>
#include <optional>
#include <string>

#include "absl/status/statusor.h"

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
  // The token for store calls, from DDPRUN_TOKEN_FILE or DDPRUN_TOKEN.
  std::string token;
  // TLS to the store (DDPRUN_TLS_*): on when tls_ca_file is set; mutual TLS
  // with a certificate and key. Empty: plaintext.
  std::string tls_ca_file;
  std::string tls_cert_file;
  std::string tls_key_file;
  std::string tls_server_name;
  // Where one progress record per step goes; -1 when nobody listens.
  int progress_fd = -1;

  bool distributed() const { return world_size > 1; }
  // "rank R of W (local L of LW)", for log lines.
  std::string Describe() const;
};

// Reads the environment of this process. A malformed value (a rank that is
// not a number, a rank outside the world) is an InvalidArgument error that
// names the variable, its value and the fix.
absl::StatusOr<WorkerEnv> ReadWorkerEnv();

// The same, from a lookup function; lets tests pass a map instead of setenv.
using EnvLookup = std::function<std::optional<std::string>(const char* name)>;
absl::StatusOr<WorkerEnv> ReadWorkerEnvFrom(const EnvLookup& lookup);

}  // namespace ddprun::worker
