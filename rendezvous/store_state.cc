#include "rendezvous/store_state.h"

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

}  // namespace

StoreState::StoreState(const common::Clock* clock, int64_t max_keys,
                       int64_t max_scopes)
    : clock_(clock), max_keys_(max_keys), max_scopes_(max_scopes) {}

absl::Status StoreState::Room(const Scope& s, const v1::StoreScope& scope,
                              const std::string& key) const {
  if (static_cast<int64_t>(s.values.size()) < max_keys_ ||
      s.values.contains(key)) {
    return absl::OkStatus();
  }
  return absl::ResourceExhaustedError(absl::StrFormat(
      "store scope (%s, round %d) already holds %d keys, the limit "
      "max_keys_per_scope; delete keys that are no longer needed",
      scope.run_id(), scope.round(), s.values.size()));
}

absl::StatusOr<StoreState::Scope*> StoreState::ScopeFor(
    const v1::StoreScope& scope) {
  auto& rounds = scopes_[scope.run_id()];
  auto it = rounds.find(scope.round());
  if (it != rounds.end()) return &it->second;
  if (num_scopes_ >= max_scopes_) {
    if (rounds.empty()) scopes_.erase(scope.run_id());
    return absl::ResourceExhaustedError(absl::StrFormat(
        "the store already holds %d scopes, the limit max_scopes; scope "
        "(%s, round %d) cannot be opened until jobs end",
        num_scopes_, scope.run_id(), scope.round()));
  }
  ++num_scopes_;
  return &rounds[scope.round()];
}

const StoreState::Scope* StoreState::FindScope(
    const v1::StoreScope& scope) const {
  auto run = scopes_.find(scope.run_id());
  if (run == scopes_.end()) return nullptr;
  auto round = run->second.find(scope.round());
  if (round == run->second.end()) return nullptr;
  return &round->second;
}

void StoreState::Put(Scope& s, const std::string& key, std::string value,
                     std::vector<StoreCompletion>* done) {
  s.values[key] = std::move(value);
  auto it = s.waiting.find(key);
  if (it == s.waiting.end()) return;
  std::vector<WaiterId> ids = std::move(it->second);
  s.waiting.erase(it);
  for (WaiterId id : ids) {
    auto w = waiters_.find(id);
    if (w == waiters_.end()) continue;
    if (--w->second.missing > 0) continue;
    done->push_back(
        {id, w->second.is_get ? s.values[w->second.get_key] : std::string()});
    deadlines_.erase({w->second.deadline, id});
    waiters_.erase(w);
  }
}

void StoreState::Park(const v1::StoreScope& scope, Scope& s,
                      const std::vector<std::string>& missing, bool is_get,
                      absl::Duration timeout, WaiterId waiter) {
  Waiter& w = waiters_[waiter];
  w.run_id = scope.run_id();
  w.round = scope.round();
  w.is_get = is_get;
  if (is_get) w.get_key = missing.front();
  w.missing = static_cast<int>(missing.size());
  w.deadline = timeout == absl::InfiniteDuration() ? absl::InfiniteFuture()
                                                   : clock_->Now() + timeout;
  deadlines_.insert({w.deadline, waiter});
  for (const std::string& key : missing) s.waiting[key].push_back(waiter);
}

void StoreState::Forget(WaiterId waiter) {
  auto it = waiters_.find(waiter);
  if (it == waiters_.end()) return;
  deadlines_.erase({it->second.deadline, waiter});
  waiters_.erase(it);
}

absl::Status StoreState::Set(const v1::StoreScope& scope,
                             const std::string& key, std::string value,
                             std::vector<StoreCompletion>* done) {
  absl::MutexLock lock(&mu_);
  absl::StatusOr<Scope*> found = ScopeFor(scope);
  if (!found.ok()) return found.status();
  Scope& s = **found;
  if (absl::Status room = Room(s, scope, key); !room.ok()) return room;
  Put(s, key, std::move(value), done);
  return absl::OkStatus();
}

void StoreState::Get(const v1::StoreScope& scope, const std::string& key,
                     absl::Duration timeout, WaiterId waiter,
                     std::vector<StoreCompletion>* done) {
  absl::MutexLock lock(&mu_);
  absl::StatusOr<Scope*> found = ScopeFor(scope);
  if (!found.ok()) {
    done->push_back({waiter, found.status()});
    return;
  }
  Scope& s = **found;
  auto it = s.values.find(key);
  if (it != s.values.end()) {
    done->push_back({waiter, it->second});
    return;
  }
  Park(scope, s, {key}, /*is_get=*/true, timeout, waiter);
}

absl::StatusOr<int64_t> StoreState::Add(const v1::StoreScope& scope,
                                        const std::string& key, int64_t delta,
                                        std::vector<StoreCompletion>* done) {
  absl::MutexLock lock(&mu_);
  absl::StatusOr<Scope*> found = ScopeFor(scope);
  if (!found.ok()) return found.status();
  Scope& s = **found;
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
  Put(s, key, absl::StrCat(sum), done);
  return sum;
}

absl::StatusOr<std::string> StoreState::CompareSet(
    const v1::StoreScope& scope, const std::string& key,
    const std::string& expected, std::string desired,
    std::vector<StoreCompletion>* done) {
  absl::MutexLock lock(&mu_);
  absl::StatusOr<Scope*> found = ScopeFor(scope);
  if (!found.ok()) return found.status();
  Scope& s = **found;
  auto it = s.values.find(key);
  if (it == s.values.end()) {
    if (!expected.empty()) return expected;
    if (absl::Status room = Room(s, scope, key); !room.ok()) return room;
  } else if (it->second != expected) {
    return it->second;
  }
  std::string result = desired;
  Put(s, key, std::move(desired), done);
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
  absl::StatusOr<Scope*> found = ScopeFor(scope);
  if (!found.ok()) {
    done->push_back({waiter, found.status()});
    return;
  }
  Scope& s = **found;
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
  Park(scope, s, missing, /*is_get=*/false, timeout, waiter);
}

bool StoreState::DeleteKey(const v1::StoreScope& scope,
                           const std::string& key) {
  absl::MutexLock lock(&mu_);
  auto run = scopes_.find(scope.run_id());
  if (run == scopes_.end()) return false;
  auto round = run->second.find(scope.round());
  if (round == run->second.end()) return false;
  return round->second.values.erase(key) > 0;
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

void StoreState::Tick(std::vector<StoreCompletion>* done) {
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
    waiters_.erase(w);
  }
}

void StoreState::ReleaseRoundsBefore(const std::string& run_id,
                                     int64_t before_round,
                                     std::vector<StoreCompletion>* done) {
  absl::MutexLock lock(&mu_);
  auto run = scopes_.find(run_id);
  if (run == scopes_.end()) return;
  auto& rounds = run->second;
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
    it = rounds.erase(it);
    --num_scopes_;
  }
  if (rounds.empty()) scopes_.erase(run);
}

void StoreState::CancelAll(const absl::Status& status,
                           std::vector<StoreCompletion>* done) {
  absl::MutexLock lock(&mu_);
  for (const auto& [id, waiter] : waiters_) done->push_back({id, status});
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

}  // namespace ddprun::rendezvous
