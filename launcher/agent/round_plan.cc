#include "launcher/agent/round_plan.h"

#include "absl/strings/match.h"
#include "absl/strings/str_format.h"

namespace ddprun::launcher {
namespace {

// torchrun's layout (torch.distributed.elastic): the run's log folder,
// then attempt_<restart>/<local_rank>/error.json, stdout.log, stderr.log.
std::string AttemptDir(const AgentContext& context, int restart_count) {
  return absl::StrFormat("%s/attempt_%d", context.scratch_dir, restart_count);
}

}  // namespace

RoundPlan BuildRoundPlan(const AgentOptions& options,
                         const AgentContext& context,
                         const v1::Assignment& assignment,
                         const std::vector<int>& progress_fds,
                         const std::vector<int>& control_fds) {
  const int n = options.nproc_per_node;
  RoundPlan plan;
  plan.attempt_dir = AttemptDir(context, assignment.restart_count());
  for (int local_rank = 0; local_rank < n; ++local_rank) {
    plan.error_files.push_back(
        absl::StrFormat("%s/%d/error.json", plan.attempt_dir, local_rank));
  }

  plan.output.attempt_dir = plan.attempt_dir;
  plan.output.num_workers = n;
  plan.output.rank_offset = assignment.rank_offset();
  plan.output.redirects = options.redirects;
  plan.output.tee = options.tee;
  plan.output.local_ranks_filter = options.local_ranks_filter;
  plan.output.role = options.role;
  static constexpr absl::string_view kPrefixTemplate =
      "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE=";
  for (const std::string& entry : context.base_env) {
    if (absl::StartsWith(entry, kPrefixTemplate)) {
      plan.output.prefix_template = entry.substr(kPrefixTemplate.size());
    }
  }

  for (int local_rank = 0; local_rank < n; ++local_rank) {
    WorkerEnvSpec spec;
    spec.run_id = options.rdzv_id;
    spec.role = options.role;
    spec.local_rank = local_rank;
    spec.local_world_size = n;
    spec.rank = assignment.rank_offset() + local_rank;
    spec.world_size = assignment.world_size();
    spec.group_rank = assignment.node_rank();
    spec.group_world_size = assignment.num_nodes();
    spec.master_addr = assignment.master_addr();
    spec.master_port = assignment.master_port();
    spec.restart_count = assignment.restart_count();
    spec.max_restarts = assignment.max_restarts();
    spec.round = assignment.round();
    spec.error_file = plan.error_files[local_rank];
    spec.store_endpoint = context.store_endpoint;
    spec.local_addr = context.local_addr;
    spec.credentials = context.credentials;
    spec.shm_dir = context.shm_dir;
    spec.virtual_local_rank = options.virtual_local_rank;
    spec.torch = context.worker_torch;
    spec.progress_fd = local_rank < static_cast<int>(progress_fds.size())
                           ? progress_fds[local_rank]
                           : -1;
    spec.control_fd = local_rank < static_cast<int>(control_fds.size())
                          ? control_fds[local_rank]
                          : -1;
    SpawnRequest request;
    request.argv = context.worker_argv;
    request.env = BuildWorkerEnv(spec, context.base_env);
    if (spec.progress_fd >= 0) request.inherit_fds = {spec.progress_fd};
    if (spec.control_fd >= 0) request.inherit_fds.push_back(spec.control_fd);
    plan.workers.push_back(std::move(request));
  }
  return plan;
}

InPlaceSources PlanInPlaceSources(int nproc, const std::vector<int>& replace,
                                  int standbys_waiting) {
  InPlaceSources sources;
  sources.by_local_rank.assign(nproc, WorkerSource::kSurvivor);
  sources.standby_index.assign(nproc, -1);
  sources.uses_standbys =
      !replace.empty() && standbys_waiting >= static_cast<int>(replace.size());
  for (int local_rank : replace) {
    sources.by_local_rank[local_rank] =
        sources.uses_standbys ? WorkerSource::kStandby : WorkerSource::kFresh;
  }
  int next_standby = 0;
  for (int i = 0; i < nproc; ++i) {
    if (sources.by_local_rank[i] == WorkerSource::kStandby) {
      sources.standby_index[i] = next_standby++;
    }
  }
  return sources;
}

std::vector<std::string> BuildStandbyPlanEnv(const AgentContext& context) {
  return BuildStandbyEnv(context.base_env, context.shm_dir);
}

}  // namespace ddprun::launcher
