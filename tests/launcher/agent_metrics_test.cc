// The agent's /metrics: AgentMetrics' bookkeeping, and a real scrape of a
// running `ddprun --metrics-port 0` whose workers report progress.
#include "launcher/agent/agent_metrics.h"

#include <signal.h>

#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/metrics.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/wait_for.h"

namespace ddprun::launcher {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using namespace ::ddprun::testing;

TEST(AgentMetricsTest, ARoundsWorkersProgressAndFailuresAreExported) {
  common::MetricsRegistry registry;
  AgentMetrics metrics(registry);
  absl::Time t0 = absl::UnixEpoch() + absl::Hours(1);
  v1::Assignment assignment;
  assignment.set_round(3);
  assignment.set_restart_count(2);
  metrics.RoundStarted(assignment, 2);
  metrics.Progress(1, t0);
  metrics.Update(2, t0 + absl::Milliseconds(1500));
  metrics.WorkerFailed(v1::FAILURE_CAUSE_SIGNALED);
  std::string text = registry.Render();
  EXPECT_THAT(text, HasSubstr("ddprun_agent_round 3\n"));
  EXPECT_THAT(text, HasSubstr("ddprun_agent_restart_count 2\n"));
  EXPECT_THAT(text, HasSubstr("ddprun_agent_workers_running 2\n"));
  EXPECT_THAT(text, HasSubstr("ddprun_agent_worker_last_progress_age_seconds{"
                              "local_rank=\"1\"} 1.5\n"));
  // Local rank 0 never reported: no age rather than a made-up one.
  EXPECT_THAT(text, Not(HasSubstr("local_rank=\"0\"")));
  EXPECT_THAT(
      text,
      HasSubstr("ddprun_agent_worker_failures_total{cause=\"signaled\"} 1\n"));
  metrics.RoundEnded();
  text = registry.Render();
  EXPECT_THAT(text, HasSubstr("ddprun_agent_workers_running 0\n"));
  EXPECT_THAT(text, Not(HasSubstr("local_rank=")));
}

// "... metrics on http://HOST:PORT/metrics" from the agent's log.
std::string MetricsUrl(const std::string& log) {
  for (absl::string_view line : absl::StrSplit(log, '\n')) {
    size_t at = line.find("metrics on http://");
    if (at != absl::string_view::npos) {
      return std::string(line.substr(at + strlen("metrics on ")));
    }
  }
  return "";
}

TEST(AgentMetricsTest, ARunningAgentServesItsWorkersOnMetrics) {
  TempDir dir;
  SubprocessOptions options;
  options.argv = {BinaryPath("launcher/ddprun"), "--standalone",
                  "--nproc-per-node", "2", "--monitor-interval", "0.05",
                  "--metrics-port", "0",
                  // Reports three steps of progress, then waits.
                  BinaryPath("tests/launcher/fault_worker"), "--progress", "3"};
  options.stderr_path = dir.File("agent.err");
  auto agent = Subprocess::Start(options);
  ASSERT_TRUE(agent.ok()) << agent.status();

  std::string url;
  ASSERT_TRUE(WaitFor(
      [&] {
        url = MetricsUrl(ReadFileOrEmpty(dir.File("agent.err")));
        return !url.empty();
      },
      absl::Seconds(30)))
      << ReadFileOrEmpty(dir.File("agent.err"));
  absl::string_view rest = url;
  ASSERT_TRUE(absl::ConsumePrefix(&rest, "http://"));
  std::vector<std::string> host_port =
      absl::StrSplit(rest.substr(0, rest.find('/')), absl::MaxSplits(':', 1));
  ASSERT_EQ(host_port.size(), 2u) << url;
  httplib::Client client(host_port[0], std::stoi(host_port[1]));

  std::string text;
  bool seen = WaitFor(
      [&] {
        auto response = client.Get("/metrics");
        if (!response || response->status != 200) return false;
        text = response->body;
        return absl::StrContains(text, "ddprun_agent_workers_running 2\n") &&
               absl::StrContains(text, "local_rank=\"0\"") &&
               absl::StrContains(text, "local_rank=\"1\"");
      },
      absl::Seconds(30));
  EXPECT_TRUE(seen) << text;
  EXPECT_THAT(text, HasSubstr("ddprun_agent_round 0\n"));
  EXPECT_THAT(text, HasSubstr("ddprun_agent_restart_count 0\n"));

  agent->Signal(SIGTERM);
  auto exit = agent->Wait(absl::Seconds(30));
  ASSERT_TRUE(exit.has_value()) << "the agent did not stop on SIGTERM";
  EXPECT_EQ(exit->exit_code, 1) << exit->ToString();
}

}  // namespace
}  // namespace ddprun::launcher
