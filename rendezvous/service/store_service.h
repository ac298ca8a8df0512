#pragma once

#include <atomic>
#include <functional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "ddprun/v1/store.grpc.pb.h"
#include "grpcpp/support/status.h"
#include "rendezvous/core/job_table.h"
#include "rendezvous/core/limits.h"
#include "rendezvous/core/store_state.h"
#include "rendezvous/core/store_write_rate.h"
#include "rendezvous/service/parked_calls.h"
#include "rendezvous/service/token_check.h"

namespace ddprun::rendezvous {

// The Store service: a thin gRPC adapter over StoreState. Every call first
// checks its scope against the jobs (a stale round is FAILED_PRECONDITION).
// Get and Wait are parked without a thread until StoreState reports them
// done, they time out, or the client cancels. Every call is admitted first:
// token, sizes (Limits), then scope. Thread-safe.
//
// Writes (Set, Add, CompareSet, DeleteKey) pass the job's write rate
// (StoreWriteRate, Limits::max_job_store_write_bytes_per_s) right after the
// token and run_id checks: a write over the rate is parked, without a
// thread, until the rate paid for it (Tick releases it), and only then
// checked (sizes, scope) and applied: a write takes effect when it is
// answered, so a client never sees an answer for a state the store did not
// have yet, and a write cancelled while parked (its deadline, the client
// gone) is not applied. A write that would pass the job's parked-bytes
// share or all jobs' (StoreWriteRate::TotalParkedShare) is refused
// RESOURCE_EXHAUSTED at once.
class StoreService final : public v1::Store::CallbackService {
 public:
  // All four must outlive the service.
  StoreService(const JobTable* jobs, StoreState* store, const TokenCheck* token,
               Limits limits,
               const common::Clock* clock = &common::RealClock::Get());

  grpc::ServerUnaryReactor* Set(grpc::CallbackServerContext* context,
                                const v1::SetRequest* request,
                                v1::SetResponse* response) override;
  grpc::ServerUnaryReactor* Get(grpc::CallbackServerContext* context,
                                const v1::GetRequest* request,
                                v1::GetResponse* response) override;
  grpc::ServerUnaryReactor* Add(grpc::CallbackServerContext* context,
                                const v1::AddRequest* request,
                                v1::AddResponse* response) override;
  grpc::ServerUnaryReactor* CompareSet(
      grpc::CallbackServerContext* context,
      const v1::CompareSetRequest* request,
      v1::CompareSetResponse* response) override;
  grpc::ServerUnaryReactor* Check(grpc::CallbackServerContext* context,
                                  const v1::CheckRequest* request,
                                  v1::CheckResponse* response) override;
  grpc::ServerUnaryReactor* Wait(grpc::CallbackServerContext* context,
                                 const v1::WaitRequest* request,
                                 v1::WaitResponse* response) override;
  grpc::ServerUnaryReactor* DeleteKey(grpc::CallbackServerContext* context,
                                      const v1::DeleteKeyRequest* request,
                                      v1::DeleteKeyResponse* response) override;
  grpc::ServerUnaryReactor* NumKeys(grpc::CallbackServerContext* context,
                                    const v1::NumKeysRequest* request,
                                    v1::NumKeysResponse* response) override;

  // Finishes the parked calls StoreState reported done.
  void Complete(std::vector<StoreCompletion> done);
  void ReleaseRoundsBefore(const std::string& run_id, int64_t before_round);
  // Times out parked Gets and Waits, releases the writes whose turn came.
  // Returns when the next of them is due (InfiniteFuture: none).
  absl::Time Tick();
  // Called with the release time of every write parked from now on (the
  // server's Ticker::WakeBy). Call before the server serves.
  void SetWakeBy(std::function<void(absl::Time)> wake_by) {
    wake_by_ = std::move(wake_by);
  }
  void CancelAll(const grpc::Status& status);
  // Get, Wait and write calls parked now.
  size_t num_parked() const { return parked_.size() + writes_.size(); }
  // Writes parked now by the write rate; writes parked since the start;
  // writes refused because parking them would pass a memory limit.
  size_t num_parked_writes() const { return writes_.size(); }
  int64_t delayed_writes() const { return delayed_writes_.load(); }
  int64_t refused_writes() const { return refused_writes_.load(); }
  // Refusals answered late (StoreWriteRateOptions::max_held_refusals).
  int64_t held_refusals() const { return held_refusals_.load(); }

 private:
  // A parked Get or Wait: the response to fill (nullptr for a Wait).
  using Parked = ParkedCalls<v1::GetResponse>;

  // A write parked by the rate: applied and answered when released.
  struct ParkedWrite {
    ParkedReactor* reactor = nullptr;
    std::function<absl::Status()> apply;
    std::string run_id;
    int64_t bytes = 0;  // parked bytes; 0 for a held refusal
    bool refusal = false;
  };

  // The token and the run_id's size: what a write passes before the rate.
  // Sizes of scope/key/value, then the scope's round: what Admit checks
  // after the token, and what a write checks when it is applied (a parked
  // one on release).
  absl::Status CheckWrite(const v1::StoreScope& scope, const std::string& key,
                          size_t value_bytes = 0) const;
  absl::Status AdmitWriter(const grpc::CallbackServerContext& context,
                           const v1::StoreScope& scope) const;
  // Charges a write (its request's bytes) to its job's rate; `apply`
  // (sizes, scope, the store) runs now, or when the write is released from
  // parking. A refusal held by the rate frees the request's fields first
  // (so `run_id`, which may be one of them, is taken by value).
  grpc::ServerUnaryReactor* Throttle(grpc::CallbackServerContext* context,
                                     std::string run_id,
                                     const google::protobuf::Message* request,
                                     std::function<absl::Status()> apply);
  // Returns the next parked write's release time (InfiniteFuture: none).
  absl::Time ReleaseWrites();
  // What a parked write or held refusal holds of the rate, given back.
  void GiveBack(const ParkedWrite& write);
  // Token, sizes of scope/key/value, then the scope's round.
  absl::Status Admit(const grpc::CallbackServerContext& context,
                     const v1::StoreScope& scope, const std::string& key,
                     size_t value_bytes = 0) const;
  absl::Status AdmitKeys(
      const grpc::CallbackServerContext& context, const v1::StoreScope& scope,
      const google::protobuf::RepeatedPtrField<std::string>& keys) const;
  // Parks an admitted Get or Wait; `start` hands it to StoreState.
  grpc::ServerUnaryReactor* Park(
      grpc::CallbackServerContext* context, v1::GetResponse* response,
      const std::function<void(WaiterId, absl::Duration,
                               std::vector<StoreCompletion>*)>& start,
      const v1::StoreScope& scope, int64_t timeout_ms);

  const JobTable* const jobs_;
  StoreState* const store_;
  const TokenCheck* const token_;
  const Limits limits_;
  const common::Clock* const clock_;
  Parked parked_;
  ParkedSet<ParkedWrite> writes_;
  absl::Mutex rate_mu_;
  StoreWriteRate rate_ ABSL_GUARDED_BY(rate_mu_);
  // Parked writes by release time (entries of cancelled ones are skipped).
  std::set<std::pair<absl::Time, WaiterId>> due_ ABSL_GUARDED_BY(rate_mu_);
  std::function<void(absl::Time)> wake_by_;
  absl::Time last_forget_ ABSL_GUARDED_BY(rate_mu_) = absl::InfinitePast();
  std::atomic<int64_t> delayed_writes_{0};
  std::atomic<int64_t> refused_writes_{0};
  std::atomic<int64_t> held_refusals_{0};
};

}  // namespace ddprun::rendezvous
