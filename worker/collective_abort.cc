#include "worker/collective_abort.h"

#include <atomic>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"

namespace ddprun::worker {
namespace {

std::atomic<bool> g_abort{false};

// The live OnCollectiveAbort registrations.
struct Registry {
  absl::Mutex mu;
  absl::flat_hash_set<OnCollectiveAbort*> live ABSL_GUARDED_BY(mu);
};

Registry& TheRegistry() {
  static Registry* registry = new Registry();  // never destroyed: exit-safe
  return *registry;
}

}  // namespace

void RequestCollectiveAbort() {
  g_abort.store(true);
  Registry& registry = TheRegistry();
  absl::MutexLock lock(&registry.mu);
  for (OnCollectiveAbort* registration : registry.live) {
    registration->RunOnce();
  }
}

void ClearCollectiveAbort() { g_abort.store(false); }

bool CollectiveAbortRequested() {
  return g_abort.load(std::memory_order_relaxed);
}

OnCollectiveAbort::OnCollectiveAbort(std::function<void()> on_abort)
    : on_abort_(std::move(on_abort)) {
  Registry& registry = TheRegistry();
  absl::MutexLock lock(&registry.mu);
  registry.live.insert(this);
  // Under the lock: a request between the insert and this check runs it
  // once, not twice.
  if (g_abort.load()) RunOnce();
}

OnCollectiveAbort::~OnCollectiveAbort() {
  Registry& registry = TheRegistry();
  absl::MutexLock lock(&registry.mu);
  registry.live.erase(this);
}

void OnCollectiveAbort::RunOnce() {
  if (ran_) return;
  ran_ = true;
  on_abort_();
}

}  // namespace ddprun::worker
