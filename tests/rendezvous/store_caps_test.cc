// The store's memory caps (limits.h) on StoreState with a fake clock: every
// key, value, scope and parked waiter is charged to its job and the store;
// what would pass a cap is refused RESOURCE_EXHAUSTED naming the cap and its
// flag, changes nothing, and what is released gives its charge back.
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "gtest/gtest.h"
#include "rendezvous/core/store_state.h"

namespace ddprun::rendezvous {
namespace {

v1::StoreScope Scope(const std::string& run_id, int64_t round = 0) {
  v1::StoreScope scope;
  scope.set_run_id(run_id);
  scope.set_round(round);
  return scope;
}

class StoreCapsTest : public ::testing::Test {
 protected:
  static Limits Caps() {
    Limits limits;
    limits.max_job_store_bytes = 64 << 10;
    limits.max_job_store_keys = 50;
    limits.max_store_bytes = 160 << 10;
    return limits;
  }
  absl::Status Set(const std::string& run_id, const std::string& key,
                   size_t bytes, int64_t round = 0) {
    std::vector<StoreCompletion> done;
    return store_.Set(Scope(run_id, round), key, std::string(bytes, 'v'),
                      &done);
  }

  common::FakeClock clock_;
  StoreState store_{&clock_, Caps()};
};

TEST_F(StoreCapsTest, AJobsBytesAreCapped) {
  int stored = 0;
  absl::Status refused;
  for (int i = 0; i < 40 && refused.ok(); ++i) {
    refused = Set("hog", absl::StrCat("k", i), 4096);
    stored += refused.ok();
  }
  ASSERT_EQ(refused.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(refused.message().find("--max-job-store-bytes"), std::string::npos)
      << refused.message();
  EXPECT_NE(refused.message().find("'hog'"), std::string::npos);
  EXPECT_LE(store_.num_job_bytes("hog"), Caps().max_job_store_bytes);
  EXPECT_GT(store_.num_job_bytes("hog"), Caps().max_job_store_bytes - 8192);
  EXPECT_EQ(stored, 15);
  // The refused write changed nothing; overwriting with a smaller value and
  // deleting give bytes back.
  const int64_t full = store_.num_job_bytes("hog");
  std::vector<StoreCompletion> done;
  EXPECT_EQ(store_.NumKeys(Scope("hog")), stored);
  ASSERT_TRUE(Set("hog", "k0", 96).ok());
  EXPECT_EQ(store_.num_job_bytes("hog"), full - 4000);
  ASSERT_TRUE(store_.DeleteKey(Scope("hog"), "k1"));
  EXPECT_EQ(store_.num_job_bytes("hog"),
            full - 4000 - (2 + 4096 + StoreState::kEntryOverheadBytes));
  EXPECT_TRUE(Set("hog", "again", 4096).ok());
  // Another job is not affected by the hog's cap.
  EXPECT_TRUE(Set("other", "k", 4096).ok());
}

TEST_F(StoreCapsTest, AJobsKeysAreCappedAcrossItsScopes) {
  absl::Status refused;
  int stored = 0;
  for (int i = 0; i < 100 && refused.ok(); ++i) {
    // Free-standing scopes: every round is a new scope of the same job.
    refused = Set("keys", "k", 1, /*round=*/i);
    stored += refused.ok();
  }
  ASSERT_EQ(refused.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(refused.message().find("--max-job-store-keys"), std::string::npos)
      << refused.message();
  EXPECT_EQ(stored, Caps().max_job_store_keys);
}

TEST_F(StoreCapsTest, TheStoreIsCappedForAllJobsTogether) {
  absl::Status refused;
  int jobs = 0;
  for (; jobs < 10 && refused.ok(); ++jobs) {
    for (int i = 0; i < 12 && refused.ok(); ++i) {
      refused = Set(absl::StrCat("job", jobs), absl::StrCat("k", i), 4096);
    }
  }
  ASSERT_EQ(refused.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(refused.message().find("--max-store-bytes"), std::string::npos)
      << refused.message();
  EXPECT_LE(store_.num_bytes(), Caps().max_store_bytes);
  EXPECT_GT(store_.num_bytes(), Caps().max_store_bytes - 8192);
  // Releasing a job's rounds gives its bytes back to everyone.
  std::vector<StoreCompletion> done;
  store_.ReleaseRoundsBefore("job0", 1, &done);
  EXPECT_EQ(store_.num_job_bytes("job0"), 0);
  EXPECT_TRUE(Set("late", "k", 4096).ok());
}

TEST_F(StoreCapsTest, ParkedWaitersAreChargedUntilAnswered) {
  std::vector<StoreCompletion> done;
  const std::string key(1000, 'w');
  int parked = 0;
  for (WaiterId id = 1; id <= 200; ++id) {
    store_.Get(Scope("waiters"), key, absl::Seconds(5), id, &done);
    if (done.empty()) ++parked;
  }
  ASSERT_FALSE(done.empty()) << "parking is capped too";
  EXPECT_EQ(done.front().value.status().code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(static_cast<int>(store_.num_waiters()), parked);
  EXPECT_LE(store_.num_job_bytes("waiters"), Caps().max_job_store_bytes);
  // Their deadline passes: every charge is given back but the scope's.
  done.clear();
  clock_.Advance(absl::Seconds(6));
  store_.Tick(&done);
  EXPECT_EQ(static_cast<int>(done.size()), parked);
  EXPECT_EQ(store_.num_waiters(), 0u);
  EXPECT_EQ(store_.num_job_bytes("waiters"), StoreState::kScopeOverheadBytes);
  // A set answers parked waiters and releases their charge.
  done.clear();
  store_.Wait(Scope("waiters"), {"a", "b"}, absl::InfiniteDuration(), 900,
              &done);
  ASSERT_TRUE(done.empty());
  EXPECT_GT(store_.num_job_bytes("waiters"), StoreState::kScopeOverheadBytes);
  ASSERT_TRUE(Set("waiters", "a", 1).ok());
  ASSERT_TRUE(Set("waiters", "b", 1).ok());
  EXPECT_EQ(store_.num_job_bytes("waiters"),
            StoreState::kScopeOverheadBytes +
                2 * (1 + 1 + StoreState::kEntryOverheadBytes));
  store_.ReleaseRoundsBefore("waiters", 1, &done);
  EXPECT_EQ(store_.num_bytes(), 0) << "everything released, nothing leaked";
}

// The resident-memory bound (Limits::max_memory_bytes) with the resident
// memory set by hand, as the server's ticker samples it.
class MemoryBoundTest : public ::testing::Test {
 protected:
  static constexpr int64_t kBound = 10 << 20;  // a tenth: 1 MiB
  static Limits Bound() {
    Limits limits;
    limits.max_memory_bytes = kBound;
    limits.max_job_store_bytes = 64 << 20;
    limits.max_store_bytes = 64 << 20;
    return limits;
  }
  absl::Status Set(const std::string& run_id, const std::string& key,
                   size_t bytes) {
    std::vector<StoreCompletion> done;
    return store_.Set(Scope(run_id), key, std::string(bytes, 'v'), &done);
  }

  common::FakeClock clock_;
  StoreState store_{&clock_, Bound()};
};

TEST_F(MemoryBoundTest, JobsHoldingMoreThanATenthAreRefusedAtTheBound) {
  for (const char* job : {"a", "b", "c"}) {
    ASSERT_TRUE(Set(job, "k", 400 << 10).ok());
  }
  store_.SetResidentBytes(kBound - (8 << 10));
  // None holds most of the store, and together they hold more than the
  // tenth: a write past the bound is refused, one within it is not.
  const absl::Status refused = Set("a", "more", 16 << 10);
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(refused.message().find("not hold most of the store is full"),
            std::string::npos)
      << refused;
  EXPECT_TRUE(Set("c", "small", 1 << 10).ok()) << "within the bound";
}

// Memory that no store charge sees took the server past the bound while
// the store holds little: a job with a few bytes holds most of the store,
// but it is not the hog, and stores within the tenth.
TEST_F(MemoryBoundTest, ASmallJobIsNotTheHogOfANearlyEmptyStore) {
  store_.SetResidentBytes(kBound + (4 << 20));
  EXPECT_TRUE(Set("victim", "MASTER_ADDR", 256).ok());
  EXPECT_TRUE(Set("victim", "MASTER_PORT", 256).ok());
  EXPECT_EQ(Set("victim", "big", kBound / 10).code(),
            absl::StatusCode::kResourceExhausted);
}

// A hog holding most of the store is refused a tenth of the bound early;
// the memory its requests in flight take is resident but charged to no
// job, and may take the server to the bound. The other jobs still store up
// to a tenth of the bound, counted in their store bytes, and no more.
TEST_F(MemoryBoundTest, OtherJobsKeepATenthWhenAHogTookTheMemory) {
  ASSERT_TRUE(Set("hog", "fill", 8 << 20).ok());
  store_.SetResidentBytes(kBound - (kBound / 10) - (4 << 10));
  const absl::Status hog = Set("hog", "more", 8 << 10);
  EXPECT_EQ(hog.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(hog.message().find("tenth kept for other jobs"), std::string::npos)
      << hog;

  // Its requests in flight take the resident memory past the bound.
  store_.SetResidentBytes(kBound + (1 << 20));
  int64_t stored = 0;
  absl::Status victim = absl::OkStatus();
  for (int i = 0; victim.ok(); ++i) {
    victim =
        Set(i % 2 == 0 ? "victim" : "other", absl::StrCat("k", i), 64 << 10);
    if (victim.ok()) stored += 64 << 10;
  }
  EXPECT_EQ(victim.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(victim.message().find("not hold most of the store is full"),
            std::string::npos)
      << victim;
  // Nearly a tenth went to them, and no more.
  const int64_t others =
      store_.num_job_bytes("victim") + store_.num_job_bytes("other");
  EXPECT_LE(others, kBound / 10);
  EXPECT_GT(stored, kBound / 10 - (128 << 10) - 2 * (4 << 10));
  EXPECT_EQ(Set("hog", "again", 1).code(),
            absl::StatusCode::kResourceExhausted);
}

}  // namespace
}  // namespace ddprun::rendezvous
