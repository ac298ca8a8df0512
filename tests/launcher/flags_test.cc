#include "launcher/cli/flags.h"

#include <stdlib.h>

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "launcher/cli/program_command.h"

namespace ddprun::launcher {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

absl::StatusOr<CommandLine> Parse(std::vector<std::string> args) {
  args.insert(args.begin(), "ddprun");
  std::vector<const char*> argv;
  for (const std::string& a : args) argv.push_back(a.c_str());
  return ParseCommandLine(static_cast<int>(argv.size()), argv.data());
}

TEST(FlagsTest, TorchrunFlagsInBothSpellings) {
  auto c = Parse({"--nnodes", "1:3", "--nproc_per_node", "4", "--rdzv-endpoint",
                  "10.0.0.1:29400", "--rdzv_id", "job7", "--max_restarts", "2",
                  "--monitor-interval", "0.25", "--rdzv-conf",
                  "join_timeout=2,last_call_timeout=0.5", "--node_rank", "1",
                  "./train", "--lr", "0.1"});
  ASSERT_TRUE(c.ok()) << c.status();
  const LaunchOptions& o = c->launch;
  EXPECT_EQ(o.min_nodes, 1);
  EXPECT_EQ(o.max_nodes, 3);
  EXPECT_EQ(o.nproc_per_node, 4);
  EXPECT_EQ(o.rdzv_endpoint, "10.0.0.1:29400");
  EXPECT_EQ(o.rdzv_id, "job7");
  EXPECT_EQ(o.max_restarts, 2);
  EXPECT_EQ(o.node_rank, 1);
  EXPECT_EQ(o.monitor_interval, absl::Milliseconds(250));
  EXPECT_EQ(o.rdzv_conf.join_timeout, absl::Seconds(2));
  EXPECT_EQ(o.rdzv_conf.last_call_timeout, absl::Milliseconds(500));
  EXPECT_THAT(o.program, ElementsAre("./train", "--lr", "0.1"));
}

TEST(FlagsTest, ProgramArgumentsPassThroughUntouched) {
  // Flags after the program belong to the program, even ddprun's own.
  auto c =
      Parse({"--standalone", "prog", "--nnodes", "5", "--bogus", "--", "x"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_THAT(c->launch.program,
              ElementsAre("prog", "--nnodes", "5", "--bogus", "--", "x"));
  EXPECT_EQ(c->launch.min_nodes, 1);
}

TEST(FlagsTest, StandaloneGetsARandomRunIdAndOneNode) {
  auto a = Parse({"--standalone", "--nnodes", "2", "prog"});
  auto b = Parse({"--standalone", "prog"});
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->launch.max_nodes, 1);
  EXPECT_NE(a->launch.rdzv_id, "none");
  EXPECT_NE(a->launch.rdzv_id, b->launch.rdzv_id);
}

TEST(FlagsTest, ReadsPetEnvironment) {
  setenv("PET_NPROC_PER_NODE", "3", 1);
  setenv("PET_RDZV_ENDPOINT", "h:1", 1);
  auto c = Parse({"prog"});
  unsetenv("PET_NPROC_PER_NODE");
  unsetenv("PET_RDZV_ENDPOINT");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->launch.nproc_per_node, 3);
  EXPECT_EQ(c->launch.rdzv_endpoint, "h:1");
}

TEST(FlagsTest, HostTlsIsTheServersCertificateAndKey) {
  auto c = Parse({"--nnodes", "2", "--rdzv-endpoint", "h:29400",
                  "--tls-ca-file", "ca.crt", "--host-tls-cert-file",
                  "server.crt", "--host_tls_key_file", "server.key", "prog"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->launch.host_tls.cert_file, "server.crt");
  EXPECT_EQ(c->launch.host_tls.key_file, "server.key");
  EXPECT_TRUE(c->launch.host_tls.client_ca_file.empty());
  // A joining-only node may carry the same line (one command for all).
  auto joiner =
      Parse({"--nnodes", "2", "--master-addr", "h", "--node-rank", "1",
             "--tls-ca-file", "ca.crt", "--host-tls-cert-file", "server.crt",
             "--host-tls-key-file", "server.key", "prog"});
  EXPECT_TRUE(joiner.ok()) << joiner.status();
}

TEST(FlagsTest, HostTlsCombinationsThatCannotWorkAreRefused) {
  // Must serve, TLS asked for, nothing to serve it with.
  auto no_cert =
      Parse({"--nnodes", "2", "--rdzv-endpoint", "h:29400", "--rdzv-conf",
             "is_host=1", "--tls-ca-file", "ca.crt", "prog"});
  EXPECT_THAT(no_cert.status().message(),
              HasSubstr("give --host-tls-cert-file and --host-tls-key-file"));
  auto static_rank0 =
      Parse({"--nnodes", "2", "--master-addr", "h", "--node-rank", "0",
             "--tls-ca-file", "ca.crt", "prog"});
  EXPECT_THAT(static_rank0.status().message(),
              HasSubstr("give --host-tls-cert-file and --host-tls-key-file"));
  auto no_key =
      Parse({"--nnodes", "2", "--rdzv-endpoint", "h:29400", "--tls-ca-file",
             "ca.crt", "--host-tls-cert-file", "server.crt", "prog"});
  EXPECT_THAT(no_key.status().message(),
              HasSubstr("--host-tls-cert-file without --host-tls-key-file"));
  auto no_ca = Parse({"--nnodes", "2", "--rdzv-endpoint", "h:29400",
                      "--host-tls-cert-file", "server.crt",
                      "--host-tls-key-file", "server.key", "prog"});
  EXPECT_THAT(no_ca.status().message(),
              HasSubstr("--host-tls-cert-file without --tls-ca-file"));
  // Joining a TLS ddprun-rendezvous needs no certificate.
  auto joins = Parse({"--nnodes", "2", "--rdzv-endpoint", "h:29400",
                      "--tls-ca-file", "ca.crt", "prog"});
  EXPECT_TRUE(joins.ok()) << joins.status();
}

TEST(FlagsTest, HostTlsClientCaIsMutualTls) {
  auto c = Parse({"--nnodes", "2", "--rdzv-endpoint", "h:29400",
                  "--tls-ca-file", "ca.crt", "--tls-cert-file", "client.crt",
                  "--tls-key-file", "client.key", "--host-tls-cert-file",
                  "server.crt", "--host-tls-key-file", "server.key",
                  "--host-tls-client-ca-file", "clients-ca.crt", "prog"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->launch.host_tls.client_ca_file, "clients-ca.crt");
  // As torchrun's house form, PET_<FLAG>.
  setenv("PET_HOST_TLS_CLIENT_CA_FILE", "env-ca.crt", 1);
  auto from_env =
      Parse({"--nnodes", "2", "--rdzv-endpoint", "h:29400", "--tls-ca-file",
             "ca.crt", "--tls-cert-file", "client.crt", "--tls-key-file",
             "client.key", "--host-tls-cert-file", "server.crt",
             "--host-tls-key-file", "server.key", "prog"});
  unsetenv("PET_HOST_TLS_CLIENT_CA_FILE");
  ASSERT_TRUE(from_env.ok()) << from_env.status();
  EXPECT_EQ(from_env->launch.host_tls.client_ca_file, "env-ca.crt");
}

TEST(FlagsTest, HostTlsClientCaWithoutServedCertificateIsRefused) {
  auto c = Parse({"--nnodes", "2", "--rdzv-endpoint", "h:29400",
                  "--tls-ca-file", "ca.crt", "--tls-cert-file", "client.crt",
                  "--tls-key-file", "client.key", "--host-tls-client-ca-file",
                  "clients-ca.crt", "prog"});
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(c.status().message(),
              HasSubstr("--host-tls-client-ca-file without "
                        "--host-tls-cert-file"));
  EXPECT_THAT(c.status().message(),
              HasSubstr("give --host-tls-cert-file and --host-tls-key-file"));
}

TEST(FlagsTest, HostTlsClientCaWithoutOwnClientCertificateIsRefused) {
  // The hosting agent is the first caller of what it serves.
  auto c = Parse({"--nnodes", "2", "--rdzv-endpoint", "h:29400",
                  "--tls-ca-file", "ca.crt", "--host-tls-cert-file",
                  "server.crt", "--host-tls-key-file", "server.key",
                  "--host-tls-client-ca-file", "clients-ca.crt", "prog"});
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(c.status().message(),
              HasSubstr("--host-tls-client-ca-file without --tls-cert-file "
                        "and --tls-key-file"));
  auto key_only =
      Parse({"--nnodes", "2", "--rdzv-endpoint", "h:29400", "--tls-ca-file",
             "ca.crt", "--tls-key-file", "client.key", "--host-tls-cert-file",
             "server.crt", "--host-tls-key-file", "server.key",
             "--host-tls-client-ca-file", "clients-ca.crt", "prog"});
  EXPECT_FALSE(key_only.ok());
}

TEST(FlagsTest, RedirectsTeeAndFilter) {
  auto c = Parse({"--standalone", "--redirects", "0:1,1:2", "--tee", "3",
                  "--local-ranks-filter", "0,2", "prog"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->launch.redirects.For(0), 1);
  EXPECT_EQ(c->launch.redirects.For(1), 2);
  EXPECT_EQ(c->launch.redirects.For(5), 0);
  EXPECT_EQ(c->launch.tee.For(7), 3);
  EXPECT_THAT(c->launch.local_ranks_filter, ElementsAre(0, 2));
}

// Prewarming is on by default where it is cheap (the agent decides, once
// the program says it waits for its round); --no-prewarm turns it off.
TEST(FlagsTest, PrewarmIsAutomaticUnlessTurnedOnOrOff) {
  auto c = Parse({"--standalone", "./train"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->launch.prewarm, LaunchOptions::Prewarm::kAuto);
  auto off = Parse({"--standalone", "--no-prewarm", "./train"});
  ASSERT_TRUE(off.ok()) << off.status();
  EXPECT_EQ(off->launch.prewarm, LaunchOptions::Prewarm::kOff);
  // The default stays quietly off where standbys cannot run: a split
  // console is no usage error unless --prewarm was asked for.
  auto tee = Parse({"--standalone", "--tee", "3", "./train"});
  ASSERT_TRUE(tee.ok()) << tee.status();
  EXPECT_EQ(tee->launch.prewarm, LaunchOptions::Prewarm::kAuto);
  EXPECT_FALSE(tee->launch.PlainConsole());
}

// --prewarm: Python programs run the standby shim; any other program runs as
// it is and waits for its round itself (libddp's AwaitActivation).
TEST(FlagsTest, PrewarmRunsANonPythonProgramAsItIs) {
  auto c = Parse({"--standalone", "--prewarm", "./train", "--lr", "0.1"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->launch.prewarm, LaunchOptions::Prewarm::kOn);
  EXPECT_THAT(BuildStandbyArgv(c->launch, ""),
              ElementsAre("./train", "--lr", "0.1"));
  auto py = Parse({"--standalone", "--prewarm", "train.py", "--lr", "0.1"});
  ASSERT_TRUE(py.ok()) << py.status();
  std::vector<std::string> argv = BuildStandbyArgv(py->launch, "/usr/bin/py");
  ASSERT_GE(argv.size(), 4u);
  EXPECT_EQ(argv[0], "/usr/bin/py");
  EXPECT_EQ(argv[2], "-c");
  EXPECT_THAT(std::vector<std::string>(argv.end() - 3, argv.end()),
              ElementsAre("train.py", "--lr", "0.1"));
}

TEST(FlagsTest, StatusSubcommand) {
  auto c = Parse({"status", "--rdzv-endpoint", "h:2", "--json"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->kind, CommandLine::Kind::kStatus);
  EXPECT_EQ(c->status.rdzv_endpoint, "h:2");
  EXPECT_TRUE(c->status.json);
}

struct BadInput {
  std::vector<std::string> args;
  std::string expected;  // part of the one-line message
};

class FlagsErrorTest : public ::testing::TestWithParam<BadInput> {};

TEST_P(FlagsErrorTest, OneLineNamingTheProblemAndTheFix) {
  auto c = Parse(GetParam().args);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  std::string message(c.status().message());
  EXPECT_THAT(message, HasSubstr(GetParam().expected));
  EXPECT_EQ(message.find('\n'), std::string::npos) << message;
}

INSTANTIATE_TEST_SUITE_P(
    All, FlagsErrorTest,
    ::testing::Values(
        BadInput{{"--bogus", "prog"}, "unknown flag '--bogus'"},
        BadInput{{"--standalone"}, "no program to run"},
        BadInput{{"--nnodes", "2", "prog"}, "--rdzv-endpoint"},
        BadInput{{"--nnodes", "2", "--master-addr", "h", "prog"},
                 "--node-rank"},
        BadInput{{"--nnodes", "1:2", "--master-addr", "h", "--node-rank", "0",
                  "prog"},
                 "fixed size"},
        BadInput{{"--nnodes", "2", "--rdzv-endpoint", "h:0", "prog"},
                 "port 0 works for one node only"},
        BadInput{{"--standalone", "--rdzv-conf", "is_host=maybe", "p"},
                 "is_host"},
        BadInput{{"--standalone", "--nnodes", "3:1", "p"}, "--nnodes"},
        BadInput{{"--standalone", "--nproc-per-node", "0", "p"},
                 "--nproc-per-node"},
        BadInput{{"--standalone", "--max-restarts", "-1", "p"},
                 "--max-restarts"},
        BadInput{{"--standalone", "--monitor-interval", "x", "p"},
                 "--monitor-interval"},
        BadInput{{"--standalone", "--rdzv-conf", "joni_timeout=1", "p"},
                 "unknown key 'joni_timeout'"},
        BadInput{{"--standalone", "--redirects", "7", "p"}, "--redirects"},
        BadInput{{"--standalone", "--no-python", "-m", "p"}, "--no-python"},
        BadInput{{"--standalone", "--log-level", "loud", "p"}, "--log-level"},
        BadInput{{"--standalone", "--nnodes"}, "--nnodes"},
        BadInput{{"--standalone", "--prewarm", "--tee", "3", "x.py"},
                 "--prewarm cannot be combined"},
        BadInput{{"--standalone", "--prewarm", "--no-prewarm", "x.py"},
                 "--prewarm and --no-prewarm contradict"},
        BadInput{{"status"}, "--rdzv-endpoint"},
        BadInput{{"--standalone", "--hang-bound", "blocekd=1", "p"},
                 "unknown phase 'blocekd'"}));

// --hang-bound takes every phase, the stop, the blocked and the spin bound;
// --worker-timeout fixes the blocked bound too and turns the spin bound
// (CPU time) off, so that a user who says "hung after 60 s without
// progress" has no worker killed sooner.
TEST(FlagsTest, HangBoundsByPhaseStoppedBlockedAndSpin) {
  auto c = Parse({"--standalone", "--hang-bound",
                  "step=2,eval=0,stopped=0.5,blocked=3,spin=4", "p"});
  ASSERT_TRUE(c.ok()) << c.status();
  const PhaseBoundsOptions& b = c->launch.hang_bounds;
  EXPECT_EQ(b.fixed[static_cast<int>(common::Phase::kStep)], absl::Seconds(2));
  EXPECT_EQ(b.fixed[static_cast<int>(common::Phase::kEval)],
            absl::InfiniteDuration());
  EXPECT_EQ(b.stopped, absl::Milliseconds(500));
  EXPECT_EQ(b.blocked_fixed, absl::Seconds(3));
  EXPECT_EQ(b.spin_fixed, absl::Seconds(4));
  auto defaults = Parse({"--standalone", "p"});
  ASSERT_TRUE(defaults.ok()) << defaults.status();
  EXPECT_FALSE(defaults->launch.hang_bounds.blocked_fixed.has_value());
  EXPECT_FALSE(defaults->launch.hang_bounds.spin_fixed.has_value());
  auto timeout = Parse({"--standalone", "--worker-timeout", "60", "p"});
  ASSERT_TRUE(timeout.ok()) << timeout.status();
  EXPECT_EQ(timeout->launch.hang_bounds.blocked_fixed, absl::Seconds(60));
  EXPECT_EQ(timeout->launch.hang_bounds.spin_fixed, absl::InfiniteDuration());
  auto both = Parse({"--standalone", "--worker-timeout", "60", "--hang-bound",
                     "spin=2", "p"});
  ASSERT_TRUE(both.ok()) << both.status();
  EXPECT_EQ(both->launch.hang_bounds.spin_fixed, absl::Seconds(2));
}

using Mode = LaunchOptions::RdzvMode;

TEST(FlagsTest, VersionIsTheProjectVersion) {
  auto c = Parse({"--version"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->kind, CommandLine::Kind::kHelp);
  EXPECT_THAT(c->help,
              testing::MatchesRegex("ddprun [0-9]+\\.[0-9]+\\.[0-9]+\n"));
}

TEST(FlagsTest, OneNodeWithoutRendezvousFlagsIsStandalone) {
  auto c = Parse({"--nproc-per-node", "2", "train.py"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->launch.rdzv_mode, Mode::kStandalone);
  EXPECT_THAT(c->launch.rdzv_id, HasSubstr("standalone-"));
}

TEST(FlagsTest, StackedSingleNodeOnPortZeroServesIt) {
  auto c = Parse({"--rdzv-backend", "c10d", "--rdzv-endpoint", "localhost:0",
                  "--nnodes", "1", "train.py"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->launch.rdzv_mode, Mode::kHost);
  EXPECT_EQ(c->launch.rdzv_endpoint, "localhost:0");
}

TEST(FlagsTest, AnEndpointIsServedWhenFreeUnlessIsHostSays) {
  auto c = Parse({"--nnodes", "2", "--rdzv-endpoint", "node1", "train.py"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->launch.rdzv_mode, Mode::kHostOrConnect);
  EXPECT_EQ(c->launch.rdzv_endpoint, "node1:29400");  // torchrun's default
  auto no = Parse({"--nnodes", "2", "--rdzv-endpoint", "node1:1234",
                   "--rdzv-conf", "is_host=0", "train.py"});
  ASSERT_TRUE(no.ok()) << no.status();
  EXPECT_EQ(no->launch.rdzv_mode, Mode::kConnect);
  auto yes = Parse({"--nnodes", "2", "--rdzv-endpoint", "node1:1234",
                    "--rdzv-conf", "is_host=true", "train.py"});
  ASSERT_TRUE(yes.ok()) << yes.status();
  EXPECT_EQ(yes->launch.rdzv_mode, Mode::kHost);
}

TEST(FlagsTest, StaticRendezvousNodeRankZeroServes) {
  auto r0 = Parse({"--nnodes", "2", "--node-rank", "0", "--master-addr",
                   "10.1.2.3", "--master-port", "1234", "train.py"});
  ASSERT_TRUE(r0.ok()) << r0.status();
  EXPECT_EQ(r0->launch.rdzv_mode, Mode::kHost);
  EXPECT_EQ(r0->launch.rdzv_endpoint, "10.1.2.3:1234");
  auto r1 = Parse(
      {"--nnodes=2", "--node_rank=1", "--master_addr=10.1.2.3", "train.py"});
  ASSERT_TRUE(r1.ok()) << r1.status();
  EXPECT_EQ(r1->launch.rdzv_mode, Mode::kConnect);
  EXPECT_EQ(r1->launch.rdzv_endpoint, "10.1.2.3:29500");
}

TEST(FlagsTest, KubeflowPetVariablesAlone) {
  setenv("PET_NNODES", "2", 1);
  setenv("PET_NODE_RANK", "1", 1);
  setenv("PET_MASTER_ADDR", "job-master-0", 1);
  setenv("PET_MASTER_PORT", "23456", 1);
  setenv("PET_NPROC_PER_NODE", "3", 1);
  auto c = Parse({"train.py"});
  for (const char* name : {"PET_NNODES", "PET_NODE_RANK", "PET_MASTER_ADDR",
                           "PET_MASTER_PORT", "PET_NPROC_PER_NODE"}) {
    unsetenv(name);
  }
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->launch.max_nodes, 2);
  EXPECT_EQ(c->launch.node_rank, 1);
  EXPECT_EQ(c->launch.nproc_per_node, 3);
  EXPECT_EQ(c->launch.rdzv_mode, Mode::kConnect);
  EXPECT_EQ(c->launch.rdzv_endpoint, "job-master-0:23456");
}

TEST(FlagsTest, TorchrunFlagsWithoutMeaningAreAcceptedAndListed) {
  auto c = Parse({"--start-method", "spawn", "--run_path", "--logs-specs", "x",
                  "--event-log-handler", "console", "--signals-to-handle",
                  "SIGTERM,SIGUSR1", "--rdzv-conf",
                  "timeout=9,read_timeout=45,close_timeout=7,store_type=tcp,"
                  "use_libuv=1,keep_alive_interval=2,keep_alive_max_attempt=4",
                  "train.py"});
  ASSERT_TRUE(c.ok()) << c.status();
  const LaunchOptions& o = c->launch;
  EXPECT_THAT(o.ignored_flags,
              testing::UnorderedElementsAre(
                  "--start-method spawn", "--run-path", "--logs-specs x",
                  "--event-log-handler console",
                  "--signals-to-handle SIGTERM,SIGUSR1"));
  EXPECT_THAT(o.rdzv_conf.ignored,
              ElementsAre("store_type=tcp", "use_libuv=1"));
  EXPECT_EQ(o.rdzv_conf.join_timeout, absl::Seconds(9));
  // torchrun's meanings: how long an unreachable rendezvous is waited for,
  // and how long closing it (this node's last Leave) may take.
  EXPECT_EQ(o.rdzv_conf.read_timeout, absl::Seconds(45));
  EXPECT_EQ(o.rdzv_conf.close_timeout, absl::Seconds(7));
  EXPECT_EQ(o.rdzv_conf.heartbeat_interval, absl::Seconds(2));
  EXPECT_EQ(o.rdzv_conf.heartbeat_timeout, absl::Seconds(8));
}

TEST(FlagsTest, TorchrunTwoDefaultsAndShutdownTimeout) {
  auto d = Parse({"train.py"});
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->launch.shutdown_grace, absl::Seconds(30));  // torchrun 2.x
  EXPECT_EQ(d->launch.rdzv_conf.read_timeout, absl::Seconds(60));
  EXPECT_EQ(d->launch.rdzv_conf.close_timeout, absl::Seconds(60));
  auto flag = Parse({"--shutdown-timeout", "12", "train.py"});
  ASSERT_TRUE(flag.ok()) << flag.status();
  EXPECT_EQ(flag->launch.shutdown_grace, absl::Seconds(12));
  setenv("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "7", 1);
  auto env = Parse({"train.py"});
  auto both = Parse({"--shutdown_timeout", "5", "train.py"});
  unsetenv("TORCH_ELASTIC_SHUTDOWN_TIMEOUT");
  ASSERT_TRUE(env.ok()) << env.status();
  EXPECT_EQ(env->launch.shutdown_grace, absl::Seconds(7));
  ASSERT_TRUE(both.ok()) << both.status();
  EXPECT_EQ(both->launch.shutdown_grace, absl::Seconds(5));  // the flag wins
}

TEST(FlagsTest, MasterPortAloneIsTheStandaloneWorkersPort) {
  // torchrun's static default form: one node, --master-port only.
  auto c =
      Parse({"--nproc-per-node", "1", "--master-port", "29613", "train.py"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->launch.rdzv_mode, Mode::kStandalone);
  EXPECT_EQ(c->launch.master_port, 29613);
  setenv("PET_MASTER_PORT", "29614", 1);
  auto pet = Parse({"train.py"});
  unsetenv("PET_MASTER_PORT");
  ASSERT_TRUE(pet.ok()) << pet.status();
  EXPECT_EQ(pet->launch.master_port, 29614);
}

TEST(FlagsTest, VirtualLocalRankNeedsAGpuPerWorker) {
  auto c = Parse({"--virtual-local-rank", "--nproc-per-node", "2", "train.py"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->launch.virtual_local_rank);
  setenv("CUDA_VISIBLE_DEVICES", "3", 1);
  auto short_list =
      Parse({"--virtual-local-rank", "--nproc-per-node", "2", "train.py"});
  unsetenv("CUDA_VISIBLE_DEVICES");
  ASSERT_FALSE(short_list.ok());
  EXPECT_THAT(short_list.status().message(),
              HasSubstr("CUDA_VISIBLE_DEVICES=3, which lists 1"));
}

// Each bad value is refused before anything starts, with a message that
// names the value and says what to write instead.
TEST(FlagsTest, BadInputNamesTheValueAndTheFix) {
  struct Case {
    std::vector<std::string> args;
    std::string says;
  } cases[] = {
      {{"--rdzv-id", "../../escaped", "train.py"},
       "--rdzv-id: '../../escaped' is not a run id"},
      {{"--rdzv-id", "a/b", "train.py"}, "write e.g. --rdzv-id job-42"},
      {{"--rdzv-id", std::string(129, 'a'), "train.py"}, "1 to 128 letters"},
      {{"--rdzv-id", "-x", "train.py"}, "starting with a letter or digit"},
      {{"--nproc-per-node", "100000", "train.py"},
       "--max-nproc-per-node 100000 if you mean it"},
      {{"--monitor-interval", "nan", "train.py"},
       "--monitor-interval: 'nan' is not a finite"},
      {{"--shutdown-grace", "inf", "train.py"},
       "--shutdown-grace: 'inf' is not a finite"},
      {{"--worker-timeout", "-1", "train.py"}, "write e.g. --worker-timeout 5"},
      {{"--rdzv-conf", "join_timeout=nan", "train.py"},
       "--rdzv-conf join_timeout: 'nan' is not a finite"},
      {{"--shutdown-timeout", "1e999", "train.py"}, "'1e999' is not a finite"},
      {{"--numa-binding", "node", "train.py"}, "under numactl"},
  };
  for (const Case& c : cases) {
    auto parsed = Parse(c.args);
    ASSERT_FALSE(parsed.ok()) << c.args[1];
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(parsed.status().message(), HasSubstr(c.says)) << c.args[1];
  }
  auto raised = Parse({"--nproc-per-node", "600", "--max-nproc-per-node",
                       "1000", "--rdzv-id", "job_7.b-2", "train.py"});
  ASSERT_TRUE(raised.ok()) << raised.status();
  EXPECT_EQ(raised->launch.nproc_per_node, 600);
}

}  // namespace
}  // namespace ddprun::launcher
