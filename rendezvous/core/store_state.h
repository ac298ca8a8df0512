#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "ddprun/v1/store.pb.h"
#include "rendezvous/core/effects.h"
#include "rendezvous/core/limits.h"

namespace ddprun::rendezvous {

// A parked Get or Wait the adapter must now answer: the value for a Get, an
// empty string for a Wait, or why it failed.
struct StoreCompletion {
  WaiterId waiter = 0;
  absl::StatusOr<std::string> value;
};

// The key-value store behind the Store service: c10d::Store semantics, keys
// kept per scope (run_id, round). Values are arbitrary bytes.
//
// Thread-safe: one mutex guards every scope. Get and Wait never block; when
// the keys are missing they park the caller's waiter, and a later Set, Add or
// CompareSet (or Tick, for timeouts) reports it in `done`, which the caller
// applies after the method returned. Scope validity (stale rounds) is the
// caller's check (JobTable::CheckStoreScope); this class only keeps keys.
class StoreState {
 public:
  // `clock` must outlive the store.
  // What the store may hold (limits.h): keys per scope, scopes, and memory:
  // every key and value, scope and parked Get/Wait is charged its bytes plus
  // a fixed overhead to its job (run_id) and to the store; a write, a new
  // scope or a park that would pass max_job_store_bytes,
  // max_job_store_keys or max_store_bytes is refused RESOURCE_EXHAUSTED,
  // naming the cap and its flag, and changes nothing. A job's scopes go when
  // its rounds end; free-standing scopes (run_id naming no job) stay until
  // the server stops.
  StoreState(const common::Clock* clock, const Limits& limits);
  // Limits' defaults but these two.
  StoreState(const common::Clock* clock, int64_t max_keys,
             int64_t max_scopes = 100000);

  // Called (under the store's lock: it must not call back into the store)
  // with the deadline of every waiter parked from now on: the server's
  // Ticker::WakeBy. Call before other threads use the store.
  void SetWakeBy(std::function<void(absl::Time)> wake_by) {
    wake_by_ = std::move(wake_by);
  }

  // The server's resident memory now (Limits::max_memory_bytes): until the
  // next sample, what the store charges meanwhile is added to it.
  void SetResidentBytes(int64_t bytes);

  absl::Status Set(const v1::StoreScope& scope, const std::string& key,
                   std::string value, std::vector<StoreCompletion>* done);
  // Answers at once when the key exists, otherwise parks `waiter` until it
  // is set or `timeout` passes (DEADLINE_EXCEEDED). absl::InfiniteDuration()
  // parks until Cancel.
  void Get(const v1::StoreScope& scope, const std::string& key,
           absl::Duration timeout, WaiterId waiter,
           std::vector<StoreCompletion>* done);
  // ASCII decimal; a missing key counts as 0. INVALID_ARGUMENT when the key
  // holds something else or the sum overflows.
  absl::StatusOr<int64_t> Add(const v1::StoreScope& scope,
                              const std::string& key, int64_t delta,
                              std::vector<StoreCompletion>* done);
  // As c10d::HashStore::compareSet; returns the value the caller sees.
  absl::StatusOr<std::string> CompareSet(const v1::StoreScope& scope,
                                         const std::string& key,
                                         const std::string& expected,
                                         std::string desired,
                                         std::vector<StoreCompletion>* done);
  bool Check(const v1::StoreScope& scope,
             const std::vector<std::string>& keys) const;
  // As Get, for every key; answers with an empty value.
  void Wait(const v1::StoreScope& scope, const std::vector<std::string>& keys,
            absl::Duration timeout, WaiterId waiter,
            std::vector<StoreCompletion>* done);
  bool DeleteKey(const v1::StoreScope& scope, const std::string& key);
  int64_t NumKeys(const v1::StoreScope& scope) const;

  // Forgets a parked waiter (its call went away); no completion.
  void Cancel(WaiterId waiter);
  // Times out parked waiters whose deadline passed. Returns the next
  // waiter's deadline (InfiniteFuture: none).
  absl::Time Tick(std::vector<StoreCompletion>* done);
  // Drops the scopes (run_id, r) with r < before_round; their parked waiters
  // fail with FAILED_PRECONDITION.
  void ReleaseRoundsBefore(const std::string& run_id, int64_t before_round,
                           std::vector<StoreCompletion>* done);
  // Answers every parked waiter with `status` (server shutdown).
  void CancelAll(const absl::Status& status,
                 std::vector<StoreCompletion>* done);

  size_t num_scopes() const;
  size_t num_waiters() const;
  // Bytes charged now, all jobs together / job `run_id`.
  int64_t num_bytes() const;
  int64_t num_job_bytes(const std::string& run_id) const;

  // Fixed charges besides the bytes of keys and values: what a hash-map
  // slot, a scope, a parked waiter cost the server beyond their strings.
  static constexpr int64_t kEntryOverheadBytes = 64;
  static constexpr int64_t kScopeOverheadBytes = 256;
  static constexpr int64_t kWaiterOverheadBytes = 256;

 private:
  struct Scope {
    absl::flat_hash_map<std::string, std::string> values;
    // Waiters by a key they still miss. Entries of waiters that went away
    // are skipped and dropped when the key is set.
    absl::flat_hash_map<std::string, std::vector<WaiterId>> waiting;
  };
  struct Waiter {
    std::string run_id;
    int64_t round = 0;
    bool is_get = false;
    std::string get_key;
    int missing = 0;  // keys not yet set
    absl::Time deadline;
    int64_t charge = 0;  // bytes charged to its job while parked
  };
  // One run_id's scopes (by round) and what they are charged.
  struct Run {
    std::map<int64_t, Scope> rounds;
    int64_t bytes = 0;
    int64_t keys = 0;
  };
  struct Found {
    Run* run = nullptr;
    Scope* scope = nullptr;
  };

  // The scope, created when missing; RESOURCE_EXHAUSTED when the store
  // already holds max_scopes or the new scope's charge does not fit.
  absl::StatusOr<Found> ScopeFor(const v1::StoreScope& scope)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  const Scope* FindScope(const v1::StoreScope& scope) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Charges `bytes` and `keys` to `run_id`'s job and the store, or refuses
  // RESOURCE_EXHAUSTED (nothing charged) when a cap would be passed.
  // Negative amounts (releases) always pass.
  absl::Status Charge(Run& run, const std::string& run_id, int64_t bytes,
                      int64_t keys) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The store bytes of every job but the one holding over half of them and
  // over `tenth` (all of them when none does).
  int64_t BytesOfJobsButTheDominant(int64_t tenth) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  absl::Status Park(const v1::StoreScope& scope, Found found,
                    const std::vector<std::string>& missing, bool is_get,
                    absl::Duration timeout, WaiterId waiter)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // RESOURCE_EXHAUSTED when `key` is new and the scope is full.
  absl::Status Room(const Scope& s, const v1::StoreScope& scope,
                    const std::string& key) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Charges, stores the value and wakes the waiters of `key`; refuses when
  // a cap would be passed.
  absl::Status Put(Found found, const std::string& run_id,
                   const std::string& key, std::string value,
                   std::vector<StoreCompletion>* done)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops a parked waiter and its charge.
  void Forget(WaiterId waiter) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Uncharge(const Waiter& waiter) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const common::Clock* const clock_;
  const Limits limits_;
  std::function<void(absl::Time)> wake_by_;
  int64_t num_scopes_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t num_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  // The server's resident memory as last sampled, and num_bytes_ then
  // (Limits::max_memory_bytes).
  int64_t resident_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t num_bytes_at_sample_ ABSL_GUARDED_BY(mu_) = 0;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, Run> runs_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<WaiterId, Waiter> waiters_ ABSL_GUARDED_BY(mu_);
  std::set<std::pair<absl::Time, WaiterId>> deadlines_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ddprun::rendezvous
