// What an agent hands its orphan guard (launcher/cli/farewell.h) survives
// the trip, whatever bytes its token holds.
#include "launcher/cli/farewell.h"

#include <gtest/gtest.h>

namespace ddprun::launcher {
namespace {

TEST(FarewellTest, EveryFieldSurvivesTheRoundTrip) {
  Farewell sent{.endpoint = "[::1]:29400",
                .run_id = "job-1",
                .node_id = "host:42:00ab12"};
  sent.credentials.token = "a=b\nc\\d \"e\"\t\x01";
  sent.credentials.tls_ca_file = "/etc/ddprun/ca.pem";
  sent.credentials.tls_cert_file = "/etc/ddprun/node.pem";
  sent.credentials.tls_key_file = "/etc/ddprun/node.key";
  sent.credentials.tls_server_name = "rendezvous";
  Farewell got;
  ASSERT_TRUE(DecodeFarewell(EncodeFarewell(sent), got));
  EXPECT_EQ(got.endpoint, sent.endpoint);
  EXPECT_EQ(got.run_id, sent.run_id);
  EXPECT_EQ(got.node_id, sent.node_id);
  EXPECT_EQ(got.credentials.token, sent.credentials.token);
  EXPECT_EQ(got.credentials.tls_ca_file, sent.credentials.tls_ca_file);
  EXPECT_EQ(got.credentials.tls_cert_file, sent.credentials.tls_cert_file);
  EXPECT_EQ(got.credentials.tls_key_file, sent.credentials.tls_key_file);
  EXPECT_EQ(got.credentials.tls_server_name, sent.credentials.tls_server_name);
}

TEST(FarewellTest, AMalformedOneIsRefused) {
  Farewell got;
  EXPECT_FALSE(DecodeFarewell("", got));
  EXPECT_FALSE(DecodeFarewell("endpoint=h:1\n", got));  // fields missing
  std::string bad_escape =
      EncodeFarewell({.endpoint = "h:1", .run_id = "j", .node_id = "n"}) +
      "token=\\x\n";
  EXPECT_FALSE(DecodeFarewell(bad_escape, got));
}

}  // namespace
}  // namespace ddprun::launcher
