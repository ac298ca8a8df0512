#include "worker/collective_abort.h"

#include <atomic>

namespace ddprun::worker {
namespace {

std::atomic<bool> g_abort{false};

}  // namespace

void RequestCollectiveAbort() { g_abort.store(true); }
void ClearCollectiveAbort() { g_abort.store(false); }
bool CollectiveAbortRequested() {
  return g_abort.load(std::memory_order_relaxed);
}

}  // namespace ddprun::worker
