// The store's write rate (StoreWriteRate) with explicit times: a job under
// its rate is answered at once, one over it waits exactly what its bucket
// needs, jobs do not share buckets, and parking is bounded.
#include "rendezvous/core/store_write_rate.h"

#include <string>

#include "gtest/gtest.h"

namespace ddprun::rendezvous {
namespace {

constexpr int64_t kRate = 1000;  // bytes per second
const absl::Time kStart = absl::UnixEpoch() + absl::Hours(1);

StoreWriteRateOptions Options() {
  return {.bytes_per_s = kRate,
          .burst_bytes = 2000,
          .max_parked_bytes = 5000,
          .max_total_parked_bytes = 8000};
}

bool Now(const WriteDecision& d) {
  return d.refused.ok() && d.release_at == absl::InfinitePast();
}

TEST(StoreWriteRateTest, UnderItsRateAJobIsNeverDelayed) {
  StoreWriteRate rate(Options());
  // 500 bytes/s for a minute: half the rate.
  for (int i = 0; i < 120; ++i) {
    WriteDecision d =
        rate.Admit("job", 250, kStart + absl::Milliseconds(500) * i);
    ASSERT_TRUE(Now(d)) << "write " << i;
  }
  EXPECT_EQ(rate.parked_bytes("job"), 0);
}

TEST(StoreWriteRateTest,
     TheBurstGoesAtOnceThenEachWriteWaitsWhatTheBucketNeeds) {
  StoreWriteRate rate(Options());
  // 2000 bytes of burst at once.
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(Now(rate.Admit("job", 500, kStart)));
  // Then the rate: the next 500 bytes are paid for 0.5 s later, the ones
  // after them 1 s later.
  WriteDecision first = rate.Admit("job", 500, kStart);
  ASSERT_TRUE(first.refused.ok());
  EXPECT_EQ(first.release_at, kStart + absl::Milliseconds(500));
  WriteDecision second = rate.Admit("job", 500, kStart);
  EXPECT_EQ(second.release_at, kStart + absl::Seconds(1));
  EXPECT_EQ(rate.parked_bytes("job"), 1000);
  // Later arrivals queue behind them: a write at 0.2 s is due at 1.5 s.
  WriteDecision third =
      rate.Admit("job", 500, kStart + absl::Milliseconds(200));
  EXPECT_EQ(third.release_at, kStart + absl::Milliseconds(1500));
  rate.Unpark("job", 500);
  rate.Unpark("job", 500);
  rate.Unpark("job", 500);
  EXPECT_EQ(rate.parked_bytes("job"), 0);
  // Idle long enough, the bucket is full again: a whole burst goes at once.
  const absl::Time later = kStart + absl::Seconds(10);
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(Now(rate.Admit("job", 500, later)));
  EXPECT_FALSE(Now(rate.Admit("job", 500, later)));
}

TEST(StoreWriteRateTest, AWriteLargerThanTheBurstWaitsForItsExcess) {
  StoreWriteRate rate(Options());
  WriteDecision d = rate.Admit("job", 3000, kStart);
  ASSERT_TRUE(d.refused.ok());
  EXPECT_EQ(d.release_at, kStart + absl::Seconds(1));
}

TEST(StoreWriteRateTest, AnotherJobsRateIsUntouched) {
  StoreWriteRate rate(Options());
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(Now(rate.Admit("hog", 500, kStart)));
  ASSERT_FALSE(Now(rate.Admit("hog", 500, kStart)));
  for (int i = 0; i < 4; ++i) {
    EXPECT_TRUE(Now(rate.Admit("victim", 500, kStart))) << i;
  }
  EXPECT_EQ(rate.parked_bytes("victim"), 0);
}

TEST(StoreWriteRateTest, PastItsParkedShareAJobIsRefusedAndChargedNothing) {
  StoreWriteRate rate(Options());
  ASSERT_TRUE(Now(rate.Admit("job", 2000, kStart)));
  // 5000 bytes may wait.
  for (int i = 0; i < 5; ++i) {
    WriteDecision d = rate.Admit("job", 1000, kStart);
    ASSERT_TRUE(d.refused.ok()) << i;
    EXPECT_EQ(d.release_at, kStart + absl::Seconds(i + 1));
  }
  WriteDecision refused = rate.Admit("job", 1000, kStart);
  EXPECT_EQ(refused.refused.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(refused.refused.message().find("--max-job-parked-write-bytes"),
            std::string::npos)
      << refused.refused.message();
  EXPECT_NE(refused.refused.message().find("'job'"), std::string::npos);
  EXPECT_EQ(rate.parked_bytes("job"), 5000);
  // The refusal charged nothing: once one leaves, the next is due right
  // after the five.
  rate.Unpark("job", 1000);
  WriteDecision next = rate.Admit("job", 1000, kStart);
  EXPECT_EQ(next.release_at, kStart + absl::Seconds(6));
}

TEST(StoreWriteRateTest, PastItsParkedShareARefusalIsHeldAndCharged) {
  StoreWriteRateOptions options = Options();
  options.max_held_refusals = 2;
  StoreWriteRate rate(options);
  ASSERT_TRUE(Now(rate.Admit("job", 2000, kStart)));
  for (int i = 0; i < 5; ++i) {
    ASSERT_TRUE(rate.Admit("job", 1000, kStart).refused.ok()) << i;
  }
  // Two refusals are held, each answered when the rate has paid for it,
  // as a parked write would be; they park no bytes.
  for (int i = 0; i < 2; ++i) {
    WriteDecision held = rate.Admit("job", 1000, kStart);
    EXPECT_EQ(held.refused.code(), absl::StatusCode::kResourceExhausted);
    EXPECT_EQ(held.release_at, kStart + absl::Seconds(6 + i)) << i;
  }
  EXPECT_EQ(rate.held_refusals(), 2);
  EXPECT_EQ(rate.parked_bytes("job"), 5000);
  // The third is answered at once and charges nothing.
  WriteDecision now = rate.Admit("job", 1000, kStart);
  EXPECT_EQ(now.refused.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(now.release_at, absl::InfinitePast());
  // The held ones were charged: the next write goes after them.
  rate.Unpark("job", 1000);
  rate.Unhold("job");
  EXPECT_EQ(rate.held_refusals(), 1);
  EXPECT_EQ(rate.Admit("job", 1000, kStart).release_at,
            kStart + absl::Seconds(8));
  // A job holding a refusal is not forgotten as idle.
  rate.Unpark("job", 5000);
  rate.ForgetIdle(kStart + absl::Hours(1));
  EXPECT_EQ(rate.num_jobs(), 1u);
  rate.Unhold("job");
  rate.ForgetIdle(kStart + absl::Hours(1));
  EXPECT_EQ(rate.num_jobs(), 0u);
  EXPECT_EQ(rate.held_refusals(), 0);
}

TEST(StoreWriteRateTest, AllJobsParkedWritesAreBounded) {
  StoreWriteRate rate(Options());
  for (const std::string job : {"a", "b"}) {
    ASSERT_TRUE(Now(rate.Admit(job, 2000, kStart)));
    for (int i = 0; i < 4; ++i)
      ASSERT_TRUE(rate.Admit(job, 1000, kStart).refused.ok());
  }
  EXPECT_EQ(rate.total_parked_bytes(), 8000);
  WriteDecision refused = rate.Admit("c", 2000, kStart);
  ASSERT_TRUE(refused.refused.ok()) << "c's burst goes at once";
  refused = rate.Admit("c", 1000, kStart);
  EXPECT_EQ(refused.refused.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(refused.refused.message().find("--max-memory-bytes"),
            std::string::npos)
      << refused.refused.message();
  EXPECT_EQ(StoreWriteRate::TotalParkedShare(2000, 100), 100);
  EXPECT_EQ(StoreWriteRate::TotalParkedShare(0, 100), 25);
}

TEST(StoreWriteRateTest, NoRateNeverDelaysAndIdleJobsAreForgotten) {
  StoreWriteRate off(StoreWriteRateOptions{});
  for (int i = 0; i < 100; ++i)
    ASSERT_TRUE(Now(off.Admit("job", 1 << 20, kStart)));
  StoreWriteRate rate(Options());
  ASSERT_TRUE(Now(rate.Admit("job", 1000, kStart)));
  rate.ForgetIdle(kStart);
  EXPECT_EQ(rate.num_jobs(), 1u) << "its bucket is not full yet";
  rate.ForgetIdle(kStart + absl::Seconds(1));
  EXPECT_EQ(rate.num_jobs(), 0u);
}

}  // namespace
}  // namespace ddprun::rendezvous
