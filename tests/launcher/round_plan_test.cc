// The round plan: every local rank's complete environment, the attempt's
// files and the output routing, decided from (options, node, assignment)
// without touching a file.
#include "launcher/agent/round_plan.h"

#include <map>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ddprun::launcher {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;
using ::testing::SizeIs;

std::map<std::string, std::string> AsMap(const std::vector<std::string>& env) {
  std::map<std::string, std::string> out;
  for (const std::string& e : env) {
    size_t eq = e.find('=');
    EXPECT_TRUE(out.emplace(e.substr(0, eq), e.substr(eq + 1)).second)
        << "twice: " << e;
  }
  return out;
}

struct Fixture {
  Fixture() {
    options.nproc_per_node = 2;
    options.rdzv_id = "job7";
    options.role = "trainer";
    context.store_endpoint = "10.0.0.9:29400";
    context.local_addr = "10.0.0.2";
    context.scratch_dir = "/tmp/ddprun-x";
    context.worker_argv = {"/usr/bin/train", "--epochs", "1"};
    context.base_env = {"PATH=/usr/bin", "DDPRUN_SHM_DIR=/dev/shm/old",
                        "OMP_NUM_THREADS=4"};
    context.shm_dir = "/dev/shm/ddprun-abc";
    context.credentials.token_file = "/etc/ddprun/token";
    assignment.set_round(5);
    assignment.set_node_rank(1);
    assignment.set_num_nodes(2);
    assignment.set_rank_offset(2);
    assignment.set_world_size(4);
    assignment.set_master_addr("10.0.0.1");
    assignment.set_master_port(29501);
    assignment.set_restart_count(2);
    assignment.set_max_restarts(3);
  }
  AgentOptions options;
  AgentContext context;
  v1::Assignment assignment;
};

TEST(RoundPlanTest, EveryRankGetsItsCompleteEnvironment) {
  Fixture f;
  RoundPlan plan = BuildRoundPlan(f.options, f.context, f.assignment, {7, 9});

  ASSERT_THAT(plan.workers, SizeIs(2));
  std::map<std::string, std::string> env = AsMap(plan.workers[1].env);
  EXPECT_EQ(env["RANK"], "3");
  EXPECT_EQ(env["LOCAL_RANK"], "1");
  EXPECT_EQ(env["GROUP_RANK"], "1");
  EXPECT_EQ(env["WORLD_SIZE"], "4");
  EXPECT_EQ(env["GROUP_WORLD_SIZE"], "2");
  EXPECT_EQ(env["ROLE_NAME"], "trainer");
  EXPECT_EQ(env["MASTER_ADDR"], "10.0.0.1");
  EXPECT_EQ(env["MASTER_PORT"], "29501");
  EXPECT_EQ(env["TORCHELASTIC_RESTART_COUNT"], "2");
  EXPECT_EQ(env["TORCHELASTIC_MAX_RESTARTS"], "3");
  EXPECT_EQ(env["TORCHELASTIC_RUN_ID"], "job7");
  EXPECT_EQ(env["TORCHELASTIC_USE_AGENT_STORE"], "False");
  EXPECT_EQ(env["DDPRUN_STORE_ENDPOINT"], "10.0.0.9:29400");
  EXPECT_EQ(env["DDPRUN_ROUND"], "5");
  EXPECT_EQ(env["DDPRUN_LOCAL_ADDR"], "10.0.0.2");
  EXPECT_EQ(env["DDPRUN_TOKEN_FILE"], "/etc/ddprun/token");
  EXPECT_EQ(env["DDPRUN_PROGRESS_FD"], "9");
  // The plan's shared-memory folder replaces one left in the environment.
  EXPECT_EQ(env["DDPRUN_SHM_DIR"], "/dev/shm/ddprun-abc");
  EXPECT_EQ(env["OMP_NUM_THREADS"], "4");  // the user's own setting
  EXPECT_EQ(env["PATH"], "/usr/bin");
  EXPECT_EQ(env.count("DDPRUN_TLS_CA_FILE"), 0u);
  EXPECT_THAT(plan.workers[1].argv,
              ElementsAre("/usr/bin/train", "--epochs", "1"));
  EXPECT_THAT(plan.workers[1].inherit_fds, ElementsAre(9));
  EXPECT_EQ(plan.workers[1].stdout_fd, -1);
}

TEST(RoundPlanTest, ControlPipesAreNamedAndInherited) {
  Fixture f;
  RoundPlan plan =
      BuildRoundPlan(f.options, f.context, f.assignment, {7, 9}, {11, 12});
  ASSERT_THAT(plan.workers, SizeIs(2));
  std::map<std::string, std::string> env = AsMap(plan.workers[1].env);
  EXPECT_EQ(env["DDPRUN_CONTROL_FD"], "12");
  EXPECT_THAT(plan.workers[1].inherit_fds, ElementsAre(9, 12));
  // Without one the variable is not set, even when the agent had it.
  f.context.base_env.push_back("DDPRUN_CONTROL_FD=3");
  RoundPlan none = BuildRoundPlan(f.options, f.context, f.assignment, {7, 9});
  EXPECT_EQ(AsMap(none.workers[0].env).count("DDPRUN_CONTROL_FD"), 0u);
}

TEST(RoundPlanTest, AttemptFilesFollowTheRestartCount) {
  Fixture f;
  RoundPlan scratch = BuildRoundPlan(f.options, f.context, f.assignment, {});
  EXPECT_EQ(scratch.attempt_dir, "/tmp/ddprun-x/attempt_2");
  // torchrun's layout: a folder per local rank (not the global rank).
  EXPECT_THAT(scratch.error_files,
              ElementsAre("/tmp/ddprun-x/attempt_2/0/error.json",
                          "/tmp/ddprun-x/attempt_2/1/error.json"));
  EXPECT_EQ(AsMap(scratch.workers[0].env)["TORCHELASTIC_ERROR_FILE"],
            "/tmp/ddprun-x/attempt_2/0/error.json");
  // Without progress pipes, no DDPRUN_PROGRESS_FD and nothing inherited.
  EXPECT_EQ(AsMap(scratch.workers[0].env).count("DDPRUN_PROGRESS_FD"), 0u);
  EXPECT_THAT(scratch.workers[0].inherit_fds, IsEmpty());

  // The run's log folder (under --log-dir or not) is the context's: the
  // agent's options do not name it.
  f.options.tee.all = 3;
  f.context.scratch_dir = "/var/log/train/job7_a1b2c3";
  RoundPlan logged = BuildRoundPlan(f.options, f.context, f.assignment, {});
  EXPECT_EQ(logged.attempt_dir, "/var/log/train/job7_a1b2c3/attempt_2");
  EXPECT_EQ(logged.output.attempt_dir, logged.attempt_dir);
  EXPECT_EQ(logged.output.rank_offset, 2);
  EXPECT_EQ(logged.output.num_workers, 2);
  EXPECT_EQ(logged.output.tee.all, 3);
}

TEST(RoundPlanTest, StandbysGetTheSharedFolderAndOneThread) {
  Fixture f;
  f.context.base_env = {"PATH=/usr/bin", "DDPRUN_SHM_DIR=/dev/shm/old"};
  std::map<std::string, std::string> env =
      AsMap(BuildStandbyPlanEnv(f.context));
  EXPECT_EQ(env["DDPRUN_SHM_DIR"], "/dev/shm/ddprun-abc");
  EXPECT_EQ(env["OMP_NUM_THREADS"], "1");
  EXPECT_EQ(env["PATH"], "/usr/bin");

  f.context.base_env.push_back("OMP_NUM_THREADS=8");
  f.context.shm_dir.clear();
  env = AsMap(BuildStandbyPlanEnv(f.context));
  EXPECT_EQ(env["OMP_NUM_THREADS"], "8");
  EXPECT_EQ(env["DDPRUN_SHM_DIR"], "/dev/shm/old");  // left as it was
}

// In-place recovery: survivors keep their processes; the replaced ranks
// take standbys in local-rank order when enough wait, else start afresh.
TEST(RoundPlanTest, InPlaceSourcesKeepSurvivorsAndUseStandbysOnlyForAll) {
  InPlaceSources with = PlanInPlaceSources(4, {3, 1}, 2);
  EXPECT_TRUE(with.uses_standbys);
  EXPECT_THAT(
      with.by_local_rank,
      ::testing::ElementsAre(WorkerSource::kSurvivor, WorkerSource::kStandby,
                             WorkerSource::kSurvivor, WorkerSource::kStandby));
  EXPECT_THAT(with.standby_index, ::testing::ElementsAre(-1, 0, -1, 1));

  InPlaceSources short_of_one = PlanInPlaceSources(4, {3, 1}, 1);
  EXPECT_FALSE(short_of_one.uses_standbys);
  EXPECT_THAT(
      short_of_one.by_local_rank,
      ::testing::ElementsAre(WorkerSource::kSurvivor, WorkerSource::kFresh,
                             WorkerSource::kSurvivor, WorkerSource::kFresh));

  // Another node failed: nothing to replace here.
  InPlaceSources none = PlanInPlaceSources(2, {}, 2);
  EXPECT_FALSE(none.uses_standbys);
  EXPECT_THAT(none.by_local_rank, ::testing::Each(WorkerSource::kSurvivor));
}

}  // namespace
}  // namespace ddprun::launcher
