#pragma once

#include <string>
#include <vector>

#include "ddprun/v1/rendezvous.pb.h"
#include "launcher/agent/agent_context.h"
#include "launcher/agent/agent_options.h"
#include "launcher/posix/process_control.h"
#include "launcher/posix/worker_output.h"

namespace ddprun::launcher {

// One round of this node's workers, decided before anything starts: where
// the attempt's files go, how output is routed, and every local rank's
// command and complete environment. The plan (through worker_env.h) is the
// only writer of worker environments; running a round carries it out.
struct RoundPlan {
  // <run log folder>/attempt_<restart> (torchrun's layout: one folder per
  // local rank in it, see AgentContext::scratch_dir).
  std::string attempt_dir;
  // TORCHELASTIC_ERROR_FILE of each local rank: <attempt>/<local_rank>/
  // error.json.
  std::vector<std::string> error_files;
  WorkerOutputOptions output;
  // By local rank: argv, environment, the progress descriptor to inherit.
  // stdout_fd / stderr_fd are left to the round's WorkerOutput.
  std::vector<SpawnRequest> workers;
};

// The plan of `assignment` for this node. `progress_fds[local_rank]` is the
// write end of that rank's progress pipe (-1: none): fresh pipes, or the
// ones prewarmed workers already hold. `control_fds[local_rank]` likewise
// is the read end of its control pipe (DDPRUN_CONTROL_FD, in-place
// recovery; -1 or absent: none). Pure: touches no file.
RoundPlan BuildRoundPlan(const AgentOptions& options,
                         const AgentContext& context,
                         const v1::Assignment& assignment,
                         const std::vector<int>& progress_fds,
                         const std::vector<int>& control_fds = {});

// Where each local rank's worker comes from in the next round of an
// in-place recovery: the survivors keep their processes and pipes, the
// replaced ranks take a prewarmed standby (in order) when enough wait, or
// are started afresh with new pipes.
enum class WorkerSource { kSurvivor, kStandby, kFresh };
struct InPlaceSources {
  std::vector<WorkerSource> by_local_rank;
  // For kStandby ranks: which standby (0, 1, ... in local-rank order).
  std::vector<int> standby_index;
  bool uses_standbys = false;
};

// Pure: `replace` lists the local ranks to replace (any order, no
// duplicates, each in [0, nproc)); `standbys_waiting` is how many prewarmed
// workers wait (all replaced ranks take one, or none does).
InPlaceSources PlanInPlaceSources(int nproc, const std::vector<int>& replace,
                                  int standbys_waiting);

// The environment of a prewarmed worker before its round is known.
std::vector<std::string> BuildStandbyPlanEnv(const AgentContext& context);

}  // namespace ddprun::launcher
