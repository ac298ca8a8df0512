// Two ddprun agents train MNIST through ddprun-relay: the agents' Joins and
// heartbeats and their workers' store calls all go through the relay, and
// its counters show batched and passed-through traffic.
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "tests/e2e/summary_json.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/wait_for.h"

namespace ddprun::testing {
namespace {

// The value after `prefix` on the first stdout line that starts with it.
std::string WaitForLine(const std::string& stdout_path,
                        absl::string_view prefix) {
  std::string value;
  WaitFor(
      [&] {
        std::string out = ReadFileOrEmpty(stdout_path);
        for (absl::string_view line : absl::StrSplit(out, '\n')) {
          if (absl::ConsumePrefix(&line, prefix)) {
            value = std::string(line);
            return true;
          }
        }
        return false;
      },
      absl::Seconds(30));
  return value;
}

// A counter's value in a Prometheus text page; -1 when absent.
double CounterValue(const std::string& page, const std::string& name) {
  for (absl::string_view line : absl::StrSplit(page, '\n')) {
    if (absl::ConsumePrefix(&line, name + " ")) {
      double value = 0;
      if (absl::SimpleAtod(line, &value)) return value;
    }
  }
  return -1;
}

TEST(RelayE2eTest, TwoAgentsTrainMnistThroughTheRelay) {
  TempDir dir;
  SubprocessOptions server_options;
  server_options.argv = {BinaryPath("rendezvous/ddprun-rendezvous"), "--port",
                         "0"};
  server_options.stdout_path = dir.File("server.out");
  server_options.stderr_path = dir.File("server.err");
  auto server = Subprocess::Start(server_options);
  ASSERT_TRUE(server.ok()) << server.status();
  std::string upstream =
      WaitForLine(dir.File("server.out"), "ddprun-rendezvous listening on ");
  ASSERT_FALSE(upstream.empty()) << ReadFileOrEmpty(dir.File("server.err"));

  SubprocessOptions relay_options;
  relay_options.argv = {BinaryPath("relay/ddprun-relay"), "--upstream",
                        upstream, "--metrics-port", "0",
                        // Both agents' Joins meet in one batch.
                        "--batch-window-ms", "500"};
  relay_options.stdout_path = dir.File("relay.out");
  relay_options.stderr_path = dir.File("relay.err");
  auto relay = Subprocess::Start(relay_options);
  ASSERT_TRUE(relay.ok()) << relay.status();
  std::string endpoint =
      WaitForLine(dir.File("relay.out"), "ddprun-relay listening on ");
  ASSERT_FALSE(endpoint.empty()) << ReadFileOrEmpty(dir.File("relay.err"));
  std::string metrics_url =
      WaitForLine(dir.File("relay.out"), "ddprun-relay metrics on http://");
  ASSERT_FALSE(metrics_url.empty()) << ReadFileOrEmpty(dir.File("relay.err"));

  std::vector<Subprocess> agents;
  for (int node = 0; node < 2; ++node) {
    SubprocessOptions options;
    options.argv =
        Concat({Ddprun(), "--nnodes", "2", "--nproc-per-node", "1",
                "--rdzv-endpoint", endpoint, "--rdzv-id", "relay-e2e"},
               {Mnist(), "--epochs", "1", "--data-dir", MnistDir(),
                "--train-limit", "20000", "--summary-json",
                dir.File("summary.json"), "--save", dir.File("model.pt")});
    options.stdout_path = dir.File(absl::StrCat("agent", node, ".out"));
    options.stderr_path = dir.File(absl::StrCat("agent", node, ".err"));
    auto agent = Subprocess::Start(options);
    ASSERT_TRUE(agent.ok()) << agent.status();
    agents.push_back(std::move(*agent));
  }
  for (int node = 0; node < 2; ++node) {
    auto exit = agents[node].Wait(absl::Minutes(5));
    ASSERT_TRUE(exit.has_value()) << "agent " << node << " did not finish";
    EXPECT_TRUE(exit->ok())
        << "agent " << node << ": " << exit->ToString() << "\n"
        << ReadFileOrEmpty(dir.File(absl::StrCat("agent", node, ".err")));
  }
  ExpectTrainedSummary(dir.File("summary.json"), 2, 0.85);

  // host:port/metrics
  std::vector<std::string> parts =
      absl::StrSplit(metrics_url, absl::MaxSplits('/', 1));
  std::vector<std::string> host_port = absl::StrSplit(parts[0], ':');
  ASSERT_EQ(host_port.size(), 2u) << metrics_url;
  httplib::Client client(host_port[0], std::stoi(host_port[1]));
  auto response = client.Get("/metrics");
  ASSERT_TRUE(response) << "no answer from " << metrics_url;
  const std::string& page = response->body;
  double joins = CounterValue(page, "ddprun_relay_joins_total");
  double join_calls =
      CounterValue(page, "ddprun_relay_upstream_join_calls_total");
  for (absl::string_view line : absl::StrSplit(page, '\n')) {
    if (absl::StartsWith(line, "ddprun_relay_")) {
      std::printf("%s\n", std::string(line).c_str());  // for the log
    }
  }
  EXPECT_GE(joins, 2) << page;
  EXPECT_LT(join_calls, joins) << "the agents' Joins were not batched\n"
                               << page;
  EXPECT_GT(CounterValue(page, "ddprun_relay_beats_total"), 0) << page;
  EXPECT_GT(CounterValue(page, "ddprun_relay_upstream_beat_messages_total"), 0)
      << page;
  // Leaves, and the workers' store calls.
  EXPECT_GT(CounterValue(page, "ddprun_relay_passthrough_calls_total"), 2)
      << page;
}

}  // namespace
}  // namespace ddprun::testing
