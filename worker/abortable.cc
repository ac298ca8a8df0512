#include "worker/abortable.h"

#include <atomic>
#include <memory>
#include <stdexcept>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "worker/collective_abort.h"
#include "worker/exception_text.h"

namespace ddprun::worker {
namespace {

std::atomic<int> g_abandoned{0};

// What the caller and the forming thread share; whoever is last frees it.
struct Formation {
  absl::Mutex mu;
  bool done ABSL_GUARDED_BY(mu) = false;
  bool abandoned ABSL_GUARDED_BY(mu) = false;
  absl::StatusOr<c10::intrusive_ptr<Collectives>> result ABSL_GUARDED_BY(mu);
};

// How often the wait looks at the abort flag, which is a plain atomic set
// by the control watcher (a condition on it would need the watcher to know
// this mutex). 10 ms is nothing next to a formation and to a round change.
constexpr absl::Duration kAbortPoll = absl::Milliseconds(10);

}  // namespace

absl::StatusOr<c10::intrusive_ptr<Collectives>> FormAbortably(
    std::function<c10::intrusive_ptr<Collectives>()> form) {
  if (CollectiveAbortRequested()) {
    return absl::AbortedError(
        "the round ended before its process group formed");
  }
  auto formation = std::make_shared<Formation>();
  std::thread([formation, form = std::move(form)] {
    absl::StatusOr<c10::intrusive_ptr<Collectives>> result;
    try {
      result = form();
    } catch (const std::exception& e) {
      result = absl::UnavailableError(ExceptionText(e));
    }
    absl::MutexLock lock(&formation->mu);
    formation->done = true;
    if (formation->abandoned) {
      g_abandoned.fetch_sub(1);
      return;  // `result` (a group nobody waits for) is dropped here
    }
    formation->result = std::move(result);
  }).detach();

  absl::MutexLock lock(&formation->mu);
  while (!formation->mu.AwaitWithTimeout(absl::Condition(&formation->done),
                                         kAbortPoll)) {
    if (CollectiveAbortRequested()) {
      formation->abandoned = true;
      g_abandoned.fetch_add(1);
      return absl::AbortedError(
          "the round ended while its process group formed (a peer stopped "
          "or is gone); that formation is left to end alone");
    }
  }
  return std::move(formation->result);
}

int AbandonedFormations() { return g_abandoned.load(); }

// How often a collective's wait looks at the abort flag: each look that
// finds the work still running costs c10d's timeout error (a c10::Error,
// with its backtrace), so this is coarser than kAbortPoll; it bounds what a
// round change costs only where Gloo never fails the work itself.
constexpr std::chrono::milliseconds kCollectivePoll{200};

bool WaitUnlessAborted(const c10::intrusive_ptr<::c10d::Work>& work) {
  while (true) {
    try {
      // Returns as soon as the work completes; throws at the end of the
      // slice when it has not.
      work->wait(kCollectivePoll);
      return true;
    } catch (...) {
      // The slice ended; the work may have completed since, successfully or
      // not. The caught exception is then c10d's "Operation timed out!" of
      // the slice, not the work's outcome: ask the work itself (a wait on a
      // completed work returns, or throws its own error). Rethrowing here
      // failed a collective that had succeeded (dist-cnn at world 3 on 2
      // cores, seen once in some 300 runs: SIGABRT, then Gloo IoExceptions
      // on its peers).
      if (work->isCompleted()) {
        work->wait();
        return true;
      }
    }
    if (CollectiveAbortRequested()) return false;
  }
}

void WaitOrAbandon(const c10::intrusive_ptr<Collectives>& group,
                   const c10::intrusive_ptr<::c10d::Work>& work) {
  if (WaitUnlessAborted(work)) return;
  std::thread([group, work] {
    try {
      work->wait();
    } catch (const std::exception&) {
      // Expected: the peer is gone or the group timed out.
    }
  }).detach();
  throw std::runtime_error(
      "collective given up: the round ended (a peer stopped, died or moved "
      "on)");
}

}  // namespace ddprun::worker
