#pragma once

#include <cstdint>
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
#include "rendezvous/effects.h"

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
  // A scope holds at most max_keys keys and the store at most max_scopes
  // scopes; writing a new key or opening a new scope beyond that is refused
  // RESOURCE_EXHAUSTED. A job's scopes go when its rounds end; free-standing
  // scopes (run_id naming no job) stay until the server stops.
  StoreState(const common::Clock* clock, int64_t max_keys,
             int64_t max_scopes = 100000);

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
  // Times out parked waiters whose deadline passed.
  void Tick(std::vector<StoreCompletion>* done);
  // Drops the scopes (run_id, r) with r < before_round; their parked waiters
  // fail with FAILED_PRECONDITION.
  void ReleaseRoundsBefore(const std::string& run_id, int64_t before_round,
                           std::vector<StoreCompletion>* done);
  // Answers every parked waiter with `status` (server shutdown).
  void CancelAll(const absl::Status& status,
                 std::vector<StoreCompletion>* done);

  size_t num_scopes() const;
  size_t num_waiters() const;

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
  };

  // The scope, created when missing; RESOURCE_EXHAUSTED when the store
  // already holds max_scopes.
  absl::StatusOr<Scope*> ScopeFor(const v1::StoreScope& scope)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  const Scope* FindScope(const v1::StoreScope& scope) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  void Park(const v1::StoreScope& scope, Scope& s,
            const std::vector<std::string>& missing, bool is_get,
            absl::Duration timeout, WaiterId waiter)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // RESOURCE_EXHAUSTED when `key` is new and the scope is full.
  absl::Status Room(const Scope& s, const v1::StoreScope& scope,
                    const std::string& key) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Stores the value and wakes the waiters of `key`.
  void Put(Scope& s, const std::string& key, std::string value,
           std::vector<StoreCompletion>* done)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Forget(WaiterId waiter) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const common::Clock* const clock_;
  const int64_t max_keys_;
  const int64_t max_scopes_;
  int64_t num_scopes_ ABSL_GUARDED_BY(mu_) = 0;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::map<int64_t, Scope>> scopes_
      ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<WaiterId, Waiter> waiters_ ABSL_GUARDED_BY(mu_);
  std::set<std::pair<absl::Time, WaiterId>> deadlines_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ddprun::rendezvous
