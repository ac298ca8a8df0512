// ddprun-rendezvous's flags become the options the server runs with; a bad
// value ends the program with the usage code.
#include "rendezvous/service/server_flags.h"

#include <gtest/gtest.h>

#include <vector>

namespace ddprun::rendezvous {
namespace {

ServerCommandLine Parse(std::vector<const char*> args) {
  args.insert(args.begin(), "ddprun-rendezvous");
  return ParseServerFlags(static_cast<int>(args.size()), args.data());
}

TEST(ServerFlagsTest, DefaultsAreTheOptionsDefaults) {
  ServerCommandLine command = Parse({});
  EXPECT_FALSE(command.exit_code.has_value());
  EXPECT_FALSE(command.job_token.has_value());
  EXPECT_EQ(command.run.server.port, ServerOptions{}.port);
  EXPECT_EQ(command.run.server.max_poll_delay, ServerOptions{}.max_poll_delay);
  EXPECT_EQ(command.run.server.figures_budget_per_s, 250);
  EXPECT_EQ(command.run.server.limits.max_memory_bytes, kDefaultMemoryBytes);
  EXPECT_EQ(command.run.metrics_port, -1);
  EXPECT_EQ(command.logging.name, "ddprun-rendezvous");
}

TEST(ServerFlagsTest, FlagsFillTheServerOptions) {
  ServerCommandLine command =
      Parse({"--port", "7000", "--max-poll-delay", "2.5", "--poll-budget",
             "100", "--straggler-factor", "2", "--metrics-port", "0",
             "--insecure", "--log-level", "debug", "--join-queues", "3",
             "--figures-budget", "1000", "--figures-interval", "4"});
  ASSERT_FALSE(command.exit_code.has_value());
  EXPECT_EQ(command.run.server.port, 7000);
  EXPECT_EQ(command.run.server.max_poll_delay, absl::Milliseconds(2500));
  EXPECT_EQ(command.run.server.poll_budget_per_s, 100);
  EXPECT_EQ(command.run.server.straggler.factor, 2.0);
  EXPECT_EQ(command.run.server.join_queues, 3);
  EXPECT_EQ(command.run.server.figures_budget_per_s, 1000);
  EXPECT_EQ(command.run.server.figures_interval, absl::Seconds(4));
  EXPECT_EQ(command.run.metrics_port, 0);
  EXPECT_TRUE(command.run.insecure);
  EXPECT_EQ(command.logging.level, "debug");
}

TEST(ServerFlagsTest, JobTokenIsASubcommand) {
  ServerCommandLine command =
      Parse({"job-token", "--run-id", "job-7", "--token-file", "/t"});
  ASSERT_FALSE(command.exit_code.has_value());
  ASSERT_TRUE(command.job_token.has_value());
  EXPECT_EQ(command.job_token->run_id, "job-7");
  EXPECT_EQ(command.job_token->token_file, "/t");
}

TEST(ServerFlagsTest, ABadValueEndsWithTheUsageCode) {
  EXPECT_EQ(Parse({"--port", "70000"}).exit_code, 2);
  EXPECT_EQ(Parse({"--max-poll-delay", "nan"}).exit_code, 2);
  EXPECT_EQ(Parse({"--figures-budget", "-1"}).exit_code, 2);
  EXPECT_EQ(Parse({"--figures-interval", "inf"}).exit_code, 2);
  EXPECT_EQ(Parse({"--figures-interval", "0"}).exit_code, 2);
  EXPECT_EQ(Parse({"--no-such-flag"}).exit_code, 2);
  EXPECT_EQ(Parse({"job-token"}).exit_code, 2);  // --run-id is required
}

}  // namespace
}  // namespace ddprun::rendezvous
