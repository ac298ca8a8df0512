// A bounded, deterministic randomized driver over the request handlers'
// state (JobTable and StoreState) with a fake clock. Each seed runs random
// Joins, cancels, heartbeats, failures, leaves, time steps and store calls,
// and checks the invariants after every step:
// - every parked call is answered at most once, and none is lost (at the
//   end every call is answered or was cancelled);
// - the assignments of one closed round give node ranks 0..n-1 once each,
//   rank offsets that add up the local world sizes, one world size and one
//   master;
// - a job's round never goes back;
// - the store answers a parked Get with the value its key holds.
#include <cstdint>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/clock.h"
#include "gtest/gtest.h"
#include "rendezvous/core/job_table.h"
#include "rendezvous/core/store_state.h"
#include "spdlog/spdlog.h"

namespace ddprun::rendezvous {
namespace {

class Driver {
 public:
  explicit Driver(uint32_t seed)
      : rng_(seed), jobs_(&clock_, Options()), store_(&clock_, 1000) {}

  void Step() {
    switch (Pick(12)) {
      case 0:
      case 1:
      case 2:
        Join();
        break;
      case 3:
        Cancel();
        break;
      case 4:
        Heartbeat();
        break;
      case 5:
        Fail();
        break;
      case 6:
        Leave();
        break;
      case 7:
        clock_.Advance(absl::Milliseconds(Pick(700)));
        Tick();
        break;
      case 8:
        StoreWrite();
        break;
      case 9:
        StoreGet();
        break;
      case 10:
        StoreWait();
        break;
      case 11:
        StoreCancel();
        break;
    }
  }

  void Finish() {
    Effects effects;
    jobs_.CancelAllJoins(absl::UnavailableError("end"), &effects);
    Absorb(std::move(effects));
    std::vector<StoreCompletion> done;
    store_.CancelAll(absl::UnavailableError("end"), &done);
    AbsorbStore(std::move(done));
    EXPECT_TRUE(join_waiters_.empty()) << join_waiters_.size() << " lost";
    EXPECT_TRUE(store_waiters_.empty()) << store_waiters_.size() << " lost";
    EXPECT_EQ(store_.num_waiters(), 0u);
  }

  int rounds_closed() const { return rounds_closed_; }

 private:
  static JobTableOptions Options() {
    JobTableOptions options;
    options.ended_job_grace = absl::Seconds(3);
    options.limits.max_nodes_per_job = 5;
    return options;
  }

  int Pick(int n) { return std::uniform_int_distribution<int>(0, n - 1)(rng_); }
  std::string Run() { return absl::StrCat("run", Pick(2)); }
  std::string Node() { return absl::StrCat("n", Pick(6)); }

  v1::JobConfig Config() {
    v1::JobConfig c;
    c.set_min_nodes(2);
    c.set_max_nodes(4);
    c.set_max_restarts(3);
    c.set_last_call_timeout_ms(500);
    c.set_join_timeout_ms(5000);
    c.set_heartbeat_interval_ms(200);
    c.set_heartbeat_timeout_ms(1000);
    if (Pick(20) == 0) c.set_max_restarts(Pick(5));   // sometimes mismatched
    if (Pick(30) == 0) c.set_min_nodes(Pick(7) - 1);  // sometimes invalid
    return c;
  }

  void Join() {
    v1::JoinRequest r;
    r.set_run_id(Run());
    r.set_node_id(Pick(30) == 0 ? "" : Node());
    r.set_local_world_size(Pick(10) == 0 ? 0 : 1 + Pick(3));
    r.set_node_rank(Pick(4) == 0 ? Pick(6) - 1 : -1);
    r.set_address(absl::StrCat("addr-", r.node_id()));
    r.set_master_port(1 + Pick(60000));
    *r.mutable_config() = Config();
    WaiterId id = next_waiter_++;
    join_waiters_[id] = {r.run_id(), r.node_id()};
    Effects effects;
    jobs_.Join(r, id, &effects);
    Absorb(std::move(effects));
  }

  void Cancel() {
    if (join_waiters_.empty()) return;
    auto it = std::next(join_waiters_.begin(), Pick(join_waiters_.size()));
    auto [id, who] = *it;
    join_waiters_.erase(it);  // the adapter answers a cancelled call itself
    Effects effects;
    jobs_.CancelJoin(who.first, who.second, id, &effects);
    Absorb(std::move(effects));
  }

  void Heartbeat() {
    v1::HeartbeatRequest r;
    r.set_run_id(Run());
    r.set_node_id(Node());
    r.set_round(LastRound(r.run_id()) - Pick(2));
    auto response = jobs_.Heartbeat(r);
    if (response.ok()) CheckRound(r.run_id(), response->round());
  }

  void Fail() {
    v1::ReportFailureRequest r;
    r.set_run_id(Run());
    r.set_node_id(Node());
    r.set_round(LastRound(r.run_id()) - Pick(2));
    if (Pick(2)) r.add_failures()->set_exit_code(Pick(255));
    Effects effects;
    auto response = jobs_.ReportFailure(r, &effects);
    Absorb(std::move(effects));
    if (response.ok()) {
      EXPECT_LE(response->restart_count(), 5);
    }
  }

  void Leave() {
    v1::LeaveRequest r;
    r.set_run_id(Run());
    r.set_node_id(Node());
    r.set_round(LastRound(r.run_id()));
    r.set_reason(Pick(2) ? v1::LeaveRequest::REASON_SUCCEEDED
                         : v1::LeaveRequest::REASON_SHUTDOWN);
    Effects effects;
    absl::Status left = jobs_.Leave(r, &effects);
    // NOT_FOUND for a run the table does not hold (the agent then resumes).
    EXPECT_TRUE(left.ok() || absl::IsNotFound(left)) << left;
    Absorb(std::move(effects));
  }

  void Tick() {
    Effects effects;
    jobs_.Tick(&effects);
    Absorb(std::move(effects));
    std::vector<StoreCompletion> done;
    store_.Tick(&done);
    AbsorbStore(std::move(done));
  }

  int64_t LastRound(const std::string& run_id) {
    auto it = last_round_.find(run_id);
    return it == last_round_.end() ? 0 : it->second;
  }

  void CheckRound(const std::string& run_id, int64_t round) {
    int64_t& last = last_round_[run_id];
    // A released job starts again at round 0.
    if (jobs_.CurrentRound(run_id).has_value() && round < last) {
      bool restarted = released_.count(run_id) > 0;
      EXPECT_TRUE(restarted)
          << run_id << " went from round " << last << " to " << round;
    }
    last = round;
  }

  void Absorb(Effects effects) {
    std::map<std::pair<std::string, int64_t>, std::vector<v1::Assignment>>
        closed;
    for (auto& c : effects.joins) {
      auto it = join_waiters_.find(c.waiter);
      ASSERT_NE(it, join_waiters_.end())
          << "waiter " << c.waiter << " answered twice or never parked";
      std::string run_id = it->second.first;
      join_waiters_.erase(it);
      if (c.response.ok() && c.response->has_assignment()) {
        closed[{run_id, c.response->assignment().round()}].push_back(
            c.response->assignment());
      }
    }
    for (auto& [key, assignments] : closed) {
      ++rounds_closed_;
      CheckRound(key.first, key.second);
      const v1::Assignment& first = assignments.front();
      ASSERT_EQ(static_cast<int>(assignments.size()), first.num_nodes());
      std::set<int> ranks;
      std::map<int, int> offset_of;
      for (const auto& a : assignments) {
        EXPECT_TRUE(ranks.insert(a.node_rank()).second) << "duplicate rank";
        EXPECT_EQ(a.world_size(), first.world_size());
        EXPECT_EQ(a.master_addr(), first.master_addr());
        EXPECT_EQ(a.master_port(), first.master_port());
        offset_of[a.node_rank()] = a.rank_offset();
      }
      EXPECT_EQ(*ranks.begin(), 0);
      EXPECT_EQ(*ranks.rbegin(), first.num_nodes() - 1);
      ASSERT_EQ(first.peers_size(), first.num_nodes());
      int offset = 0;
      for (const auto& peer : first.peers()) {
        EXPECT_EQ(peer.rank_offset(), offset);
        EXPECT_EQ(offset_of[peer.node_rank()], offset);
        offset += peer.local_world_size();
      }
      EXPECT_EQ(offset, first.world_size());
    }
    for (const auto& r : effects.released) {
      if (r.before_round == std::numeric_limits<int64_t>::max()) {
        released_.insert(r.run_id);
      }
      std::vector<StoreCompletion> done;
      store_.ReleaseRoundsBefore(r.run_id, r.before_round, &done);
      AbsorbStore(std::move(done));
    }
  }

  v1::StoreScope Scope() {
    v1::StoreScope scope;
    scope.set_run_id(Run());
    scope.set_round(LastRound(scope.run_id()) + Pick(2));
    return scope;
  }
  std::string Key() { return absl::StrCat("k", Pick(5)); }

  void StoreWrite() {
    v1::StoreScope scope = Scope();
    std::string key = Key();
    std::vector<StoreCompletion> done;
    switch (Pick(3)) {
      case 0:
        EXPECT_TRUE(
            store_.Set(scope, key, absl::StrCat(Pick(100)), &done).ok());
        break;
      // Every value the fuzz writes is a number and every scope it picks
      // is live, so these succeed too (the results are [[nodiscard]]).
      case 1: {
        absl::StatusOr<int64_t> sum = store_.Add(scope, key, Pick(5), &done);
        EXPECT_TRUE(sum.ok()) << sum.status();
        break;
      }
      case 2: {
        absl::StatusOr<std::string> now =
            store_.CompareSet(scope, key, Pick(2) ? "" : "1", "2", &done);
        EXPECT_TRUE(now.ok()) << now.status();
      }
    }
    AbsorbStore(std::move(done), &scope);
  }

  void StoreGet() {
    v1::StoreScope scope = Scope();
    WaiterId id = next_waiter_++;
    std::string key = Key();
    store_waiters_[id] = {scope, key};
    std::vector<StoreCompletion> done;
    store_.Get(scope, key, absl::Milliseconds(Pick(2000)), id, &done);
    AbsorbStore(std::move(done), &scope);
  }

  void StoreWait() {
    v1::StoreScope scope = Scope();
    WaiterId id = next_waiter_++;
    store_waiters_[id] = {scope, ""};
    std::vector<StoreCompletion> done;
    store_.Wait(scope, {Key(), Key()}, absl::Milliseconds(Pick(2000)), id,
                &done);
    AbsorbStore(std::move(done), &scope);
  }

  void StoreCancel() {
    if (store_waiters_.empty()) return;
    auto it = std::next(store_waiters_.begin(), Pick(store_waiters_.size()));
    store_.Cancel(it->first);
    store_waiters_.erase(it);
  }

  void AbsorbStore(std::vector<StoreCompletion> done,
                   const v1::StoreScope* scope = nullptr) {
    for (auto& c : done) {
      auto it = store_waiters_.find(c.waiter);
      ASSERT_NE(it, store_waiters_.end())
          << "store waiter " << c.waiter << " answered twice or never parked";
      const std::string& key = it->second.second;
      if (c.value.ok() && !key.empty() && scope != nullptr &&
          scope->run_id() == it->second.first.run_id() &&
          scope->round() == it->second.first.round()) {
        // A Get answered by a write in its scope sees the value now held.
        std::vector<StoreCompletion> ignored;
        std::string now_held =
            *store_.CompareSet(*scope, key, "\x01no-such-value", "", &ignored);
        EXPECT_EQ(*c.value, now_held);
      }
      store_waiters_.erase(it);
    }
  }

  std::mt19937 rng_;
  common::FakeClock clock_;
  JobTable jobs_;
  StoreState store_;
  WaiterId next_waiter_ = 1;
  std::map<WaiterId, std::pair<std::string, std::string>> join_waiters_;
  std::map<WaiterId, std::pair<v1::StoreScope, std::string>> store_waiters_;
  std::map<std::string, int64_t> last_round_;
  std::set<std::string> released_;
  int rounds_closed_ = 0;
};

TEST(FuzzTest, RandomRequestsKeepTheInvariants) {
  spdlog::set_level(spdlog::level::warn);  // thousands of rounds
  // Bounded: a fixed number of seeds and steps, and a wall-clock cap so a
  // slow machine shortens the run instead of timing out.
  absl::Time stop = absl::Now() + absl::Seconds(10);
  int total_rounds = 0;
  int seeds = 0;
  for (uint32_t seed = 1; seed <= 200 && absl::Now() < stop; ++seed) {
    SCOPED_TRACE(absl::StrCat("seed ", seed));
    Driver driver(seed);
    for (int step = 0; step < 2000; ++step) {
      driver.Step();
      if (::testing::Test::HasFatalFailure()) return;
    }
    driver.Finish();
    total_rounds += driver.rounds_closed();
    ++seeds;
    if (::testing::Test::HasFailure()) return;
  }
  EXPECT_GT(total_rounds, seeds) << "the driver must reach closed rounds";
  std::printf("fuzz: %d seeds, %d rounds closed\n", seeds, total_rounds);
}

}  // namespace
}  // namespace ddprun::rendezvous
