#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "common/auth.h"
#include "launcher/agent/phase_bounds.h"

namespace ddprun::launcher {

// Rendezvous settings from --rdzv-conf (seconds in the flag, as torchrun).
struct RdzvConf {
  // Once MIN nodes joined, wait this long for more before closing a round.
  absl::Duration last_call_timeout = absl::Seconds(30);
  // How long a Join may wait for its round to close (torchrun: 600 s).
  absl::Duration join_timeout = absl::Seconds(600);
  // torchrun: how long closing the rendezvous may take. Here: how long an
  // agent whose workers succeeded keeps telling an unreachable rendezvous
  // so (bounded by join_timeout).
  absl::Duration close_timeout = absl::Seconds(60);
  // torchrun: the c10d store client's timeout, which is how long an agent
  // waits for a rendezvous that does not answer yet (torchrun: 60 s). Here
  // the same: how long a Join (or a Leave) retries an unreachable
  // rendezvous (bounded by join_timeout) before the agent exits 1.
  absl::Duration read_timeout = absl::Seconds(60);
  // Also how soon a node hears that its round ended elsewhere (the answer
  // to its next beat): a quarter second keeps that out of the way of an
  // in-place recovery. Large jobs are told a longer one by the server
  // (ddprun-rendezvous --heartbeat-budget).
  absl::Duration heartbeat_interval = absl::Milliseconds(250);
  // A node silent this long is dropped from the job by the server.
  absl::Duration heartbeat_timeout = absl::Seconds(10);
  // c10d's is_host: whether this agent serves the rendezvous at
  // --rdzv-endpoint; unset: it does when the endpoint is its own address
  // and nothing listens there yet.
  std::optional<bool> is_host;
  // torchrun keys without a meaning here ("key=value"), logged once.
  std::vector<std::string> ignored;
};

// Which of a worker's streams go to files (torchrun's Std: 0 none, 1 stdout,
// 2 stderr, 3 both), for every local rank or per local rank ("0:1,1:2").
struct PerRankStreams {
  int all = 0;
  std::map<int, int> by_local_rank;
  int For(int local_rank) const {
    auto it = by_local_rank.find(local_rank);
    return it == by_local_rank.end() ? all : it->second;
  }
};

// Everything `ddprun` (the launch command) was asked to do. Filled by
// ParseCommandLine; read-only afterwards.
struct LaunchOptions {
  int min_nodes = 1;
  int max_nodes = 1;
  int nproc_per_node = 1;
  std::string rdzv_endpoint;  // HOST:PORT; empty only with --standalone
  std::string rdzv_id = "none";
  std::string rdzv_backend = "ddprun";  // c10d / ddprun, both mean ours
  // How the rendezvous is found (decided from the flags): kConnect dials
  // --rdzv-endpoint; kHostOrConnect serves it in-process when it is this
  // host's address and free, else dials it (torchrun's c10d is_host);
  // kHost serves it (static node rank 0, is_host=1); kStandalone serves
  // one on a loopback port for this node alone.
  enum class RdzvMode { kConnect, kHostOrConnect, kHost, kStandalone };
  RdzvMode rdzv_mode = RdzvMode::kConnect;
  RdzvConf rdzv_conf;
  bool standalone = false;
  int node_rank = -1;  // -1: the server assigns it
  int max_restarts = 0;
  absl::Duration monitor_interval = absl::Milliseconds(100);
  // --worker-timeout: a worker that reported progress once and then is
  // silent this long, in any phase, is hung (it fixes every phase's bound in
  // hang_bounds but the start's); zero: the bounds adapt (hang_bounds).
  absl::Duration worker_timeout = absl::ZeroDuration();
  // How long a worker may stay in each phase of its life, and stopped
  // (--hang-bound, --hang-factor, --worker-timeout).
  PhaseBoundsOptions hang_bounds;
  // --straggler-policy replace: a local rank the server names a straggler
  // (ddprun-rendezvous --straggler-factor) is treated as failed and killed,
  // so that in-place recovery replaces it (with --prewarm, by a standby);
  // false (report): it is only reported.
  bool replace_stragglers = false;
  // Between SIGTERM and SIGKILL when stopping workers; one shared deadline.
  // torchrun 2.x's shutdown_timeout and default.
  absl::Duration shutdown_grace = absl::Seconds(30);
  // torchrun 2.x: every worker gets LOCAL_RANK=0 and only its own GPU in
  // CUDA_VISIBLE_DEVICES (the agent's list, indexed by local rank).
  bool virtual_local_rank = false;
  // Stopped by a signal: exit 1 as torchrun (false), or 128+signal as a
  // shell reports it (--signal-exit-code shell: what a systemd unit's
  // SuccessExitStatus=SIGTERM counts as a clean stop).
  bool signal_exit_code_shell = false;
  std::string log_dir;  // empty: workers inherit the agent's stdout/stderr
  PerRankStreams redirects;
  PerRankStreams tee;
  // Local ranks whose console output is shown; empty: all.
  std::vector<int> local_ranks_filter;
  std::string role = "default";
  bool no_python = false;
  bool run_module = false;  // -m: `python -m program`
  // Start the next round's Python workers ahead of time, up to their
  // imports, so that a restart skips interpreter and torch start-up.
  bool prewarm = false;
  std::string master_addr;  // static rendezvous: where node rank 0 serves it
  // Static rendezvous: its port. Standalone (one node, torchrun's static
  // default form): the workers' MASTER_PORT; 0: a free port.
  int master_port = 0;
  std::string local_addr;  // empty: derived from the endpoint
  std::string log_level = "info";
  // --metrics-port: serve Prometheus /metrics of this agent's workers
  // (restarts, workers running, last progress age); -1: off, 0: the kernel
  // picks a port (logged).
  int metrics_port = -1;
  std::string metrics_host = "127.0.0.1";
  // torchrun flags without a meaning here ("--flag value"), logged once.
  std::vector<std::string> ignored_flags;
  // --token-file and --tls-*: how the agent proves itself to the rendezvous
  // server and checks it (the token is loaded later).
  common::Credentials auth;

  // The training program and its arguments, untouched.
  std::vector<std::string> program;
};

// `ddprun status`: prints what the rendezvous server knows.
struct StatusOptions {
  std::string rdzv_endpoint;
  std::string rdzv_id;  // empty: every job
  bool json = false;
  // The jobs' event logs: as text, or with `json` as JSON lines (one event
  // a line, its job's run_id added).
  bool events = false;
  common::Credentials auth;
  absl::Duration timeout = absl::Seconds(5);
};

}  // namespace ddprun::launcher
