#pragma once

#include <functional>

namespace ddprun::worker {

// A process-wide request to abandon the collective in flight: set by the
// in-place recovery watcher (worker/recovery.h) when the agent announces a
// new round, checked by the waits of libddp's own collectives (the
// shared-memory allreduce), which then fail with an Aborted error instead
// of waiting for a peer that is gone or stopped. Thread-safe.
void RequestCollectiveAbort();
void ClearCollectiveAbort();
bool CollectiveAbortRequested();

// For a wait that cannot poll CollectiveAbortRequested(): a blocking gRPC
// call in flight (worker/store_client.cc cancels its context). While this
// lives, a collective abort runs `on_abort` once, on the requesting thread;
// when one is already requested, the constructor runs it. `on_abort` must
// be quick and must not touch this file's functions. The destructor waits
// for an `on_abort` that is running, so that what it touches may go next.
class OnCollectiveAbort {
 public:
  explicit OnCollectiveAbort(std::function<void()> on_abort);
  ~OnCollectiveAbort();
  OnCollectiveAbort(const OnCollectiveAbort&) = delete;
  OnCollectiveAbort& operator=(const OnCollectiveAbort&) = delete;

 private:
  friend void RequestCollectiveAbort();
  void RunOnce();  // with the registry's mutex held

  std::function<void()> on_abort_;
  bool ran_ = false;  // guarded by the registry's mutex
};

}  // namespace ddprun::worker
