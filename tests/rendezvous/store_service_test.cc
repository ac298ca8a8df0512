// Every Store operation against a real server on a kernel-picked port,
// through the generated stub.
#include <string>
#include <thread>

#include "absl/time/clock.h"
#include "ddprun/v1/rendezvous.grpc.pb.h"
#include "ddprun/v1/store.grpc.pb.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "gtest/gtest.h"
#include "rendezvous/service/server.h"
#include "tests/testing/wait_for.h"

namespace ddprun::rendezvous {
namespace {

class StoreServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto server = Server::Start(ServerOptions{});
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    channel_ = grpc::CreateChannel(server_->endpoint(),
                                   grpc::InsecureChannelCredentials());
    store_ = v1::Store::NewStub(channel_);
    scope_.set_run_id("free-standing");
    scope_.set_round(0);
  }

  // Waits (bounded) until exactly n store calls are parked on the server.
  bool ParkedOnServer(size_t n) {
    return ddprun::testing::WaitFor(
        [&] { return server_->NumStoreWaitersForTest() == n; },
        absl::Seconds(5));
  }

  std::unique_ptr<grpc::ClientContext> Context(
      absl::Duration deadline = absl::Seconds(10)) {
    auto context = std::make_unique<grpc::ClientContext>();
    context->set_deadline(absl::ToChronoTime(absl::Now() + deadline));
    return context;
  }

  grpc::Status Set(const std::string& key, const std::string& value,
                   const v1::StoreScope* scope = nullptr) {
    v1::SetRequest request;
    *request.mutable_scope() = scope != nullptr ? *scope : scope_;
    request.set_key(key);
    request.set_value(value);
    v1::SetResponse response;
    return store_->Set(Context().get(), request, &response);
  }

  grpc::Status Get(const std::string& key, std::string* value,
                   int64_t timeout_ms = 5000,
                   const v1::StoreScope* scope = nullptr) {
    v1::GetRequest request;
    *request.mutable_scope() = scope != nullptr ? *scope : scope_;
    request.set_key(key);
    request.set_timeout_ms(timeout_ms);
    v1::GetResponse response;
    grpc::Status status = store_->Get(Context().get(), request, &response);
    *value = response.value();
    return status;
  }

  grpc::Status Add(const std::string& key, int64_t delta, int64_t* value) {
    v1::AddRequest request;
    *request.mutable_scope() = scope_;
    request.set_key(key);
    request.set_delta(delta);
    v1::AddResponse response;
    grpc::Status status = store_->Add(Context().get(), request, &response);
    *value = response.value();
    return status;
  }

  std::string CompareSet(const std::string& key, const std::string& expected,
                         const std::string& desired) {
    v1::CompareSetRequest request;
    *request.mutable_scope() = scope_;
    request.set_key(key);
    request.set_expected(expected);
    request.set_desired(desired);
    v1::CompareSetResponse response;
    grpc::Status status =
        store_->CompareSet(Context().get(), request, &response);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return response.value();
  }

  grpc::Status Wait(const std::vector<std::string>& keys, int64_t timeout_ms) {
    v1::WaitRequest request;
    *request.mutable_scope() = scope_;
    for (const auto& k : keys) request.add_keys(k);
    request.set_timeout_ms(timeout_ms);
    v1::WaitResponse response;
    return store_->Wait(Context().get(), request, &response);
  }

  bool Check(const std::vector<std::string>& keys) {
    v1::CheckRequest request;
    *request.mutable_scope() = scope_;
    for (const auto& k : keys) request.add_keys(k);
    v1::CheckResponse response;
    EXPECT_TRUE(store_->Check(Context().get(), request, &response).ok());
    return response.ready();
  }

  int64_t NumKeys(const v1::StoreScope& scope) {
    v1::NumKeysRequest request;
    *request.mutable_scope() = scope;
    v1::NumKeysResponse response;
    EXPECT_TRUE(store_->NumKeys(Context().get(), request, &response).ok());
    return response.num_keys();
  }

  std::unique_ptr<Server> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Store::Stub> store_;
  v1::StoreScope scope_;
};

TEST_F(StoreServiceTest, SetThenGet) {
  ASSERT_TRUE(Set("k", "v").ok());
  std::string value;
  ASSERT_TRUE(Get("k", &value).ok());
  EXPECT_EQ(value, "v");
  ASSERT_TRUE(Set("k", "w").ok());
  ASSERT_TRUE(Get("k", &value).ok());
  EXPECT_EQ(value, "w");
}

TEST_F(StoreServiceTest, BlockingGetIsReleasedByALaterSet) {
  std::string value;
  grpc::Status status;
  std::thread getter([&] { status = Get("later", &value, 10000); });
  // The Get is parked on the server: wait until it is, then set.
  ASSERT_TRUE(ParkedOnServer(1));
  ASSERT_TRUE(Set("later", "arrived").ok());
  getter.join();
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(value, "arrived");
}

TEST_F(StoreServiceTest, GetTimesOutWithDeadlineExceeded) {
  std::string value;
  absl::Time start = absl::Now();
  grpc::Status status = Get("never", &value, 200);
  absl::Duration took = absl::Now() - start;
  EXPECT_EQ(status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_NE(status.error_message().find("never"), std::string::npos)
      << status.error_message();
  EXPECT_GE(took, absl::Milliseconds(200));
  EXPECT_LT(took, absl::Seconds(3));
  EXPECT_TRUE(ParkedOnServer(0));
}

TEST_F(StoreServiceTest, GetWithoutTimeoutEndsAtTheCallDeadline) {
  v1::GetRequest request;
  *request.mutable_scope() = scope_;
  request.set_key("never");
  v1::GetResponse response;
  grpc::Status status =
      store_->Get(Context(absl::Milliseconds(200)).get(), request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_TRUE(ParkedOnServer(0)) << "the cancelled Get is forgotten";
}

TEST_F(StoreServiceTest, AddCountsFromZeroAndRefusesNonNumbers) {
  int64_t value = -1;
  ASSERT_TRUE(Add("counter", 5, &value).ok());
  EXPECT_EQ(value, 5);
  ASSERT_TRUE(Add("counter", -2, &value).ok());
  EXPECT_EQ(value, 3);
  std::string text;
  ASSERT_TRUE(Get("counter", &text).ok());
  EXPECT_EQ(text, "3");
  ASSERT_TRUE(Set("word", "hello").ok());
  grpc::Status status = Add("word", 1, &value);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(status.error_message().find("hello"), std::string::npos);
}

TEST_F(StoreServiceTest, CompareSetFollowsHashStore) {
  // Missing key, empty expected: set.
  EXPECT_EQ(CompareSet("a", "", "first"), "first");
  // Missing key, non-empty expected: not set, expected returned.
  EXPECT_EQ(CompareSet("b", "x", "y"), "x");
  EXPECT_FALSE(Check({"b"}));
  // Value equals expected: set.
  EXPECT_EQ(CompareSet("a", "first", "second"), "second");
  // Value differs: current returned, unchanged.
  EXPECT_EQ(CompareSet("a", "wrong", "third"), "second");
  std::string value;
  ASSERT_TRUE(Get("a", &value).ok());
  EXPECT_EQ(value, "second");
}

TEST_F(StoreServiceTest, CheckWaitDeleteAndNumKeys) {
  EXPECT_FALSE(Check({"x", "y"}));
  ASSERT_TRUE(Set("x", "1").ok());
  EXPECT_FALSE(Check({"x", "y"}));
  grpc::Status waited;
  std::thread waiter([&] { waited = Wait({"x", "y"}, 10000); });
  ASSERT_TRUE(ParkedOnServer(1));
  ASSERT_TRUE(Set("y", "2").ok());
  waiter.join();
  EXPECT_TRUE(waited.ok()) << waited.error_message();
  EXPECT_TRUE(Check({"x", "y"}));
  EXPECT_EQ(NumKeys(scope_), 2);

  v1::DeleteKeyRequest del;
  *del.mutable_scope() = scope_;
  del.set_key("x");
  v1::DeleteKeyResponse deleted;
  ASSERT_TRUE(store_->DeleteKey(Context().get(), del, &deleted).ok());
  EXPECT_TRUE(deleted.deleted());
  ASSERT_TRUE(store_->DeleteKey(Context().get(), del, &deleted).ok());
  EXPECT_FALSE(deleted.deleted());
  EXPECT_EQ(NumKeys(scope_), 1);
  EXPECT_FALSE(Check({"x"}));
}

TEST_F(StoreServiceTest, WaitTimesOut) {
  ASSERT_TRUE(Set("present", "1").ok());
  absl::Time start = absl::Now();
  grpc::Status status = Wait({"present", "absent"}, 150);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(150));
  EXPECT_TRUE(Wait({"present"}, 150).ok()) << "present keys return at once";
}

TEST_F(StoreServiceTest, BinaryValueWithZerosPassesIntact) {
  std::string id(128, '\0');
  for (int i = 0; i < 128; ++i) id[i] = static_cast<char>((i * 37) % 256);
  id[0] = '\0';
  id[127] = '\0';
  ASSERT_TRUE(Set("ncclUniqueId", id).ok());
  std::string value;
  ASSERT_TRUE(Get("ncclUniqueId", &value).ok());
  ASSERT_EQ(value.size(), 128u);
  EXPECT_EQ(value, id);
}

TEST_F(StoreServiceTest, ScopesAreKeptApart) {
  v1::StoreScope other = scope_;
  other.set_round(1);
  v1::StoreScope third;
  third.set_run_id("another-run");
  ASSERT_TRUE(Set("k", "round0").ok());
  ASSERT_TRUE(Set("k", "round1", &other).ok());
  std::string value;
  ASSERT_TRUE(Get("k", &value).ok());
  EXPECT_EQ(value, "round0");
  ASSERT_TRUE(Get("k", &value, 5000, &other).ok());
  EXPECT_EQ(value, "round1");
  EXPECT_EQ(Get("k", &value, 50, &third).error_code(),
            grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_EQ(NumKeys(third), 0);
}

TEST_F(StoreServiceTest, StaleRoundIsRefusedAndParkedCallsReleased) {
  auto rendezvous = v1::Rendezvous::NewStub(channel_);
  v1::JoinRequest join;
  join.set_run_id("job");
  join.set_node_id("only");
  join.set_local_world_size(1);
  join.set_node_rank(-1);
  join.mutable_config()->set_max_restarts(1);
  v1::JoinResponse joined;
  ASSERT_TRUE(rendezvous->Join(Context().get(), join, &joined).ok());
  ASSERT_EQ(joined.assignment().round(), 0);
  v1::StoreScope round0;
  round0.set_run_id("job");
  round0.set_round(0);
  ASSERT_TRUE(Set("k", "v", &round0).ok());

  // A Get parked in round 0 fails when the round ends.
  grpc::Status parked;
  std::string value;
  std::thread getter([&] { parked = Get("missing", &value, 10000, &round0); });
  ASSERT_TRUE(ParkedOnServer(1));
  v1::ReportFailureRequest fail;
  fail.set_run_id("job");
  fail.set_node_id("only");
  fail.set_round(0);
  v1::ReportFailureResponse failed;
  ASSERT_TRUE(rendezvous->ReportFailure(Context().get(), fail, &failed).ok());
  getter.join();
  EXPECT_EQ(parked.error_code(), grpc::StatusCode::FAILED_PRECONDITION)
      << parked.error_message();

  grpc::Status stale = Set("k", "v2", &round0);
  EXPECT_EQ(stale.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(
      stale.error_message().find("round 0 is over; the job is in round 1"),
      std::string::npos)
      << stale.error_message();
}

}  // namespace
}  // namespace ddprun::rendezvous
