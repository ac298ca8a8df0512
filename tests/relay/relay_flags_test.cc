// ddprun-relay's flags become the options the relay runs with; a bad value
// ends the program with the usage code.
#include "relay/relay_flags.h"

#include <gtest/gtest.h>

#include <vector>

namespace ddprun::relay {
namespace {

RelayCommandLine Parse(std::vector<const char*> args) {
  args.insert(args.begin(), "ddprun-relay");
  return ParseRelayFlags(static_cast<int>(args.size()), args.data());
}

TEST(RelayFlagsTest, FlagsFillTheRelayOptions) {
  RelayCommandLine command = Parse(
      {"--upstream", "server:29400", "--max-batch", "32", "--batch-window-ms",
       "1.5", "--upstream-tls-server-name", "rdzv", "--metrics-port", "0"});
  ASSERT_FALSE(command.exit_code.has_value());
  EXPECT_EQ(command.run.relay.upstream, "server:29400");
  EXPECT_EQ(command.run.relay.max_batch, 32);
  EXPECT_EQ(command.run.relay.batch_window, absl::Microseconds(1500));
  EXPECT_EQ(command.run.relay.upstream_channel.tls_server_name, "rdzv");
  EXPECT_EQ(command.run.metrics_port, 0);
  EXPECT_EQ(command.logging.name, "ddprun-relay");
}

TEST(RelayFlagsTest, DefaultsAreTheOptionsDefaults) {
  RelayCommandLine command = Parse({"--upstream", "server:29400"});
  ASSERT_FALSE(command.exit_code.has_value());
  EXPECT_EQ(command.run.relay.batch_window, RelayOptions{}.batch_window);
  EXPECT_EQ(command.run.relay.max_batch, RelayOptions{}.max_batch);
}

TEST(RelayFlagsTest, ABadValueEndsWithTheUsageCode) {
  EXPECT_EQ(Parse({}).exit_code, 2);  // --upstream is required
  EXPECT_EQ(Parse({"--upstream", "s:1", "--max-batch", "0"}).exit_code, 2);
  EXPECT_EQ(Parse({"--upstream", "s:1", "--batch-window-ms", "inf"}).exit_code,
            2);
}

}  // namespace
}  // namespace ddprun::relay
