// Per-job authorization on a real server: a job token admits its own job's
// Rendezvous calls and store scopes, and every operation on another job is
// refused PERMISSION_DENIED without changing that job; the server's own
// token admits everything. Also the job-token subcommand.
#include <sys/stat.h>

#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/time/clock.h"
#include "common/credentials.h"
#include "ddprun/v1/rendezvous.grpc.pb.h"
#include "ddprun/v1/store.grpc.pb.h"
#include "gtest/gtest.h"
#include "rendezvous/core/job_token.h"
#include "rendezvous/service/server.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/temp_dir.h"

namespace ddprun::rendezvous {
namespace {

constexpr char kSecret[] = "the-server-secret";

TEST(JobTokenTest, IsHmacSha256OfTheRunIdInHex) {
  // RFC 4231-style check with a well-known vector: HMAC-SHA256("key",
  // "The quick brown fox jumps over the lazy dog").
  auto token = JobToken("key", "The quick brown fox jumps over the lazy dog");
  ASSERT_TRUE(token.ok()) << token.status();
  EXPECT_EQ(*token,
            "f7bc83f430538424b13298e6aa6fb143ef4d59a14946175997479dbc2d1a3cd8");
  EXPECT_TRUE(LooksLikeJobToken(*token));
  EXPECT_NE(*JobToken(kSecret, "job-a"), *JobToken(kSecret, "job-b"));
  EXPECT_NE(*JobToken(kSecret, "job-a"), *JobToken("other", "job-a"));
  auto tokens = JobTokens::Create(kSecret);
  ASSERT_TRUE(tokens.ok());
  EXPECT_EQ((*tokens)->For("job-a"), *JobToken(kSecret, "job-a"))
      << "the copied keyed state gives the same value as a fresh HMAC";
  EXPECT_EQ((*tokens)->For("job-a"), (*tokens)->For("job-a"));
  EXPECT_EQ(JobToken("", "job-a").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(LooksLikeJobToken("abc"));
  EXPECT_FALSE(LooksLikeJobToken(std::string(64, 'g')));
  EXPECT_FALSE(LooksLikeJobToken(std::string(64, 'A')));
}

class JobAuthTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ServerOptions options;
    options.token = kSecret;
    auto server = Server::Start(options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
  }

  struct Client {
    std::unique_ptr<v1::Rendezvous::Stub> rendezvous;
    std::unique_ptr<v1::Store::Stub> store;
  };
  Client ClientWith(const std::string& token) {
    common::ChannelOptions options;
    options.token = token;
    auto channel = common::CreateChannel(server_->endpoint(), options);
    EXPECT_TRUE(channel.ok()) << channel.status();
    return {v1::Rendezvous::NewStub(*channel), v1::Store::NewStub(*channel)};
  }
  static std::unique_ptr<grpc::ClientContext> Context() {
    auto context = std::make_unique<grpc::ClientContext>();
    context->set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    return context;
  }
  static v1::JoinRequest Join(const std::string& run_id,
                              const std::string& node) {
    v1::JoinRequest request;
    request.set_run_id(run_id);
    request.set_node_id(node);
    request.set_local_world_size(1);
    request.set_node_rank(-1);
    request.set_address("127.0.0.1");
    request.set_master_port(29500);
    request.mutable_config()->set_min_nodes(1);
    request.mutable_config()->set_max_nodes(1);
    return request;
  }
  static v1::StoreScope Scope(const std::string& run_id, int64_t round) {
    v1::StoreScope scope;
    scope.set_run_id(run_id);
    scope.set_round(round);
    return scope;
  }

  std::unique_ptr<Server> server_;
};

TEST_F(JobAuthTest, AJobTokenAdmitsItsOwnJob) {
  Client a = ClientWith(*JobToken(kSecret, "job-a"));
  v1::JoinResponse joined;
  grpc::Status status =
      a.rendezvous->Join(Context().get(), Join("job-a", "a0"), &joined);
  ASSERT_TRUE(status.ok()) << status.error_message();
  ASSERT_TRUE(joined.has_assignment());

  v1::HeartbeatRequest beat;
  beat.set_run_id("job-a");
  beat.set_node_id("a0");
  beat.set_round(joined.assignment().round());
  v1::HeartbeatResponse beat_response;
  status = a.rendezvous->Heartbeat(Context().get(), beat, &beat_response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_FALSE(beat_response.rejoin());

  v1::SetRequest set;
  *set.mutable_scope() = Scope("job-a", joined.assignment().round());
  set.set_key("k");
  set.set_value("v");
  v1::SetResponse set_response;
  status = a.store->Set(Context().get(), set, &set_response);
  EXPECT_TRUE(status.ok()) << status.error_message();

  v1::StatusRequest mine;
  mine.set_run_id("job-a");
  v1::StatusResponse mine_response;
  status = a.rendezvous->Status(Context().get(), mine, &mine_response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(mine_response.jobs_size(), 1);
}

TEST_F(JobAuthTest, EveryOperationOnAnotherJobIsRefused) {
  // Job A runs a round and holds a store key; job B's token tries
  // everything on A.
  Client admin = ClientWith(kSecret);
  Client a = ClientWith(*JobToken(kSecret, "job-a"));
  Client b = ClientWith(*JobToken(kSecret, "job-b"));
  v1::JoinResponse joined;
  ASSERT_TRUE(
      a.rendezvous->Join(Context().get(), Join("job-a", "a0"), &joined).ok());
  const int64_t round = joined.assignment().round();
  {
    v1::SetRequest set;
    *set.mutable_scope() = Scope("job-a", round);
    set.set_key("addr");
    set.set_value("10.0.0.1:1234");
    v1::SetResponse response;
    ASSERT_TRUE(a.store->Set(Context().get(), set, &response).ok());
  }

  struct Attempt {
    std::string name;
    std::function<grpc::Status()> call;
  };
  const v1::StoreScope scope_a = Scope("job-a", round);
  std::vector<Attempt> attempts = {
      {"Join",
       [&] {
         v1::JoinResponse r;
         return b.rendezvous->Join(Context().get(), Join("job-a", "intruder"),
                                   &r);
       }},
      {"Heartbeat",
       [&] {
         v1::HeartbeatRequest q;
         q.set_run_id("job-a");
         q.set_node_id("a0");
         q.set_round(round);
         v1::HeartbeatResponse r;
         return b.rendezvous->Heartbeat(Context().get(), q, &r);
       }},
      {"ReportFailure",
       [&] {
         v1::ReportFailureRequest q;
         q.set_run_id("job-a");
         q.set_node_id("a0");
         q.set_round(round);
         v1::ReportFailureResponse r;
         return b.rendezvous->ReportFailure(Context().get(), q, &r);
       }},
      {"Leave",
       [&] {
         v1::LeaveRequest q;
         q.set_run_id("job-a");
         q.set_node_id("a0");
         q.set_round(round);
         q.set_reason(v1::LeaveRequest::REASON_SHUTDOWN);
         v1::LeaveResponse r;
         return b.rendezvous->Leave(Context().get(), q, &r);
       }},
      {"Resume",
       [&] {
         v1::JoinRequest q = Join("job-a", "a0");
         *q.mutable_record()->mutable_assignment() = joined.assignment();
         v1::ResumeResponse r;
         return b.rendezvous->Resume(Context().get(), q, &r);
       }},
      {"Status of job-a",
       [&] {
         v1::StatusRequest q;
         q.set_run_id("job-a");
         v1::StatusResponse r;
         return b.rendezvous->Status(Context().get(), q, &r);
       }},
      {"Status of every job",
       [&] {
         v1::StatusResponse r;
         return b.rendezvous->Status(Context().get(), v1::StatusRequest(), &r);
       }},
      {"Set",
       [&] {
         v1::SetRequest q;
         *q.mutable_scope() = scope_a;
         q.set_key("addr");
         q.set_value("evil:1");
         v1::SetResponse r;
         return b.store->Set(Context().get(), q, &r);
       }},
      {"Get",
       [&] {
         v1::GetRequest q;
         *q.mutable_scope() = scope_a;
         q.set_key("addr");
         v1::GetResponse r;
         return b.store->Get(Context().get(), q, &r);
       }},
      {"Add",
       [&] {
         v1::AddRequest q;
         *q.mutable_scope() = scope_a;
         q.set_key("counter");
         q.set_delta(1);
         v1::AddResponse r;
         return b.store->Add(Context().get(), q, &r);
       }},
      {"CompareSet",
       [&] {
         v1::CompareSetRequest q;
         *q.mutable_scope() = scope_a;
         q.set_key("addr");
         q.set_expected("10.0.0.1:1234");
         q.set_desired("evil:1");
         v1::CompareSetResponse r;
         return b.store->CompareSet(Context().get(), q, &r);
       }},
      {"Check",
       [&] {
         v1::CheckRequest q;
         *q.mutable_scope() = scope_a;
         q.add_keys("addr");
         v1::CheckResponse r;
         return b.store->Check(Context().get(), q, &r);
       }},
      {"Wait",
       [&] {
         v1::WaitRequest q;
         *q.mutable_scope() = scope_a;
         q.add_keys("addr");
         v1::WaitResponse r;
         return b.store->Wait(Context().get(), q, &r);
       }},
      {"DeleteKey",
       [&] {
         v1::DeleteKeyRequest q;
         *q.mutable_scope() = scope_a;
         q.set_key("addr");
         v1::DeleteKeyResponse r;
         return b.store->DeleteKey(Context().get(), q, &r);
       }},
      {"NumKeys",
       [&] {
         v1::NumKeysRequest q;
         *q.mutable_scope() = scope_a;
         v1::NumKeysResponse r;
         return b.store->NumKeys(Context().get(), q, &r);
       }},
  };
  ASSERT_EQ(attempts.size(), 15u) << "every Rendezvous and Store method";
  for (const Attempt& attempt : attempts) {
    grpc::Status status = attempt.call();
    EXPECT_EQ(status.error_code(), grpc::StatusCode::PERMISSION_DENIED)
        << attempt.name << ": " << status.error_message();
    EXPECT_NE(status.error_message().find(attempt.name == "Status of every job"
                                              ? "server's own token"
                                              : "job-token"),
              std::string::npos)
        << attempt.name
        << ": the message says what to do: " << status.error_message();
    EXPECT_EQ(status.error_message().find(kSecret), std::string::npos);
  }

  // Job A is as it was: its node runs in the same round, its key holds.
  v1::StatusRequest q;
  q.set_run_id("job-a");
  v1::StatusResponse status_a;
  ASSERT_TRUE(a.rendezvous->Status(Context().get(), q, &status_a).ok());
  ASSERT_EQ(status_a.jobs_size(), 1);
  EXPECT_EQ(status_a.jobs(0).round(), round);
  EXPECT_EQ(status_a.jobs(0).state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(status_a.jobs(0).restart_count(), 0);
  ASSERT_EQ(status_a.jobs(0).nodes_size(), 1);
  EXPECT_EQ(status_a.jobs(0).nodes(0).node_id(), "a0");
  v1::GetRequest get;
  *get.mutable_scope() = scope_a;
  get.set_key("addr");
  v1::GetResponse got;
  ASSERT_TRUE(a.store->Get(Context().get(), get, &got).ok());
  EXPECT_EQ(got.value(), "10.0.0.1:1234");
  v1::NumKeysRequest num;
  *num.mutable_scope() = scope_a;
  v1::NumKeysResponse num_keys;
  ASSERT_TRUE(a.store->NumKeys(Context().get(), num, &num_keys).ok());
  EXPECT_EQ(num_keys.num_keys(), 1) << "no counter was added";

  // The server's own token sees every job.
  v1::StatusResponse all;
  grpc::Status status =
      admin.rendezvous->Status(Context().get(), v1::StatusRequest(), &all);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(all.jobs_size(), 1);
  // A token that is neither kind is UNAUTHENTICATED, as before.
  Client stranger = ClientWith("not-a-token");
  v1::StatusResponse none;
  EXPECT_EQ(stranger.rendezvous->Status(Context().get(), q, &none).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
}

TEST(JobTokenBinaryTest, PrintsTheJobToken) {
  testing::TempDir dir;
  const std::string secret = dir.File("secret");
  std::ofstream(secret) << kSecret << "\n";
  ASSERT_EQ(::chmod(secret.c_str(), 0600), 0);
  testing::RunResult result = testing::RunCommand(
      {testing::BinaryPath("rendezvous/ddprun-rendezvous"), "job-token",
       "--run-id", "job-a", "--token-file", secret},
      absl::Seconds(20));
  ASSERT_FALSE(result.timed_out);
  ASSERT_EQ(result.exit.exit_code, 0) << result.err;
  EXPECT_EQ(result.out, *JobToken(kSecret, "job-a") + "\n");

  testing::RunResult no_secret = testing::RunCommand(
      {testing::BinaryPath("rendezvous/ddprun-rendezvous"), "job-token",
       "--run-id", "job-a", "--token-file", dir.File("absent")},
      absl::Seconds(20));
  ASSERT_FALSE(no_secret.timed_out);
  EXPECT_NE(no_secret.exit.exit_code, 0);
  EXPECT_NE(no_secret.err.find(dir.File("absent")), std::string::npos)
      << no_secret.err;
  EXPECT_EQ(no_secret.out, "");
}

}  // namespace
}  // namespace ddprun::rendezvous
