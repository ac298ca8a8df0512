#include "worker/worker_env.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>

#include "absl/strings/match.h"
#include "tests/testing/temp_dir.h"

namespace ddprun::worker {
namespace {

absl::StatusOr<WorkerEnv> Read(const std::map<std::string, std::string>& vars) {
  return ReadWorkerEnvFrom([&](const char* name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  });
}

TEST(WorkerEnvTest, NothingSetIsAWorldOfOne) {
  auto env = Read({});
  ASSERT_TRUE(env.ok()) << env.status();
  EXPECT_EQ(env->rank, 0);
  EXPECT_EQ(env->world_size, 1);
  EXPECT_FALSE(env->distributed());
  EXPECT_EQ(env->progress_fd, -1);
}

TEST(WorkerEnvTest, ReadsWhatDdprunSets) {
  auto env = Read({{"RANK", "3"},
                   {"LOCAL_RANK", "1"},
                   {"WORLD_SIZE", "4"},
                   {"LOCAL_WORLD_SIZE", "2"},
                   {"MASTER_ADDR", "10.0.0.1"},
                   {"MASTER_PORT", "29500"},
                   {"TORCHELASTIC_RESTART_COUNT", "2"},
                   {"TORCHELASTIC_ERROR_FILE", "/tmp/e.json"},
                   {"DDPRUN_STORE_ENDPOINT", "10.0.0.9:29400"},
                   {"DDPRUN_STORE_RUN_ID", "job"},
                   {"DDPRUN_ROUND", "7"},
                   {"DDPRUN_LOCAL_ADDR", "10.0.0.2"},
                   {"DDPRUN_TOKEN", "secret"},
                   {"DDPRUN_PROGRESS_FD", "9"},
                   {"DDPRUN_CONTROL_FD", "11"}});
  ASSERT_TRUE(env.ok()) << env.status();
  EXPECT_EQ(env->rank, 3);
  EXPECT_EQ(env->local_rank, 1);
  EXPECT_EQ(env->world_size, 4);
  EXPECT_EQ(env->local_world_size, 2);
  EXPECT_EQ(env->master_port, 29500);
  EXPECT_EQ(env->restart_count, 2);
  EXPECT_EQ(env->error_file, "/tmp/e.json");
  EXPECT_EQ(env->store_endpoint, "10.0.0.9:29400");
  EXPECT_EQ(env->store_run_id, "job");
  EXPECT_EQ(env->round, 7);
  EXPECT_EQ(env->local_addr, "10.0.0.2");
  EXPECT_EQ(env->credentials.token, "secret");
  EXPECT_EQ(env->progress_fd, 9);
  EXPECT_EQ(env->control_fd, 11);
}

TEST(WorkerEnvTest, BadValuesNameTheVariable) {
  auto not_number = Read({{"WORLD_SIZE", "two"}});
  ASSERT_FALSE(not_number.ok());
  EXPECT_TRUE(
      absl::StrContains(not_number.status().message(), "WORLD_SIZE='two'"))
      << not_number.status();
  auto outside = Read({{"WORLD_SIZE", "2"},
                       {"RANK", "2"},
                       {"DDPRUN_STORE_ENDPOINT", "127.0.0.1:1"}});
  ASSERT_FALSE(outside.ok());
  EXPECT_TRUE(absl::StrContains(outside.status().message(), "RANK='2'"))
      << outside.status();
  auto nowhere = Read({{"WORLD_SIZE", "2"}, {"RANK", "1"}});
  ASSERT_FALSE(nowhere.ok());
  EXPECT_TRUE(
      absl::StrContains(nowhere.status().message(), "DDPRUN_STORE_ENDPOINT"))
      << nowhere.status();
}

TEST(WorkerEnvTest, ReadsTheStoresTlsSettings) {
  auto env = Read({{"DDPRUN_TLS_CA_FILE", "/etc/ca.crt"},
                   {"DDPRUN_TLS_CERT_FILE", "/etc/w.crt"},
                   {"DDPRUN_TLS_KEY_FILE", "/etc/w.key"},
                   {"DDPRUN_TLS_SERVER_NAME", "rendezvous"}});
  ASSERT_TRUE(env.ok()) << env.status();
  EXPECT_EQ(env->credentials.tls_ca_file, "/etc/ca.crt");
  EXPECT_EQ(env->credentials.tls_cert_file, "/etc/w.crt");
  EXPECT_EQ(env->credentials.tls_key_file, "/etc/w.key");
  EXPECT_EQ(env->credentials.tls_server_name, "rendezvous");
  auto half = Read({{"DDPRUN_TLS_CA_FILE", "/etc/ca.crt"},
                    {"DDPRUN_TLS_CERT_FILE", "/etc/w.crt"}});
  ASSERT_FALSE(half.ok());
  EXPECT_TRUE(absl::StrContains(half.status().message(), "DDPRUN_TLS_KEY_FILE"))
      << half.status();
}

TEST(WorkerEnvTest, OnlyTrueMeansTheAgentServesTheStore) {
  // torchrun sets TORCHELASTIC_USE_AGENT_STORE=False when rank 0 is to
  // serve the TCPStore itself.
  EXPECT_FALSE(Read({})->use_agent_store);
  EXPECT_FALSE(
      Read({{"TORCHELASTIC_USE_AGENT_STORE", "False"}})->use_agent_store);
  EXPECT_TRUE(
      Read({{"TORCHELASTIC_USE_AGENT_STORE", "True"}})->use_agent_store);
}

TEST(WorkerEnvTest, CredentialsTheAgentWroteReadBack) {
  testing::TempDir dir;
  std::ofstream(dir.File("token")) << "  s3cret \n";
  // Token files must be private (common/secret_file.h).
  std::filesystem::permissions(
      dir.File("token"),
      std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
  common::Credentials given;
  given.token_file = dir.File("token");
  given.tls_ca_file = "/etc/ca.crt";
  given.tls_server_name = "rendezvous";
  std::map<std::string, std::string> vars = {
      {"DDPRUN_TLS_KEY_FILE", "/left/over.key"}};
  given.ToEnv(vars);
  EXPECT_EQ(vars.count("DDPRUN_TLS_KEY_FILE"), 0u);  // the agent's, only
  auto env = Read(vars);
  ASSERT_TRUE(env.ok()) << env.status();
  EXPECT_EQ(env->credentials.token, "s3cret");
  EXPECT_EQ(env->credentials.token_file, dir.File("token"));
  EXPECT_EQ(env->credentials.tls_ca_file, "/etc/ca.crt");
  EXPECT_EQ(env->credentials.tls_server_name, "rendezvous");
}

TEST(WorkerEnvTest, AnUnreadableTokenFileIsNamed) {
  auto env = Read({{"DDPRUN_TOKEN_FILE", "/nonexistent/token"}});
  ASSERT_FALSE(env.ok());
  EXPECT_TRUE(absl::StrContains(env.status().message(), "DDPRUN_TOKEN_FILE"))
      << env.status();
  EXPECT_TRUE(absl::StrContains(env.status().message(), "/nonexistent/token"))
      << env.status();
}

TEST(WorkerEnvTest, TheSharedMemoryFolderIsReadBeforeTheRound) {
  // A prewarmed worker (DDPRUN_STANDBY_FD set) reads it before its round.
  std::map<std::string, std::string> vars = {{"DDPRUN_STANDBY_FD", "5"},
                                             {"DDPRUN_SHM_DIR", "/dev/shm/x"}};
  auto lookup = [&](const char* name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
  EXPECT_EQ(ReadShmDir(lookup), "/dev/shm/x");
  vars.erase("DDPRUN_SHM_DIR");
  EXPECT_EQ(ReadShmDir(lookup), "");
}

}  // namespace
}  // namespace ddprun::worker
