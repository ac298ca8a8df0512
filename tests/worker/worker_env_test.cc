#include "worker/worker_env.h"

#include <map>

#include <gtest/gtest.h>

#include "absl/strings/match.h"

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
  auto env = Read({{"RANK", "3"}, {"LOCAL_RANK", "1"}, {"WORLD_SIZE", "4"},
                   {"LOCAL_WORLD_SIZE", "2"}, {"MASTER_ADDR", "10.0.0.1"},
                   {"MASTER_PORT", "29500"}, {"TORCHELASTIC_RESTART_COUNT", "2"},
                   {"TORCHELASTIC_ERROR_FILE", "/tmp/e.json"},
                   {"DDPRUN_STORE_ENDPOINT", "10.0.0.9:29400"},
                   {"DDPRUN_STORE_RUN_ID", "job"}, {"DDPRUN_ROUND", "7"},
                   {"DDPRUN_LOCAL_ADDR", "10.0.0.2"}, {"DDPRUN_TOKEN", "secret"},
                   {"DDPRUN_PROGRESS_FD", "9"}});
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
  EXPECT_EQ(env->token, "secret");
  EXPECT_EQ(env->progress_fd, 9);
}

TEST(WorkerEnvTest, BadValuesNameTheVariable) {
  auto not_number = Read({{"WORLD_SIZE", "two"}});
  ASSERT_FALSE(not_number.ok());
  EXPECT_TRUE(absl::StrContains(not_number.status().message(), "WORLD_SIZE='two'"))
      << not_number.status();
  auto outside = Read({{"WORLD_SIZE", "2"}, {"RANK", "2"},
                       {"DDPRUN_STORE_ENDPOINT", "127.0.0.1:1"}});
  ASSERT_FALSE(outside.ok());
  EXPECT_TRUE(absl::StrContains(outside.status().message(), "RANK='2'"))
      << outside.status();
  auto nowhere = Read({{"WORLD_SIZE", "2"}, {"RANK", "1"}});
  ASSERT_FALSE(nowhere.ok());
  EXPECT_TRUE(absl::StrContains(nowhere.status().message(), "DDPRUN_STORE_ENDPOINT"))
      << nowhere.status();
}

TEST(WorkerEnvTest, ReadsTheStoresTlsSettings) {
  auto env = Read({{"DDPRUN_TLS_CA_FILE", "/etc/ca.crt"},
                   {"DDPRUN_TLS_CERT_FILE", "/etc/w.crt"},
                   {"DDPRUN_TLS_KEY_FILE", "/etc/w.key"},
                   {"DDPRUN_TLS_SERVER_NAME", "rendezvous"}});
  ASSERT_TRUE(env.ok()) << env.status();
  EXPECT_EQ(env->tls_ca_file, "/etc/ca.crt");
  EXPECT_EQ(env->tls_cert_file, "/etc/w.crt");
  EXPECT_EQ(env->tls_key_file, "/etc/w.key");
  EXPECT_EQ(env->tls_server_name, "rendezvous");
  auto half = Read({{"DDPRUN_TLS_CA_FILE", "/etc/ca.crt"},
                    {"DDPRUN_TLS_CERT_FILE", "/etc/w.crt"}});
  ASSERT_FALSE(half.ok());
  EXPECT_TRUE(absl::StrContains(half.status().message(), "DDPRUN_TLS_KEY_FILE"))
      << half.status();
}

}  // namespace
}  // namespace ddprun::worker
