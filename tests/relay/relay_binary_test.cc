// The ddprun-relay binary: it prints its port, carries a call, refuses a
// non-loopback bind without mutual TLS, and ends cleanly on SIGTERM.
#include <signal.h>

#include <string>

#include "absl/strings/numbers.h"
#include "ddprun/v1/rendezvous.grpc.pb.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "gtest/gtest.h"
#include "rendezvous/service/server.h"
#include "tests/testing/client_context.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/wait_for.h"

namespace ddprun::relay {
namespace {

using ::ddprun::testing::BinaryPath;
using ::ddprun::testing::ReadFileOrEmpty;
using ::ddprun::testing::Subprocess;
using ::ddprun::testing::SubprocessOptions;
using ::ddprun::testing::TempDir;
using ::ddprun::testing::WaitFor;

TEST(RelayBinaryTest, ListensCarriesACallAndEndsOnSigterm) {
  auto server = rendezvous::Server::Start({});
  ASSERT_TRUE(server.ok()) << server.status();
  TempDir dir;
  SubprocessOptions options;
  options.argv = {BinaryPath("relay/ddprun-relay"), "--upstream",
                  (*server)->endpoint(), "--metrics-port", "0"};
  options.stdout_path = dir.File("relay.out");
  options.stderr_path = dir.File("relay.err");
  auto relay = Subprocess::Start(options);
  ASSERT_TRUE(relay.ok()) << relay.status();
  const std::string prefix = "ddprun-relay listening on 127.0.0.1:";
  int port = 0;
  ASSERT_TRUE(WaitFor(
      [&] {
        std::string text = ReadFileOrEmpty(options.stdout_path);
        size_t at = text.find(prefix);
        size_t eol = text.find('\n', at);
        return at != std::string::npos && eol != std::string::npos &&
               absl::SimpleAtoi(
                   text.substr(at + prefix.size(), eol - at - prefix.size()),
                   &port);
      },
      absl::Seconds(20)))
      << ReadFileOrEmpty(options.stderr_path);
  auto stub = v1::Rendezvous::NewStub(grpc::CreateChannel(
      "127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials()));
  v1::StatusResponse response;
  auto context = testing::BoundedContext();
  grpc::Status status =
      stub->Status(context.get(), v1::StatusRequest(), &response);
  EXPECT_TRUE(status.ok()) << status.error_message();
  EXPECT_NE(ReadFileOrEmpty(options.stdout_path).find("metrics on http://"),
            std::string::npos);

  relay->Signal(SIGTERM);
  auto exit = relay->Wait(absl::Seconds(20));
  ASSERT_TRUE(exit.has_value()) << "ddprun-relay ignored SIGTERM";
  EXPECT_TRUE(exit->ok()) << exit->ToString();
}

TEST(RelayBinaryTest, RefusesANonLoopbackBindWithoutMutualTls) {
  auto result =
      testing::RunCommand({BinaryPath("relay/ddprun-relay"), "--upstream",
                           "127.0.0.1:1", "--host", "0.0.0.0"},
                          absl::Seconds(20));
  ASSERT_FALSE(result.timed_out);
  EXPECT_EQ(result.exit.exit_code, 1);
  EXPECT_NE(result.err.find("--insecure"), std::string::npos) << result.err;
  EXPECT_NE(result.err.find("--tls-client-ca-file"), std::string::npos)
      << result.err;
}

TEST(RelayBinaryTest, RefusesATooLargeBatch) {
  auto result =
      testing::RunCommand({BinaryPath("relay/ddprun-relay"), "--upstream",
                           "127.0.0.1:1", "--max-batch", "2000"},
                          absl::Seconds(20));
  ASSERT_FALSE(result.timed_out);
  EXPECT_EQ(result.exit.exit_code, 2);
  EXPECT_NE(result.err.find("--max-batch"), std::string::npos) << result.err;
}

}  // namespace
}  // namespace ddprun::relay
