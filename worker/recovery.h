#pragma once

#include <ATen/core/Tensor.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "worker/process_group.h"
#include "worker/worker_env.h"

namespace ddprun::worker {

struct MembershipOptions {
  // How long NextRound waits for the agent's next round before giving up
  // (then the program fails as it would without in-place recovery).
  std::chrono::milliseconds round_timeout = std::chrono::minutes(2);
};

// In-place recovery for a libddp program under ddprun: when a rank fails,
// the surviving workers are not restarted. The program creates one
// Membership after reading its environment; Start tells the agent (on the
// progress channel) that this program recovers in place, so that the agent
// keeps it running when a peer fails and sends it the next round's
// environment on DDPRUN_CONTROL_FD instead. The training loop then, at each
// step:
//
//   if (membership->changed()) -> recover
//   try { step } catch (collective error) -> recover
//
// and recovers by dropping its process group (and everything holding it),
// calling NextRound for the new round's environment, forming a new group
// from it, and calling SyncFromSurvivor so that new members receive the
// state (model, optimizer, step, sampler position) from a survivor over the
// new group; a new member runs the same SyncFromSurvivor right after
// forming its first group, and starts fresh (or from a checkpoint) only
// when no rank holds state. mnist/mnist_trainer.cc is the example.
//
// When the agent writes a round, the watcher also requests a collective
// abort (worker/collective_abort.h), so that a wait in the shared-memory
// allreduce for a stopped or dead peer ends at once; Gloo across nodes
// fails when the peer drops its group.
//
// Without DDPRUN_CONTROL_FD (torchrun, older ddprun) enabled() is false,
// changed() never becomes true and the program keeps torchrun's
// restart-everything behaviour.
//
// Threading: one watcher thread reads the control descriptor; every method
// is for the training thread, except changed(), which any thread may call.
class Membership {
 public:
  static absl::StatusOr<std::unique_ptr<Membership>> Start(
      const WorkerEnv& env, const MembershipOptions& options = {});
  // Stops the watcher.
  ~Membership();
  Membership(const Membership&) = delete;
  Membership& operator=(const Membership&) = delete;

  bool enabled() const { return control_fd_ >= 0; }
  // The agent announced a new round: the current group is over.
  bool changed() const { return pending_.load(); }

  // Waits (up to round_timeout) for the next round and returns its
  // environment. `cause` is what ended the step (OK when changed() was seen
  // between steps); it is returned, annotated, when no round comes or the
  // agent closed the channel. Clears the collective abort.
  absl::StatusOr<WorkerEnv> NextRound(const absl::Status& cause);

  // The whole recovery: NextRound, then `join` with the new round's
  // environment (form the group, SyncFromSurvivor). A round can end while
  // it forms (one of its members is lost before the group exists: a store
  // call of a released round, a peer gone); the agent then sends the next
  // one, so a `join` that fails with UNAVAILABLE, FAILED_PRECONDITION,
  // ABORTED, DEADLINE_EXCEEDED or CANCELLED, or throws, is followed by
  // another NextRound (each waits up to round_timeout). `join` must drop
  // what it formed before it fails. Other errors are returned at once.
  // Returns the environment of the round joined.
  absl::StatusOr<WorkerEnv> JoinNextRound(
      absl::Status cause,
      const std::function<absl::Status(const WorkerEnv&)>& join);

  // A new member's first round: `join` with `first` (the environment the
  // process started with), and, when that round ends while it forms (the
  // same errors as above), the next ones as JoinNextRound does. A
  // replacement is often the one whose round another fault ends: it then
  // waits for the next round as its survivors do, instead of failing and
  // costing the job one more round. Not enabled(): `join` once.
  absl::StatusOr<WorkerEnv> JoinFirstRound(
      const WorkerEnv& first,
      const std::function<absl::Status(const WorkerEnv&)>& join);

 private:
  Membership(int control_fd, MembershipOptions options);
  void Watch();

  const int control_fd_;
  const MembershipOptions options_;
  int wake_[2] = {-1, -1};  // the destructor wakes the watcher through it
  std::thread watcher_;
  std::atomic<bool> pending_{false};
  absl::Mutex mu_;
  std::deque<std::string> rounds_ ABSL_GUARDED_BY(mu_);  // JSON envs
  bool closed_ ABSL_GUARDED_BY(mu_) = false;             // agent went away
  std::string channel_error_ ABSL_GUARDED_BY(mu_);
};

struct StateSyncOptions {
  // Test seam (fault hooks): called on every rank once the source is chosen
  // and its record sent, before the tensors, with the source rank. A
  // worker that dies there is a second fault in the middle of a recovery.
  std::function<void(int source)> before_tensors;
};

// Collective over `group` (every rank calls it with tensors of the same
// shapes and dtypes, and records of any length): the ranks agree on the one
// holding the newest state (has_state, then the highest `version`, e.g. the
// step; ties: the lowest rank), and that rank's `record` (small integers:
// step, epoch, position, ...) and `tensors` (model parameters, optimizer
// state) are copied to every rank, in place. Returns the source rank, or -1
// when no rank has state (then nothing is copied: start fresh or from a
// checkpoint). In a world of one: the own rank, or -1.
//
// All or nothing: `record` and `tensors` change only once every broadcast
// completed, so a rank whose sync fails (a peer died in it: an exception
// from the group) keeps its own state whole and may offer it in the next
// round's sync.
absl::StatusOr<int> SyncFromSurvivor(const ProcessGroup& group, bool has_state,
                                     int64_t version,
                                     std::vector<int64_t>& record,
                                     const std::vector<at::Tensor>& tensors,
                                     const StateSyncOptions& options = {});

}  // namespace ddprun::worker
