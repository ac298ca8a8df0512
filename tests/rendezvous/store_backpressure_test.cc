// Back-pressure on store writes against a real server whose clock only the
// test moves: a job past its write rate gets its writes parked (counted by
// the server, never timed), another job is answered meanwhile, a parked
// write takes effect when it is answered, a cancelled one never does, and
// parking is bounded by the job's share.
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/clock.h"
#include "ddprun/v1/store.grpc.pb.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "gtest/gtest.h"
#include "rendezvous/service/server.h"
#include "tests/testing/wait_for.h"

namespace ddprun::rendezvous {
namespace {

using ::ddprun::testing::WaitFor;

constexpr int kValueBytes = 1000;

class StoreBackPressureTest : public ::testing::Test {
 protected:
  virtual int64_t MaxHeldRefusals() const { return 4096; }
  void SetUp() override {
    ServerOptions options;
    options.limits.max_held_store_refusals = MaxHeldRefusals();
    options.clock = &clock_;
    options.limits.max_job_store_write_bytes_per_s = 1000;
    options.limits.job_store_write_burst_bytes = 2500;  // two writes
    options.limits.max_job_parked_write_bytes = 2500;   // two writes
    auto server = Server::Start(options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    store_ = v1::Store::NewStub(grpc::CreateChannel(
        server_->endpoint(), grpc::InsecureChannelCredentials()));
  }
  void TearDown() override {
    clock_.Advance(absl::Hours(1));  // releases whatever is still parked
    for (std::thread& t : threads_) t.join();
  }

  grpc::Status Set(const std::string& run_id, const std::string& key,
                   absl::Duration deadline = absl::Seconds(30)) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + deadline));
    v1::SetRequest request;
    request.mutable_scope()->set_run_id(run_id);
    request.set_key(key);
    request.set_value(std::string(kValueBytes, 'v'));
    v1::SetResponse response;
    return store_->Set(&context, request, &response);
  }
  // A Set on its own thread; its status lands in *status.
  void SetInBackground(const std::string& run_id, const std::string& key,
                       grpc::Status* status,
                       absl::Duration deadline = absl::Seconds(30)) {
    threads_.emplace_back([this, run_id, key, status, deadline] {
      grpc::Status s = Set(run_id, key, deadline);
      absl::MutexLock lock(&mu_);
      *status = s;
      ++finished_;
    });
  }
  bool Stored(const std::string& run_id, const std::string& key) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
    v1::CheckRequest request;
    request.mutable_scope()->set_run_id(run_id);
    request.add_keys(key);
    v1::CheckResponse response;
    grpc::Status status = store_->Check(&context, request, &response);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return response.ready();
  }
  int finished() {
    absl::MutexLock lock(&mu_);
    return finished_;
  }
  // Spends the hog's burst: two writes answered at once.
  void SpendBurst() {
    ASSERT_TRUE(Set("hog", "burst-0").ok());
    ASSERT_TRUE(Set("hog", "burst-1").ok());
    ASSERT_EQ(server_->DelayedStoreWritesForTest(), 0);
  }

  // Two writes past the spent burst, parked: "parked-0" and "parked-1".
  void ParkTwoWrites() {
    for (int i = 0; i < 2; ++i) {
      SetInBackground("hog", absl::StrCat("parked-", i), &parked_[i]);
      ASSERT_TRUE(WaitFor(
          [&] { return server_->ParkedStoreWritesForTest() == size_t(i + 1); },
          absl::Seconds(30)));
    }
  }

  common::FakeClock clock_;
  std::unique_ptr<Server> server_;
  std::unique_ptr<v1::Store::Stub> store_;
  std::vector<std::thread> threads_;
  absl::Mutex mu_;
  int finished_ ABSL_GUARDED_BY(mu_) = 0;
  // ParkTwoWrites' answers: members, since a parked write may be answered
  // only in TearDown, after the test's own variables are gone.
  grpc::Status parked_[2] ABSL_GUARDED_BY(mu_);
};

TEST_F(StoreBackPressureTest, AJobPastItsRateIsAnsweredLateAndOthersAtOnce) {
  SpendBurst();
  grpc::Status late = grpc::Status(grpc::StatusCode::UNKNOWN, "not answered");
  SetInBackground("hog", "late", &late);
  ASSERT_TRUE(WaitFor([&] { return server_->ParkedStoreWritesForTest() == 1; },
                      absl::Seconds(30)));
  EXPECT_EQ(server_->DelayedStoreWritesForTest(), 1);
  // Parked, not applied: the write takes effect when it is answered.
  EXPECT_FALSE(Stored("hog", "late"));
  // Another job's write is answered while the hog's waits (the server's
  // clock does not move, so the hog's cannot have been released).
  ASSERT_TRUE(Set("victim", "addr").ok());
  EXPECT_TRUE(Stored("victim", "addr"));
  EXPECT_EQ(server_->ParkedStoreWritesForTest(), 1u);
  EXPECT_EQ(finished(), 0);
  // Once the rate has paid for it, it is applied and answered.
  clock_.Advance(absl::Seconds(2));
  ASSERT_TRUE(WaitFor([&] { return finished() == 1; }, absl::Seconds(30)));
  {
    absl::MutexLock lock(&mu_);
    EXPECT_TRUE(late.ok()) << late.error_message();
  }
  EXPECT_TRUE(Stored("hog", "late"));
  EXPECT_EQ(server_->ParkedStoreWritesForTest(), 0u);
}

TEST_F(StoreBackPressureTest, AParkedWriteCancelledIsNeverApplied) {
  SpendBurst();
  grpc::Status late;
  SetInBackground("hog", "cancelled", &late, absl::Milliseconds(300));
  // Parked until its client's deadline (real time) passes; the server's
  // clock never moves meanwhile.
  ASSERT_TRUE(WaitFor([&] { return finished() == 1; }, absl::Seconds(30)));
  {
    absl::MutexLock lock(&mu_);
    EXPECT_EQ(late.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED)
        << late.error_message();
  }
  EXPECT_EQ(server_->DelayedStoreWritesForTest(), 1);
  ASSERT_TRUE(WaitFor([&] { return server_->ParkedStoreWritesForTest() == 0; },
                      absl::Seconds(30)));
  clock_.Advance(absl::Seconds(10));
  // A later write is released by the next tick: the cancelled one would
  // have gone before it, and did not.
  grpc::Status after = grpc::Status(grpc::StatusCode::UNKNOWN, "not answered");
  SetInBackground("hog", "after", &after);
  ASSERT_TRUE(WaitFor([&] { return finished() == 2; }, absl::Seconds(30)));
  EXPECT_TRUE(Stored("hog", "after"));
  EXPECT_FALSE(Stored("hog", "cancelled"));
}

// Past its parked share a write is refused, but answered only when the
// job's rate has paid for it: a client with more calls in flight than the
// share still slows down to the rate.
TEST_F(StoreBackPressureTest,
       PastItsParkedShareAWriteIsRefusedWhenItsRateHasPaid) {
  SpendBurst();
  ASSERT_NO_FATAL_FAILURE(ParkTwoWrites());
  grpc::Status refused = grpc::Status(grpc::StatusCode::UNKNOWN, "no answer");
  SetInBackground("hog", "refused", &refused);
  ASSERT_TRUE(WaitFor([&] { return server_->HeldStoreRefusalsForTest() == 1; },
                      absl::Seconds(30)));
  EXPECT_EQ(server_->ParkedStoreWritesForTest(), 3u);
  EXPECT_EQ(finished(), 0) << "nothing is answered before the rate pays";
  // The two parked writes are due 1 s and 2 s on, the refusal 3 s on.
  clock_.Advance(absl::Milliseconds(2100));
  ASSERT_TRUE(WaitFor([&] { return finished() == 2; }, absl::Seconds(30)));
  EXPECT_TRUE(Stored("hog", "parked-0"));
  EXPECT_TRUE(Stored("hog", "parked-1"));
  EXPECT_EQ(server_->ParkedStoreWritesForTest(), 1u);
  clock_.Advance(absl::Seconds(1));
  ASSERT_TRUE(WaitFor([&] { return finished() == 3; }, absl::Seconds(30)));
  {
    absl::MutexLock lock(&mu_);
    EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
    EXPECT_NE(refused.error_message().find("--max-job-parked-write-bytes"),
              std::string::npos)
        << refused.error_message();
  }
  EXPECT_FALSE(Stored("hog", "refused"));
  EXPECT_EQ(server_->ParkedStoreWritesForTest(), 0u);
}

class NoHeldRefusalsTest : public StoreBackPressureTest {
 protected:
  int64_t MaxHeldRefusals() const override { return 0; }
};

TEST_F(NoHeldRefusalsTest, PastItsParkedShareAWriteIsRefusedAtOnce) {
  SpendBurst();
  ASSERT_NO_FATAL_FAILURE(ParkTwoWrites());
  grpc::Status refused = Set("hog", "refused");
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_NE(refused.error_message().find("--max-job-parked-write-bytes"),
            std::string::npos)
      << refused.error_message();
  EXPECT_EQ(server_->ParkedStoreWritesForTest(), 2u);
  EXPECT_EQ(server_->HeldStoreRefusalsForTest(), 0);
  EXPECT_EQ(finished(), 0);
  clock_.Advance(absl::Seconds(10));
  ASSERT_TRUE(WaitFor([&] { return finished() == 2; }, absl::Seconds(30)));
  EXPECT_FALSE(Stored("hog", "refused"));
  EXPECT_TRUE(Stored("hog", "parked-0"));
  EXPECT_TRUE(Stored("hog", "parked-1"));
}

}  // namespace
}  // namespace ddprun::rendezvous
