#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "common/auth.h"
#include "common/credentials.h"
#include "launcher/agent/agent_options.h"
#include "launcher/agent/phase_bounds.h"
#include "launcher/posix/worker_output.h"

namespace ddprun::launcher {

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
  // Whether the next round's workers start ahead, while a round trains, so
  // that a restart skips the process start (LaunchOptions::Prewarm).
  enum class Prewarm {
    // The default: once a worker says its program waits for its round
    // (libddp's AwaitActivation), standbys fork from a zygote of it, which
    // costs one more process per node and a few ms of CPU per standby.
    // Python programs and consoles split by --redirects, --tee or
    // --local-ranks-filter are not prewarmed.
    kAuto,
    kOn,   // --prewarm: Python programs too, and by exec without a zygote
    kOff,  // --no-prewarm
  };
  Prewarm prewarm = Prewarm::kAuto;

  // Whether every worker writes to the agent's console as it is (no
  // --redirects, --tee or --local-ranks-filter), as standbys must.
  bool PlainConsole() const {
    return redirects.all == 0 && tee.all == 0 &&
           redirects.by_local_rank.empty() && tee.by_local_rank.empty() &&
           local_ranks_filter.empty();
  }
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
  // --host-tls-cert-file, --host-tls-key-file and --host-tls-client-ca-file:
  // the TLS (mutual with a client CA) of the rendezvous this agent serves
  // (kHost, kHostOrConnect, kStandalone); empty: plaintext.
  common::ServerTlsOptions host_tls;

  // The training program and its arguments, untouched.
  std::vector<std::string> program;
};

// The part of `options` the agent reads (cli/ on agent/: the agent never
// sees LaunchOptions).
AgentOptions MakeAgentOptions(const LaunchOptions& options);

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
