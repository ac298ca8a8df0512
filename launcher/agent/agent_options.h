#pragma once

#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "launcher/agent/phase_bounds.h"
#include "launcher/posix/worker_output.h"

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

// What the agent reads of the launch: its rendezvous, its node's workers
// and how to supervise them. cli/ fills it from the command line
// (MakeAgentOptions); defaults as the flags'.
struct AgentOptions {
  std::string rdzv_id = "none";
  int min_nodes = 1;
  int max_nodes = 1;
  int nproc_per_node = 1;
  int node_rank = -1;  // -1: the server assigns it
  int max_restarts = 0;
  RdzvConf rdzv_conf;
  absl::Duration monitor_interval = absl::Milliseconds(100);
  // How long a worker may stay in each phase of its life, and stopped.
  PhaseBoundsOptions hang_bounds;
  // A local rank the server names a straggler is treated as failed and
  // killed, so that in-place recovery replaces it (--straggler-policy
  // replace); false: it is only reported.
  bool replace_stragglers = false;
  // Between SIGTERM and SIGKILL when stopping workers; one shared deadline.
  absl::Duration shutdown_grace = absl::Seconds(30);
  // What each worker is told and where its output goes (BuildRoundPlan).
  std::string role = "default";
  // Every worker gets LOCAL_RANK=0 and only its own GPU in
  // CUDA_VISIBLE_DEVICES (the agent's list, indexed by local rank).
  bool virtual_local_rank = false;
  PerRankStreams redirects;
  PerRankStreams tee;
  // Local ranks whose console output is shown; empty: all.
  std::vector<int> local_ranks_filter;
};

}  // namespace ddprun::launcher
