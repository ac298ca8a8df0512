#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "ddprun/v1/rendezvous.grpc.pb.h"
#include "grpcpp/support/status.h"
#include "relay/forwarding.h"
#include "relay/relay_counters.h"
#include "relay/relay_options.h"

namespace ddprun::relay {

// One caller's single Join, shared by its call and the batcher. Answered or
// cancelled once: whichever comes first wins. Thread-safe.
class JoinWaiter {
 public:
  using Deliver =
      std::function<void(const grpc::Status&, const v1::JoinResponse&)>;

  JoinWaiter(v1::JoinRequest request, ForwardedMetadata metadata,
             std::chrono::system_clock::time_point deadline, Deliver deliver)
      : request_(std::move(request)),
        metadata_(std::move(metadata)),
        deadline_(deadline),
        deliver_(std::move(deliver)) {}

  // Delivers the answer unless the caller was cancelled (or answered)
  // before; returns whether it did.
  bool TryAnswer(const grpc::Status& status, const v1::JoinResponse& response);
  // The caller went away. Returns false when it was answered already (its
  // call is being finished by the answer).
  bool MarkCancelled();
  bool cancelled() const;

  const v1::JoinRequest& request() const { return request_; }
  const ForwardedMetadata& metadata() const { return metadata_; }
  std::chrono::system_clock::time_point deadline() const { return deadline_; }

 private:
  const v1::JoinRequest request_;
  const ForwardedMetadata metadata_;
  const std::chrono::system_clock::time_point deadline_;
  const Deliver deliver_;
  mutable absl::Mutex mu_;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
};

// Groups single Joins by (run_id, forwarded metadata) and sends each group
// as one upstream Join with `more` once it holds max_batch nodes or its
// first node waited batch_window; fans the answer out (SplitJoinAnswer).
//
// Cancellation: a caller cancelled before its group is sent leaves the
// group (Remove) and never joins. One cancelled after it was sent stays in
// the upstream call (the server answers a batch as a whole); when its
// answer is an assignment the batcher sends Leave (REASON_SHUTDOWN) for
// it, which drops the node and ends the round for its peers at once, as
// its own cancelled Join would have, instead of after a heartbeat timeout.
//
// Threading: Add/Remove from gRPC's callback threads; one flusher thread
// sends groups whose window passed; answers arrive on gRPC's threads.
// mu_ guards the groups; no gRPC call is made with it held.
class JoinBatcher {
 public:
  JoinBatcher(const RelayOptions& options, v1::Rendezvous::Stub* stub,
              RelayCounters* counters);
  ~JoinBatcher();
  JoinBatcher(const JoinBatcher&) = delete;
  JoinBatcher& operator=(const JoinBatcher&) = delete;

  void Add(std::shared_ptr<JoinWaiter> waiter);
  // Takes a cancelled waiter out of its group if not sent yet.
  void Remove(const std::shared_ptr<JoinWaiter>& waiter);
  // Answers the waiters not sent UNAVAILABLE, cancels the upstream calls
  // and waits for their callbacks. Idempotent.
  void Shutdown();

  // Callers in groups not sent yet.
  size_t num_pending() const;

 private:
  struct Group {
    std::vector<std::shared_ptr<JoinWaiter>> waiters;
    absl::Time first_added;
  };
  struct SentBatch;
  struct SentLeave;

  void FlushLoop();
  void Send(std::vector<std::shared_ptr<JoinWaiter>> waiters);
  void OnAnswer(SentBatch* batch, const grpc::Status& status);
  void SendLeave(const JoinWaiter& waiter, int64_t round);
  // Whether another upstream call may start (false once shutting down);
  // counts it in flight.
  bool BeginUpstreamCall(const std::shared_ptr<grpc::ClientContext>& context);
  void EndUpstreamCall(const std::shared_ptr<grpc::ClientContext>& context);

  const RelayOptions options_;
  v1::Rendezvous::Stub* const stub_;
  RelayCounters* const counters_;

  mutable absl::Mutex mu_;
  std::map<std::string, Group> groups_ ABSL_GUARDED_BY(mu_);
  // Shared, so that Shutdown may cancel one whose callback is running.
  std::vector<std::shared_ptr<grpc::ClientContext>> in_flight_
      ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  absl::CondVar changed_;
  std::thread flusher_;
};

}  // namespace ddprun::relay
