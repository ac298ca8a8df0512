#include "rendezvous/core/store_state.h"

#include <algorithm>
#include <limits>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace ddprun::rendezvous {
namespace {

std::string Printable(const std::string& value) {
  constexpr size_t kShown = 32;
  std::string shown = absl::CHexEscape(value.substr(0, kShown));
  if (value.size() > kShown) absl::StrAppend(&shown, "...");
  return shown;
}

Limits WithCounts(int64_t max_keys, int64_t max_scopes) {
  Limits limits;
  limits.max_keys_per_scope = max_keys;
  limits.max_scopes = max_scopes;
  return limits;
}

int64_t EntryCharge(const std::string& key, const std::string& value) {
  return static_cast<int64_t>(key.size() + value.size()) +
         StoreState::kEntryOverheadBytes;
}

}  // namespace

StoreState::StoreState(const common::Clock* clock, const Limits& limits)
    : clock_(clock), limits_(limits) {}

StoreState::StoreState(const common::Clock* clock, int64_t max_keys,
                       int64_t max_scopes)
    : StoreState(clock, WithCounts(max_keys, max_scopes)) {}

absl::Status StoreState::Room(const Scope& s, const v1::StoreScope& scope,
                              const std::string& key) const {
  if (static_cast<int64_t>(s.values.size()) < limits_.max_keys_per_scope ||
      s.values.contains(key)) {
    return absl::OkStatus();
  }
  return absl::ResourceExhaustedError(absl::StrFormat(
      "store scope (%s, round %d) already holds %d keys, the limit "
      "max_keys_per_scope; delete keys that are no longer needed",
      scope.run_id(), scope.round(), s.values.size()));
}

absl::Status StoreState::Charge(Run& run, const std::string& run_id,
                                int64_t bytes, int64_t keys) {
  if (keys > 0 && run.keys + keys > limits_.max_job_store_keys) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "the store of job '%s' already holds %d keys, its cap "
        "(--max-job-store-keys %d); delete keys it no longer needs, or raise "
        "the cap",
        run_id, run.keys, limits_.max_job_store_keys));
  }
  if (bytes > 0 && run.bytes + bytes > limits_.max_job_store_bytes) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "the store of job '%s' holds %d bytes; %d more would pass its cap "
        "(--max-job-store-bytes %d); delete keys it no longer needs, or "
        "raise the cap",
        run_id, run.bytes, bytes, limits_.max_job_store_bytes));
  }
  if (bytes > 0 && limits_.max_memory_bytes > 0) {
    const int64_t resident =
        resident_bytes_ +
        std::max<int64_t>(0, num_bytes_ - num_bytes_at_sample_);
    // A job holding over half the store is refused a tenth of the bound
    // earlier, so that one hog cannot take the room every other job needs
    // to form its rounds.
    // A job holding no more than the tenth is not the hog, whatever its
    // share of a store that holds little.
    const int64_t tenth = limits_.max_memory_bytes / 10;
    const bool dominant = 2 * (run.bytes + bytes) > num_bytes_ + bytes &&
                          run.bytes + bytes > tenth;
    const int64_t bound =
        dominant ? limits_.max_memory_bytes - tenth : limits_.max_memory_bytes;
    // The tenth kept for the other jobs is counted in their store bytes,
    // not in the resident memory: a dominant job's requests in flight
    // (gRPC's buffers, parked writes) are resident memory no store charge
    // sees, and a hog on many connections filled the tenth with them
    // (bench/rendezvous/README.md, "a hog on 32 connections"). So a job
    // that does not hold most of the store may store past the bound while
    // the bytes of all such jobs stay within the tenth: the resident
    // memory stays within the bound plus a tenth.
    const bool in_others_tenth =
        !dominant && resident + bytes > bound &&
        BytesOfJobsButTheDominant(tenth) + bytes <= tenth;
    if (resident + bytes > bound && !in_others_tenth) {
      return absl::ResourceExhaustedError(absl::StrFormat(
          "the server holds %d bytes of memory; %d more for job '%s' would "
          "pass %s (--max-memory-bytes %d); delete keys the job no longer "
          "needs, retry when jobs end, or raise the bound where the server "
          "has the memory",
          resident, bytes, run_id,
          dominant ? "its bound less the tenth kept for other jobs (this "
                     "job holds most of the store)"
                   : "its bound, and the tenth of it kept for jobs that do "
                     "not hold most of the store is full",
          limits_.max_memory_bytes));
    }
  }
  if (bytes > 0 && num_bytes_ + bytes > limits_.max_store_bytes) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "the store holds %d bytes for all jobs; %d more for job '%s' would "
        "pass the server's cap (--max-store-bytes %d); retry when jobs end, "
        "or raise the cap where the server has the memory",
        num_bytes_, bytes, run_id, limits_.max_store_bytes));
  }
  run.bytes += bytes;
  run.keys += keys;
  num_bytes_ += bytes;
  return absl::OkStatus();
}

int64_t StoreState::BytesOfJobsButTheDominant(int64_t tenth) const {
  // A scan of every job, but only for a write that the resident memory
  // would refuse, which is rare: no index of the largest job is kept on
  // every charge for it.
  int64_t largest = 0;
  for (const auto& [run_id, run] : runs_)
    largest = std::max(largest, run.bytes);
  const bool dominant = 2 * largest > num_bytes_ && largest > tenth;
  return dominant ? num_bytes_ - largest : num_bytes_;
}

void StoreState::SetResidentBytes(int64_t bytes) {
  absl::MutexLock lock(&mu_);
  resident_bytes_ = bytes;
  num_bytes_at_sample_ = num_bytes_;
}

absl::StatusOr<StoreState::Found> StoreState::ScopeFor(
    const v1::StoreScope& scope) {
  Run& run = runs_[scope.run_id()];
  auto it = run.rounds.find(scope.round());
  if (it != run.rounds.end()) return Found{&run, &it->second};
  absl::Status room = absl::OkStatus();
  if (num_scopes_ >= limits_.max_scopes) {
    room = absl::ResourceExhaustedError(absl::StrFormat(
        "the store already holds %d scopes, the limit max_scopes; scope "
        "(%s, round %d) cannot be opened until jobs end",
        num_scopes_, scope.run_id(), scope.round()));
  } else {
    room = Charge(run, scope.run_id(), kScopeOverheadBytes, 0);
  }
  if (!room.ok()) {
    if (run.rounds.empty()) runs_.erase(scope.run_id());
    return room;
  }
  ++num_scopes_;
  return Found{&run, &run.rounds[scope.round()]};
}

const StoreState::Scope* StoreState::FindScope(
    const v1::StoreScope& scope) const {
  auto run = runs_.find(scope.run_id());
  if (run == runs_.end()) return nullptr;
  auto round = run->second.rounds.find(scope.round());
  if (round == run->second.rounds.end()) return nullptr;
  return &round->second;
}

absl::Status StoreState::Put(Found found, const std::string& run_id,
                             const std::string& key, std::string value,
                             std::vector<StoreCompletion>* done) {
  Scope& s = *found.scope;
  auto existing = s.values.find(key);
  if (existing == s.values.end()) {
    absl::Status charged =
        Charge(*found.run, run_id, EntryCharge(key, value), 1);
    if (!charged.ok()) return charged;
    s.values.emplace(key, std::move(value));
  } else {
    int64_t growth = static_cast<int64_t>(value.size()) -
                     static_cast<int64_t>(existing->second.size());
    absl::Status charged = Charge(*found.run, run_id, growth, 0);
    if (!charged.ok()) return charged;
    existing->second = std::move(value);
  }
  auto it = s.waiting.find(key);
  if (it == s.waiting.end()) return absl::OkStatus();
  std::vector<WaiterId> ids = std::move(it->second);
  s.waiting.erase(it);
  for (WaiterId id : ids) {
    auto w = waiters_.find(id);
    if (w == waiters_.end()) continue;
    if (--w->second.missing > 0) continue;
    done->push_back(
        {id, w->second.is_get ? s.values[w->second.get_key] : std::string()});
    deadlines_.erase({w->second.deadline, id});
    Uncharge(w->second);
    waiters_.erase(w);
  }
  return absl::OkStatus();
}

absl::Status StoreState::Park(const v1::StoreScope& scope, Found found,
                              const std::vector<std::string>& missing,
                              bool is_get, absl::Duration timeout,
                              WaiterId waiter) {
  int64_t charge = kWaiterOverheadBytes;
  for (const std::string& key : missing) {
    charge += static_cast<int64_t>(key.size()) + 2 * sizeof(WaiterId);
  }
  if (is_get) charge += static_cast<int64_t>(missing.front().size());
  absl::Status charged = Charge(*found.run, scope.run_id(), charge, 0);
  if (!charged.ok()) return charged;
  Waiter& w = waiters_[waiter];
  w.run_id = scope.run_id();
  w.round = scope.round();
  w.is_get = is_get;
  if (is_get) w.get_key = missing.front();
  w.missing = static_cast<int>(missing.size());
  w.deadline = timeout == absl::InfiniteDuration() ? absl::InfiniteFuture()
                                                   : clock_->Now() + timeout;
  w.charge = charge;
  deadlines_.insert({w.deadline, waiter});
  if (wake_by_ && w.deadline != absl::InfiniteFuture()) wake_by_(w.deadline);
  for (const std::string& key : missing) {
    found.scope->waiting[key].push_back(waiter);
  }
  return absl::OkStatus();
}

void StoreState::Uncharge(const Waiter& waiter) {
  auto run = runs_.find(waiter.run_id);
  if (run == runs_.end()) return;
  run->second.bytes -= waiter.charge;
  num_bytes_ -= waiter.charge;
}

void StoreState::Forget(WaiterId waiter) {
  auto it = waiters_.find(waiter);
  if (it == waiters_.end()) return;
  deadlines_.erase({it->second.deadline, waiter});
  Uncharge(it->second);
  waiters_.erase(it);
}

absl::Status StoreState::Set(const v1::StoreScope& scope,
                             const std::string& key, std::string value,
                             std::vector<StoreCompletion>* done) {
  absl::MutexLock lock(&mu_);
  absl::StatusOr<Found> found = ScopeFor(scope);
  if (!found.ok()) return found.status();
  if (absl::Status room = Room(*found->scope, scope, key); !room.ok()) {
    return room;
  }
  return Put(*found, scope.run_id(), key, std::move(value), done);
}

void StoreState::Get(const v1::StoreScope& scope, const std::string& key,
                     absl::Duration timeout, WaiterId waiter,
                     std::vector<StoreCompletion>* done) {
  absl::MutexLock lock(&mu_);
  absl::StatusOr<Found> found = ScopeFor(scope);
  if (!found.ok()) {
    done->push_back({waiter, found.status()});
    return;
  }
  Scope& s = *found->scope;
  auto it = s.values.find(key);
  if (it != s.values.end()) {
    done->push_back({waiter, it->second});
    return;
  }
  absl::Status parked =
      Park(scope, *found, {key}, /*is_get=*/true, timeout, waiter);
  if (!parked.ok()) done->push_back({waiter, parked});
}

absl::StatusOr<int64_t> StoreState::Add(const v1::StoreScope& scope,
                                        const std::string& key, int64_t delta,
                                        std::vector<StoreCompletion>* done) {
  absl::MutexLock lock(&mu_);
  absl::StatusOr<Found> found = ScopeFor(scope);
  if (!found.ok()) return found.status();
  Scope& s = *found->scope;
  int64_t current = 0;
  if (auto it = s.values.find(key); it != s.values.end()) {
    if (!absl::SimpleAtoi(it->second, &current)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "Add on key '%s': it holds '%s', not an ASCII decimal integer; "
          "keep counters in keys that only Add writes",
          Printable(key), Printable(it->second)));
    }
  }
  if ((delta > 0 && current > std::numeric_limits<int64_t>::max() - delta) ||
      (delta < 0 && current < std::numeric_limits<int64_t>::min() - delta)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("Add on key '%s': %d + %d overflows a 64-bit integer",
                        Printable(key), current, delta));
  }
  if (absl::Status room = Room(s, scope, key); !room.ok()) return room;
  int64_t sum = current + delta;
  absl::Status put = Put(*found, scope.run_id(), key, absl::StrCat(sum), done);
  if (!put.ok()) return put;
  return sum;
}

absl::StatusOr<std::string> StoreState::CompareSet(
    const v1::StoreScope& scope, const std::string& key,
    const std::string& expected, std::string desired,
    std::vector<StoreCompletion>* done) {
  absl::MutexLock lock(&mu_);
  absl::StatusOr<Found> found = ScopeFor(scope);
  if (!found.ok()) return found.status();
  Scope& s = *found->scope;
  auto it = s.values.find(key);
  if (it == s.values.end()) {
    if (!expected.empty()) return expected;
    if (absl::Status room = Room(s, scope, key); !room.ok()) return room;
  } else if (it->second != expected) {
    return it->second;
  }
  std::string result = desired;
  absl::Status put = Put(*found, scope.run_id(), key, std::move(desired), done);
  if (!put.ok()) return put;
  return result;
}

bool StoreState::Check(const v1::StoreScope& scope,
                       const std::vector<std::string>& keys) const {
  absl::MutexLock lock(&mu_);
  const Scope* s = FindScope(scope);
  for (const std::string& key : keys) {
    if (s == nullptr || !s->values.contains(key)) return false;
  }
  return true;
}

void StoreState::Wait(const v1::StoreScope& scope,
                      const std::vector<std::string>& keys,
                      absl::Duration timeout, WaiterId waiter,
                      std::vector<StoreCompletion>* done) {
  absl::MutexLock lock(&mu_);
  absl::StatusOr<Found> found = ScopeFor(scope);
  if (!found.ok()) {
    done->push_back({waiter, found.status()});
    return;
  }
  Scope& s = *found->scope;
  std::vector<std::string> missing;
  absl::flat_hash_set<std::string> seen;
  for (const std::string& key : keys) {
    if (!s.values.contains(key) && seen.insert(key).second) {
      missing.push_back(key);
    }
  }
  if (missing.empty()) {
    done->push_back({waiter, std::string()});
    return;
  }
  absl::Status parked =
      Park(scope, *found, missing, /*is_get=*/false, timeout, waiter);
  if (!parked.ok()) done->push_back({waiter, parked});
}

bool StoreState::DeleteKey(const v1::StoreScope& scope,
                           const std::string& key) {
  absl::MutexLock lock(&mu_);
  auto run = runs_.find(scope.run_id());
  if (run == runs_.end()) return false;
  auto round = run->second.rounds.find(scope.round());
  if (round == run->second.rounds.end()) return false;
  auto it = round->second.values.find(key);
  if (it == round->second.values.end()) return false;
  int64_t charge = EntryCharge(it->first, it->second);
  round->second.values.erase(it);
  run->second.bytes -= charge;
  run->second.keys -= 1;
  num_bytes_ -= charge;
  return true;
}

int64_t StoreState::NumKeys(const v1::StoreScope& scope) const {
  absl::MutexLock lock(&mu_);
  const Scope* s = FindScope(scope);
  return s == nullptr ? 0 : static_cast<int64_t>(s->values.size());
}

void StoreState::Cancel(WaiterId waiter) {
  absl::MutexLock lock(&mu_);
  Forget(waiter);
}

absl::Time StoreState::Tick(std::vector<StoreCompletion>* done) {
  absl::Time now = clock_->Now();
  absl::MutexLock lock(&mu_);
  while (!deadlines_.empty() && deadlines_.begin()->first <= now) {
    auto [deadline, id] = *deadlines_.begin();
    deadlines_.erase(deadlines_.begin());
    auto w = waiters_.find(id);
    if (w == waiters_.end()) continue;
    const Waiter& waiter = w->second;
    done->push_back(
        {id, absl::DeadlineExceededError(absl::StrFormat(
                 "store %s in scope (%s, round %d) timed out: %d of its keys "
                 "were never set%s; check that the rank that writes them runs",
                 waiter.is_get ? "Get" : "Wait", waiter.run_id, waiter.round,
                 waiter.missing,
                 waiter.is_get
                     ? absl::StrCat(" (key '", Printable(waiter.get_key), "')")
                     : std::string()))});
    Uncharge(waiter);
    waiters_.erase(w);
  }
  return deadlines_.empty() ? absl::InfiniteFuture()
                            : deadlines_.begin()->first;
}

void StoreState::ReleaseRoundsBefore(const std::string& run_id,
                                     int64_t before_round,
                                     std::vector<StoreCompletion>* done) {
  absl::MutexLock lock(&mu_);
  auto run = runs_.find(run_id);
  if (run == runs_.end()) return;
  auto& rounds = run->second.rounds;
  for (auto it = rounds.begin();
       it != rounds.end() && it->first < before_round;) {
    for (auto& [key, ids] : it->second.waiting) {
      for (WaiterId id : ids) {
        auto w = waiters_.find(id);
        if (w == waiters_.end()) continue;
        done->push_back(
            {id, absl::FailedPreconditionError(absl::StrFormat(
                     "store scope of job '%s': round %d is over while this "
                     "call waited; the worker is stale: its agent must stop "
                     "it and rejoin",
                     run_id, it->first))});
        Forget(id);
      }
    }
    int64_t charge = kScopeOverheadBytes;
    for (const auto& [key, value] : it->second.values) {
      charge += EntryCharge(key, value);
    }
    run->second.bytes -= charge;
    run->second.keys -= static_cast<int64_t>(it->second.values.size());
    num_bytes_ -= charge;
    it = rounds.erase(it);
    --num_scopes_;
  }
  if (rounds.empty()) runs_.erase(run);
}

void StoreState::CancelAll(const absl::Status& status,
                           std::vector<StoreCompletion>* done) {
  absl::MutexLock lock(&mu_);
  for (const auto& [id, waiter] : waiters_) {
    done->push_back({id, status});
    Uncharge(waiter);
  }
  waiters_.clear();
  deadlines_.clear();
}

size_t StoreState::num_scopes() const {
  absl::MutexLock lock(&mu_);
  return static_cast<size_t>(num_scopes_);
}

size_t StoreState::num_waiters() const {
  absl::MutexLock lock(&mu_);
  return waiters_.size();
}

int64_t StoreState::num_bytes() const {
  absl::MutexLock lock(&mu_);
  return num_bytes_;
}

int64_t StoreState::num_job_bytes(const std::string& run_id) const {
  absl::MutexLock lock(&mu_);
  auto run = runs_.find(run_id);
  return run == runs_.end() ? 0 : run->second.bytes;
}

}  // namespace ddprun::rendezvous
