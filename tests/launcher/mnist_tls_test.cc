// libddp workers reach the store through the rendezvous server's TLS (and
// mutual TLS) with a token: the agent passes its --tls-* settings on
// (DDPRUN_TLS_*), so the workers of a TLS job can form their group at all.
// Registered only in builds that have ddprun-mnist.
#include <sys/stat.h>

#include <fstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "rendezvous/service/server.h"
#include "tests/e2e/summary_json.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/temp_dir.h"

namespace ddprun::testing {
namespace {

class MnistTlsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    RunResult made = RunCommand(
        {"/bin/sh", SourcePath("tests/rendezvous/make_test_certs.sh"),
         certs_.path()},
        absl::Seconds(30));
    ASSERT_TRUE(made.exit.ok()) << made.err;
    std::ofstream(certs_.File("token")) << "s3cret-token\n";
    chmod(certs_.File("token").c_str(), 0600);  // token files must be private
  }

  // Two workers train a few steps through `server`; returns the agent's
  // result. The summary shows that both ranks formed one group.
  RunResult Train(const rendezvous::Server& server, const std::string& id,
                  const std::vector<std::string>& tls) {
    std::vector<std::string> argv = {Ddprun(),
                                     "--rdzv-endpoint",
                                     server.endpoint(),
                                     "--rdzv-id",
                                     id,
                                     "--nproc-per-node",
                                     "2",
                                     "--rdzv-conf",
                                     "join_timeout=20",
                                     "--token-file",
                                     certs_.File("token")};
    argv.insert(argv.end(), tls.begin(), tls.end());
    std::vector<std::string> program = {Mnist(),
                                        "--epochs",
                                        "1",
                                        "--data-dir",
                                        MnistDir(),
                                        "--train-limit",
                                        "2000",
                                        "--test-limit",
                                        "500",
                                        "--max-steps",
                                        "5",
                                        "--save",
                                        "",
                                        "--summary-json",
                                        dir_.File(id + ".json")};
    argv.insert(argv.end(), program.begin(), program.end());
    return RunCommand(argv, absl::Minutes(2));
  }

  rendezvous::ServerOptions MakeServerOptions(bool mutual) {
    rendezvous::ServerOptions options;
    options.host = "127.0.0.1";
    options.token = "s3cret-token";
    options.tls.cert_file = certs_.File("server.crt");
    options.tls.key_file = certs_.File("server.key");
    if (mutual) options.tls.client_ca_file = certs_.File("ca.crt");
    return options;
  }

  void ExpectTwoRanksTrained(const std::string& id) {
    std::string summary = ReadFileOrEmpty(dir_.File(id + ".json"));
    ASSERT_FALSE(summary.empty()) << "rank 0 wrote no --summary-json";
    EXPECT_EQ(SummaryNumber(summary, "world_size"), 2) << summary;
  }

  TempDir certs_;
  TempDir dir_;
};

TEST_F(MnistTlsTest, WorkersReachTheStoreThroughTls) {
  auto server = rendezvous::Server::Start(MakeServerOptions(/*mutual=*/false));
  ASSERT_TRUE(server.ok()) << server.status();
  RunResult r =
      Train(**server, "tls", {"--tls-ca-file", certs_.File("ca.crt")});
  ASSERT_TRUE(r.exit.ok()) << r.exit.ToString() << "\n" << r.err;
  ExpectTwoRanksTrained("tls");
}

TEST_F(MnistTlsTest, WorkersReachTheStoreThroughMutualTls) {
  auto server = rendezvous::Server::Start(MakeServerOptions(/*mutual=*/true));
  ASSERT_TRUE(server.ok()) << server.status();
  RunResult r = Train(
      **server, "mtls",
      {"--tls-ca-file", certs_.File("ca.crt"), "--tls-cert-file",
       certs_.File("client.crt"), "--tls-key-file", certs_.File("client.key")});
  ASSERT_TRUE(r.exit.ok()) << r.exit.ToString() << "\n" << r.err;
  ExpectTwoRanksTrained("mtls");
}

}  // namespace
}  // namespace ddprun::testing
