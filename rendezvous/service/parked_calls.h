#pragma once

#include <algorithm>
#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/support/server_callback.h"
#include "rendezvous/core/effects.h"

namespace ddprun::rendezvous {

// The reactor of a call the server parks (Join, store Get/Wait). gRPC owns
// its lifetime: OnDone, always the last reaction, deletes it.
class ParkedReactor final : public grpc::ServerUnaryReactor {
 public:
  explicit ParkedReactor(std::function<void()> on_cancel)
      : on_cancel_(std::move(on_cancel)) {}
  void OnCancel() override { on_cancel_(); }
  void OnDone() override { delete this; }
  // Finish, keeping `keep` alive until the call is done (its answer sent or
  // the client gone): a shared owner learns so when the last of its calls
  // is done.
  void FinishHolding(const grpc::Status& status, std::shared_ptr<void> keep) {
    keep_ = std::move(keep);
    Finish(status);
  }

 private:
  std::function<void()> on_cancel_;
  std::shared_ptr<void> keep_;
};

// Parked calls by waiter id, and the one way to finish them: Take removes a
// call, so whoever takes it (a completion, a cancellation, shutdown) is the
// only one to finish it. `Handle` is what finishing needs (a reactor and the
// response to fill, or an async call). Thread-safe.
template <typename Handle>
class ParkedSet {
 public:
  using Call = Handle;

  WaiterId NewId() { return next_id_.fetch_add(1); }
  void Add(WaiterId id, Call call) {
    absl::MutexLock lock(&mu_);
    calls_.emplace(id, call);
    peak_ = std::max(peak_, calls_.size());
  }
  // The most calls parked at once since the last TakePeak.
  size_t TakePeak() {
    absl::MutexLock lock(&mu_);
    size_t peak = std::max(peak_, calls_.size());
    peak_ = calls_.size();
    return peak;
  }
  std::optional<Call> Take(WaiterId id) {
    absl::MutexLock lock(&mu_);
    auto it = calls_.find(id);
    if (it == calls_.end()) return std::nullopt;
    Call call = it->second;
    calls_.erase(it);
    return call;
  }
  std::vector<Call> TakeAll() {
    absl::MutexLock lock(&mu_);
    std::vector<Call> all;
    for (auto& [id, call] : calls_) all.push_back(call);
    calls_.clear();
    return all;
  }
  size_t size() const {
    absl::MutexLock lock(&mu_);
    return calls_.size();
  }

 private:
  std::atomic<WaiterId> next_id_{1};
  mutable absl::Mutex mu_;
  absl::flat_hash_map<WaiterId, Call> calls_ ABSL_GUARDED_BY(mu_);
  size_t peak_ ABSL_GUARDED_BY(mu_) = 0;
};

// A parked callback-API call: its reactor and the response to fill.
template <typename Response>
struct ReactorCall {
  ParkedReactor* reactor = nullptr;
  Response* response = nullptr;
};

template <typename Response>
using ParkedCalls = ParkedSet<ReactorCall<Response>>;

}  // namespace ddprun::rendezvous
