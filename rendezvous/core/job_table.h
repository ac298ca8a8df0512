#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/clock.h"
#include "ddprun/v1/rendezvous.pb.h"
#include "ddprun/v1/store.pb.h"
#include "rendezvous/core/effects.h"
#include "rendezvous/core/job.h"
#include "rendezvous/core/limits.h"

namespace ddprun::rendezvous {

// The most nodes one Join message may carry: its own and JoinRequest.more
// (as kMaxBeatsPerMessage for heartbeats).
inline constexpr int kMaxJoinsPerMessage = 1024;

// Why a Join message must be refused whole (INVALID_ARGUMENT), before any of
// its nodes joins: more than kMaxJoinsPerMessage nodes, an entry of `more`
// naming another run_id (one token check covers the message: a node of
// another job would bypass that job's token), an entry with a `more` of its
// own, or a node_id twice. OK for a Join without `more`.
absl::Status CheckJoinBatch(const v1::JoinRequest& request);

struct JobTableOptions {
  JobOptions job;
  // A job that ended (or lost its last node) is kept this long, so that late
  // agents learn how it ended and Status shows it; then it is released.
  absl::Duration ended_job_grace = absl::Minutes(5);
  // Sizes of ids, jobs per server, nodes per job (the last also goes into
  // job.max_nodes).
  Limits limits;
  // Called (under the table's lock: it must not call back into the table)
  // with a job's next deadline after every call that may have moved it
  // earlier: the server's Ticker::WakeBy. Empty: nobody to tell.
  std::function<void(absl::Time)> wake_by;
};

// Every job of one server, by run_id. The first Join of a run_id creates the
// job with its config; a Join whose config differs is refused.
//
// Thread-safe: every method may be called from any gRPC or timer thread; one
// mutex guards the jobs. Methods never block: completions of parked calls go
// to `effects`, which the caller applies after the method returned.
class JobTable {
 public:
  // `clock` must outlive the table.
  explicit JobTable(const common::Clock* clock, JobTableOptions options = {});

  void Join(const v1::JoinRequest& request, WaiterId waiter, Effects* effects);
  // A batched Join (CheckJoinBatch passed): the request's own node with
  // waiters[0], request.more(i) with waiters[i + 1]. Each node joins exactly
  // as its own Join would, in this order, under one lock; none of them
  // counts against max_parked_joins (Job::Join's `in_batch`).
  void JoinBatch(const v1::JoinRequest& request,
                 absl::Span<const WaiterId> waiters, Effects* effects);
  // Re-registration after a server restart (Job::Resume): creates the job
  // from the request's config when this server does not know it.
  absl::StatusOr<v1::ResumeResponse> Resume(const v1::JoinRequest& request,
                                            Effects* effects);
  void CancelJoin(const std::string& run_id, const std::string& node_id,
                  WaiterId waiter, Effects* effects);
  absl::StatusOr<v1::HeartbeatResponse> Heartbeat(
      const v1::HeartbeatRequest& request);
  // Job::HeartbeatAnswer: what a heartbeat would be answered, changing
  // nothing. NOT_FOUND for an unknown job.
  absl::StatusOr<v1::HeartbeatResponse> HeartbeatAnswer(
      const std::string& run_id, const std::string& node_id,
      int64_t round) const;
  // A node's heartbeat stream ended after its last beat, for `round`
  // (Job::HeartbeatStreamEnded).
  void HeartbeatStreamEnded(const std::string& run_id,
                            const std::string& node_id, int64_t round);
  absl::StatusOr<v1::ReportFailureResponse> ReportFailure(
      const v1::ReportFailureRequest& request, Effects* effects);
  absl::Status Leave(const v1::LeaveRequest& request, Effects* effects);
  absl::StatusOr<v1::StatusResponse> Status(
      const v1::StatusRequest& request) const;

  // OK when the scope may be used: its run_id names no job (a free-standing
  // namespace) or names a job whose current round is scope.round;
  // FAILED_PRECONDITION otherwise.
  absl::Status CheckStoreScope(const v1::StoreScope& scope) const;
  // The current round of job `run_id`; nullopt when there is no such job.
  std::optional<int64_t> CurrentRound(const std::string& run_id) const;

  // The answers of a ClosedRound effect were sent: the round's heartbeat
  // clocks start now.
  void AnswersDelivered(const ClosedRound& closed);
  // A batched Join holding these nodes' assignments was answered (or its
  // sender is gone): their heartbeat clocks start now
  // (Job::HeldAnswersDelivered).
  void HeldAnswersDelivered(const std::string& run_id,
                            absl::Span<const std::string> node_ids);
  // Time-driven transitions of every job, and release of idle jobs.
  // Returns when the next of them is due (InfiniteFuture: none).
  absl::Time Tick(Effects* effects);
  void CancelAllJoins(const absl::Status& status, Effects* effects);

  size_t num_jobs() const;
  // Decisions waiting for their polling node, all jobs (Job's).
  int64_t AnswersForPoll() const;

 private:
  absl::Status NotFound(const std::string& run_id) const;
  // What Join and Resume refuse before looking at the job: an empty run_id,
  // oversized fields, a bad config. Returns the normalized config.
  absl::StatusOr<v1::JobConfig> CheckJoin(const v1::JoinRequest& request) const;
  // The request's job, created with `config` when new. Errors: the job
  // limit, or a config that differs from the job's.
  // One node's Join, its request checked (CheckJoin's `config`).
  void JoinChecked(const v1::JoinRequest& request,
                   const absl::StatusOr<v1::JobConfig>& config, WaiterId waiter,
                   bool in_batch, absl::Time now, Effects* effects)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<Job*> FindOrCreate(const v1::JoinRequest& request,
                                    const v1::JobConfig& config, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // When Tick has something to do for `job`: its own deadlines, or its
  // release once idle.
  absl::Time NextTick(const Job& job) const;
  // Tells options_.wake_by the job's next deadline.
  void Announce(const Job& job) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const common::Clock* const clock_;
  const JobTableOptions options_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::unique_ptr<Job>> jobs_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace ddprun::rendezvous
