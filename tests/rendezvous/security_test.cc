// Token, TLS and mutual TLS on a real server; token loading.
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include "absl/time/clock.h"
#include "common/credentials.h"
#include "ddprun/v1/rendezvous.grpc.pb.h"
#include "ddprun/v1/store.grpc.pb.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "gtest/gtest.h"
#include "rendezvous/service/run_server.h"
#include "rendezvous/service/server.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/wait_for.h"

namespace ddprun::rendezvous {
namespace {

std::unique_ptr<grpc::ClientContext> Context() {
  auto context = std::make_unique<grpc::ClientContext>();
  context->set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
  return context;
}

// A Set in a free-standing scope: the cheapest authenticated call.
grpc::Status TrySet(const std::shared_ptr<grpc::Channel>& channel,
                    const std::string& attach_token = "") {
  auto stub = v1::Store::NewStub(channel);
  v1::SetRequest request;
  request.mutable_scope()->set_run_id("security");
  request.set_key("k");
  request.set_value("v");
  v1::SetResponse response;
  auto context = Context();
  common::AttachToken(context.get(), attach_token);
  return stub->Set(context.get(), request, &response);
}

grpc::Status TryHeartbeat(const std::shared_ptr<grpc::Channel>& channel) {
  auto stub = v1::Rendezvous::NewStub(channel);
  v1::HeartbeatRequest request;
  request.set_run_id("none");
  v1::HeartbeatResponse response;
  return stub->Heartbeat(Context().get(), request, &response);
}

// Token files must be private (0600), as the server and clients demand.
void WritePrivateFile(const std::string& path, const std::string& text,
                      mode_t mode = 0600) {
  std::ofstream(path) << text;
  ASSERT_EQ(::chmod(path.c_str(), mode), 0) << path;
}

std::shared_ptr<grpc::Channel> Channel(const std::string& endpoint,
                                       const common::ChannelOptions& options) {
  auto channel = common::CreateChannel(endpoint, options);
  EXPECT_TRUE(channel.ok()) << channel.status();
  return *channel;
}

TEST(TokenTest, CallsWithoutTheTokenAreRefused) {
  ServerOptions options;
  options.token = "s3cret-token";
  auto server = Server::Start(options);
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string endpoint = (*server)->endpoint();

  grpc::Status none = TrySet(Channel(endpoint, {}));
  EXPECT_EQ(none.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_NE(none.error_message().find("--token-file"), std::string::npos);
  EXPECT_EQ(none.error_message().find("s3cret"), std::string::npos)
      << "never echo the token";
  EXPECT_EQ(TryHeartbeat(Channel(endpoint, {})).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);

  common::ChannelOptions wrong;
  wrong.token = "s3cret-tokeN";
  EXPECT_EQ(TrySet(Channel(endpoint, wrong)).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  wrong.token = "s3cret-token-and-more";
  EXPECT_EQ(TrySet(Channel(endpoint, wrong)).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);

  common::ChannelOptions right;
  right.token = "s3cret-token";
  EXPECT_TRUE(TrySet(Channel(endpoint, right)).ok());
  // Heartbeat passes the token check and reaches the job table.
  EXPECT_EQ(TryHeartbeat(Channel(endpoint, right)).error_code(),
            grpc::StatusCode::NOT_FOUND);
  // Per call, for channels made elsewhere.
  EXPECT_TRUE(TrySet(Channel(endpoint, {}), "s3cret-token").ok());
}

grpc::Status TryStatus(const std::shared_ptr<grpc::Channel>& channel,
                       const std::string& run_id) {
  auto stub = v1::Rendezvous::NewStub(channel);
  v1::StatusRequest request;
  request.set_run_id(run_id);
  v1::StatusResponse response;
  return stub->Status(Context().get(), request, &response);
}

// The rendezvous an agent hosts without a token (torchrun's agent-hosted
// form) gives a caller what torchrun's c10d store would: the job's own
// store and rendezvous, no other run id, no Status.
TEST(TokenTest, AnAgentHostedServerServesItsOwnJobOnly) {
  ServerOptions options;
  options.only_run_id = "security";
  options.status_without_token = false;
  auto server = Server::Start(options);
  ASSERT_TRUE(server.ok()) << server.status();
  auto channel = Channel((*server)->endpoint(), {});
  EXPECT_TRUE(TrySet(channel).ok());
  grpc::Status other = TryHeartbeat(channel);  // run id "none"
  EXPECT_EQ(other.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_NE(other.error_message().find("--rdzv-id security"), std::string::npos)
      << other.error_message();
  for (const std::string& run_id : {"security", "", "none"}) {
    grpc::Status status = TryStatus(channel, run_id);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::PERMISSION_DENIED)
        << run_id;
    EXPECT_NE(status.error_message().find("--token-file"), std::string::npos)
        << status.error_message();
  }
  // With a token the job's Status answers (NOT_FOUND: nobody joined yet);
  // another run id is still refused.
  options.token = "s3cret-token";
  auto guarded = Server::Start(options);
  ASSERT_TRUE(guarded.ok()) << guarded.status();
  common::ChannelOptions right;
  right.token = "s3cret-token";
  auto with_token = Channel((*guarded)->endpoint(), right);
  EXPECT_EQ(TryStatus(with_token, "security").error_code(),
            grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(TryHeartbeat(with_token).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
}

// A wildcard host listens on every interface, and says so.
TEST(ListenTest, AWildcardHostListensOnEveryInterface) {
  ServerOptions options;
  options.host = "0.0.0.0";
  auto server = Server::Start(options);
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = (*server)->port();
  EXPECT_EQ((*server)->listen_address(),
            "0.0.0.0:" + std::to_string(port) + " (all interfaces)");
  EXPECT_EQ((*server)->endpoint(), "127.0.0.1:" + std::to_string(port));
  ServerOptions loopback;
  auto local = Server::Start(loopback);
  ASSERT_TRUE(local.ok()) << local.status();
  EXPECT_EQ((*local)->listen_address(),
            "127.0.0.1:" + std::to_string((*local)->port()));
}

class TlsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    testing::RunResult made = testing::RunCommand(
        {"/bin/sh", testing::SourcePath("tests/rendezvous/make_test_certs.sh"),
         dir_.path()},
        absl::Seconds(30));
    ASSERT_TRUE(made.exit.ok()) << made.err;
  }

  std::string File(const std::string& name) const { return dir_.File(name); }

  testing::TempDir dir_;
};

TEST_F(TlsTest, ServerTlsAdmitsOnlyClientsThatTrustItsCa) {
  ServerOptions options;
  options.tls.cert_file = File("server.crt");
  options.tls.key_file = File("server.key");
  options.token = "t";
  auto server = Server::Start(options);
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string endpoint = (*server)->endpoint();

  common::ChannelOptions plain;
  plain.token = "t";
  EXPECT_EQ(TrySet(Channel(endpoint, plain)).error_code(),
            grpc::StatusCode::UNAVAILABLE);

  common::ChannelOptions other = plain;
  other.tls_ca_file = File("other-ca.crt");
  EXPECT_EQ(TrySet(Channel(endpoint, other)).error_code(),
            grpc::StatusCode::UNAVAILABLE);

  common::ChannelOptions tls = plain;
  tls.tls_ca_file = File("ca.crt");
  grpc::Status ok = TrySet(Channel(endpoint, tls));
  EXPECT_TRUE(ok.ok()) << ok.error_message();

  tls.token = "";
  EXPECT_EQ(TrySet(Channel(endpoint, tls)).error_code(),
            grpc::StatusCode::UNAUTHENTICATED)
      << "TLS does not replace the token";
}

TEST_F(TlsTest, MutualTlsRequiresAClientCertificate) {
  ServerOptions options;
  options.tls.cert_file = File("server.crt");
  options.tls.key_file = File("server.key");
  options.tls.client_ca_file = File("ca.crt");
  auto server = Server::Start(options);
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string endpoint = (*server)->endpoint();

  common::ChannelOptions no_cert;
  no_cert.tls_ca_file = File("ca.crt");
  EXPECT_EQ(TrySet(Channel(endpoint, no_cert)).error_code(),
            grpc::StatusCode::UNAVAILABLE);

  common::ChannelOptions with_cert = no_cert;
  with_cert.tls_cert_file = File("client.crt");
  with_cert.tls_key_file = File("client.key");
  grpc::Status ok = TrySet(Channel(endpoint, with_cert));
  EXPECT_TRUE(ok.ok()) << ok.error_message();
}

TEST_F(TlsTest, MissingFilesAreClearErrors) {
  ServerOptions options;
  options.tls.cert_file = File("absent.crt");
  options.tls.key_file = File("server.key");
  auto server = Server::Start(options);
  ASSERT_FALSE(server.ok());
  EXPECT_NE(server.status().message().find("absent.crt"), std::string::npos)
      << server.status();

  options.tls.key_file = "";
  options.tls.cert_file = File("server.crt");
  EXPECT_EQ(Server::Start(options).status().code(),
            absl::StatusCode::kInvalidArgument);

  common::ChannelOptions client;
  client.tls_ca_file = File("absent-ca.crt");
  auto channel = common::CreateChannel("127.0.0.1:1", client);
  ASSERT_FALSE(channel.ok());
  EXPECT_NE(channel.status().message().find("absent-ca.crt"),
            std::string::npos);
}

TEST_F(TlsTest, BinaryServesMutualTlsFromItsFlags) {
  WritePrivateFile(File("token"), "tls-binary-token\n");
  testing::SubprocessOptions options;
  options.argv = {testing::BinaryPath("rendezvous/ddprun-rendezvous"),
                  "--port",
                  "0",
                  "--token-file",
                  File("token"),
                  "--tls-cert-file",
                  File("server.crt"),
                  "--tls-key-file",
                  File("server.key"),
                  "--tls-client-ca-file",
                  File("ca.crt")};
  options.stdout_path = File("out");
  options.stderr_path = File("err");
  auto process = testing::Subprocess::Start(options);
  ASSERT_TRUE(process.ok()) << process.status();
  std::string endpoint;
  const std::string prefix = "ddprun-rendezvous listening on ";
  ASSERT_TRUE(testing::WaitFor(
      [&] {
        std::string out = testing::ReadFileOrEmpty(File("out"));
        size_t eol = out.find('\n');
        if (eol == std::string::npos) return false;
        endpoint = out.substr(prefix.size(), eol - prefix.size());
        return true;
      },
      absl::Seconds(10)))
      << testing::ReadFileOrEmpty(File("err"));
  common::ChannelOptions client;
  client.token = "tls-binary-token";
  client.tls_ca_file = File("ca.crt");
  EXPECT_EQ(TrySet(Channel(endpoint, client)).error_code(),
            grpc::StatusCode::UNAVAILABLE)
      << "no client certificate";
  client.tls_cert_file = File("client.crt");
  client.tls_key_file = File("client.key");
  grpc::Status ok = TrySet(Channel(endpoint, client));
  EXPECT_TRUE(ok.ok()) << ok.error_message();
}

TEST_F(TlsTest, BinaryWithAMissingKeyFileExitsWithOneClearLine) {
  testing::RunResult result =
      testing::RunCommand({testing::BinaryPath("rendezvous/ddprun-rendezvous"),
                           "--port", "0", "--tls-cert-file", File("server.crt"),
                           "--tls-key-file", File("nope.key")},
                          absl::Seconds(20));
  ASSERT_FALSE(result.timed_out);
  EXPECT_NE(result.exit.exit_code, 0);
  EXPECT_NE(result.err.find("nope.key"), std::string::npos) << result.err;
  EXPECT_EQ(std::count(result.err.begin(), result.err.end(), '\n'), 1)
      << result.err;
  EXPECT_EQ(result.out, "") << "no 'listening' line when it cannot serve";
}

TEST(LoadTokenTest, FileThenEnvironment) {
  testing::TempDir dir;
  WritePrivateFile(dir.File("token"), "  abc123\n");
  auto token = common::LoadToken(dir.File("token"));
  ASSERT_TRUE(token.ok()) << token.status();
  EXPECT_EQ(*token, "abc123");

  WritePrivateFile(dir.File("empty"), "\n");
  EXPECT_EQ(common::LoadToken(dir.File("empty")).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto missing = common::LoadToken(dir.File("missing"));
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find(dir.File("missing")),
            std::string::npos);

  ::setenv("DDPRUN_TOKEN", "from-env", 1);
  EXPECT_EQ(*common::LoadToken(""), "from-env");
  ::unsetenv("DDPRUN_TOKEN");
  EXPECT_EQ(*common::LoadToken(""), "");
}

TEST(TokenBinaryTest, TokenFileFlagIsEnforced) {
  testing::TempDir dir;
  WritePrivateFile(dir.File("token"), "binary-token\n");
  testing::SubprocessOptions options;
  options.argv = {testing::BinaryPath("rendezvous/ddprun-rendezvous"), "--port",
                  "0", "--token-file", dir.File("token")};
  options.stdout_path = dir.File("out");
  options.stderr_path = dir.File("err");
  options.unset_env = {"DDPRUN_TOKEN"};
  auto process = testing::Subprocess::Start(options);
  ASSERT_TRUE(process.ok()) << process.status();
  std::string endpoint;
  const std::string prefix = "ddprun-rendezvous listening on ";
  ASSERT_TRUE(testing::WaitFor(
      [&] {
        std::string out = testing::ReadFileOrEmpty(dir.File("out"));
        size_t eol = out.find('\n');
        if (eol == std::string::npos) return false;
        endpoint = out.substr(prefix.size(), eol - prefix.size());
        return true;
      },
      absl::Seconds(10)))
      << testing::ReadFileOrEmpty(dir.File("err"));
  EXPECT_EQ(TrySet(Channel(endpoint, {})).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  common::ChannelOptions right;
  right.token = "binary-token";
  EXPECT_TRUE(TrySet(Channel(endpoint, right)).ok());
}

}  // namespace
}  // namespace ddprun::rendezvous

namespace ddprun::rendezvous {
namespace {

TEST(LoadTokenTest, ATokenFileOthersCanReadOrChangeIsAClearError) {
  testing::TempDir dir;
  const std::string path = dir.File("token");
  for (mode_t mode : {0644, 0604, 0606, 0666, 0602}) {
    WritePrivateFile(path, "t0k3n\n", mode);
    auto token = common::LoadToken(path);
    ASSERT_FALSE(token.ok()) << std::oct << mode;
    EXPECT_EQ(token.status().code(), absl::StatusCode::kFailedPrecondition);
    const std::string& message = std::string(token.status().message());
    EXPECT_NE(message.find(path), std::string::npos) << message;
    EXPECT_NE(message.find("chmod 600"), std::string::npos) << message;
    char shown[8];
    std::snprintf(shown, sizeof(shown), "%04o", static_cast<unsigned>(mode));
    EXPECT_NE(message.find(shown), std::string::npos) << message;
    EXPECT_EQ(message.find("t0k3n"), std::string::npos) << "never the token";
  }
  for (mode_t mode : {0600, 0400}) {
    WritePrivateFile(path, "t0k3n\n", mode);
    auto token = common::LoadToken(path);
    ASSERT_TRUE(token.ok()) << std::oct << mode << " " << token.status();
    EXPECT_EQ(*token, "t0k3n");
  }
  // Group bits: refused on a file its user owns; a root-owned file may be
  // group-readable (Kubernetes fsGroup, systemd), never group-writable.
  WritePrivateFile(path, "t0k3n\n", 0660);
  EXPECT_EQ(common::LoadToken(path).status().code(),
            absl::StatusCode::kFailedPrecondition);
  WritePrivateFile(path, "t0k3n\n", 0640);
  if (::geteuid() == 0) {
    EXPECT_TRUE(common::LoadToken(path).ok()) << "root-owned, group-readable";
    ASSERT_EQ(::chown(path.c_str(), 65534, 65534), 0);
    EXPECT_EQ(common::LoadToken(path).status().code(),
              absl::StatusCode::kFailedPrecondition)
        << "owned by a user, group-readable";
  } else {
    EXPECT_EQ(common::LoadToken(path).status().code(),
              absl::StatusCode::kFailedPrecondition)
        << "owned by this user, group-readable";
  }
}

TEST(SecureDefaultsTest, NoTokenBeyondLoopbackIsRefusedWithBothFixes) {
  testing::RunResult result =
      testing::RunCommand({testing::BinaryPath("rendezvous/ddprun-rendezvous"),
                           "--host", "0.0.0.0", "--port", "0"},
                          absl::Seconds(20), {{"DDPRUN_TOKEN", ""}});
  ASSERT_FALSE(result.timed_out);
  EXPECT_NE(result.exit.exit_code, 0);
  EXPECT_NE(result.err.find("0.0.0.0"), std::string::npos) << result.err;
  EXPECT_NE(result.err.find("--token-file"), std::string::npos) << result.err;
  EXPECT_NE(result.err.find("--insecure"), std::string::npos) << result.err;
  EXPECT_EQ(std::count(result.err.begin(), result.err.end(), '\n'), 1)
      << result.err;
  EXPECT_EQ(result.out, "") << "no 'listening' line when it refuses";

  EXPECT_TRUE(IsLoopbackHost("127.0.0.1"));
  EXPECT_TRUE(IsLoopbackHost("127.0.1.1"));
  EXPECT_TRUE(IsLoopbackHost("::1"));
  EXPECT_TRUE(IsLoopbackHost("[::1]"));
  EXPECT_TRUE(IsLoopbackHost("localhost"));
  EXPECT_FALSE(IsLoopbackHost("0.0.0.0"));
  EXPECT_FALSE(IsLoopbackHost("::"));
  EXPECT_FALSE(IsLoopbackHost("10.0.0.1"));
  EXPECT_FALSE(IsLoopbackHost("rendezvous.example"));
  RunServerOptions mutual;
  mutual.server.host = "0.0.0.0";
  EXPECT_EQ(CheckListenIsAuthenticated(mutual, "").code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(CheckListenIsAuthenticated(mutual, "token").ok());
  mutual.server.tls.client_ca_file = "ca.crt";
  EXPECT_TRUE(CheckListenIsAuthenticated(mutual, "").ok())
      << "mutual TLS authenticates clients";
}

TEST(SecureDefaultsTest, InsecureListensAndMetricsStayOnLoopback) {
  testing::TempDir dir;
  testing::SubprocessOptions options;
  options.argv = {testing::BinaryPath("rendezvous/ddprun-rendezvous"),
                  "--host",
                  "0.0.0.0",
                  "--port",
                  "0",
                  "--insecure",
                  "--metrics-port",
                  "0"};
  options.stdout_path = dir.File("out");
  options.stderr_path = dir.File("err");
  options.unset_env = {"DDPRUN_TOKEN"};
  auto process = testing::Subprocess::Start(options);
  ASSERT_TRUE(process.ok()) << process.status();
  std::string out;
  ASSERT_TRUE(testing::WaitFor(
      [&] {
        out = testing::ReadFileOrEmpty(dir.File("out"));
        return out.find("metrics on ") != std::string::npos &&
               out.back() == '\n';
      },
      absl::Seconds(10)))
      << out << testing::ReadFileOrEmpty(dir.File("err"));
  EXPECT_NE(out.find("ddprun-rendezvous listening on 127.0.0.1:"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("ddprun-rendezvous metrics on http://127.0.0.1:"),
            std::string::npos)
      << "/metrics binds loopback unless --metrics-host says otherwise: "
      << out;
  EXPECT_NE(testing::ReadFileOrEmpty(dir.File("err")).find("--insecure"),
            std::string::npos)
      << "the server warns that it runs without a token";
}

}  // namespace
}  // namespace ddprun::rendezvous
