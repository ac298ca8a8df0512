#pragma once

#include <memory>

#include "ddprun/v1/rendezvous.grpc.pb.h"
#include "grpcpp/server_builder.h"
#include "grpcpp/support/status.h"
#include "rendezvous/core/effects.h"
#include "rendezvous/core/job_table.h"
#include "rendezvous/service/async_join.h"
#include "rendezvous/service/heartbeat_stream.h"
#include "rendezvous/service/parked_calls.h"
#include "rendezvous/service/store_service.h"
#include "rendezvous/service/token_check.h"

namespace ddprun::rendezvous {

class JoinBatch;

// The Rendezvous service: a thin gRPC adapter over JobTable. Join is parked
// without a thread until its round closes, it times out, or the client
// cancels (which drops the node); it is served on `join_queues` completion
// queues (async_join.h says why), the other methods on the callback API.
// A batched Join (JoinRequest.more) is one parked call for all its nodes:
// each node is a waiter of the job table's, its answer is kept in its slot
// of the batch, and the call is answered when the last slot is filled.
// Thread-safe.
class RendezvousService final : public RendezvousServiceBase,
                                public JoinHandler {
 public:
  // All must outlive the service; `store` releases the store scopes of
  // rounds that are over; `token` admits calls.
  RendezvousService(JobTable* jobs, StoreService* store,
                    const TokenCheck* token, int join_queues);

  // The Join queues: AddJoinQueues before the server is built, StartJoins
  // after it started, StopJoins after it shut down.
  void AddJoinQueues(grpc::ServerBuilder* builder) { joins_.AddTo(builder); }
  void StartJoins() { joins_.Start(); }
  void StopJoins() { joins_.Stop(); }
  std::vector<int64_t> JoinsPerQueue() const { return joins_.CallsPerQueue(); }
  // Join calls received so far, all queues.
  int64_t join_calls() const { return joins_.calls(); }

  // JoinHandler.
  void OnJoin(JoinCall* call) override;
  void OnJoinCancelled(JoinCall* call) override;
  grpc::ServerUnaryReactor* Heartbeat(grpc::CallbackServerContext* context,
                                      const v1::HeartbeatRequest* request,
                                      v1::HeartbeatResponse* response) override;
  // Heartbeat on a long-lived stream (heartbeat_stream.h).
  grpc::ServerBidiReactor<v1::HeartbeatRequest, v1::HeartbeatResponse>*
  Heartbeats(grpc::CallbackServerContext* context) override {
    return streams_.Open(context);
  }
  const HeartbeatStreams& heartbeat_streams() const { return streams_; }
  HeartbeatStreams* mutable_heartbeat_streams() { return &streams_; }
  grpc::ServerUnaryReactor* ReportFailure(
      grpc::CallbackServerContext* context,
      const v1::ReportFailureRequest* request,
      v1::ReportFailureResponse* response) override;
  grpc::ServerUnaryReactor* Leave(grpc::CallbackServerContext* context,
                                  const v1::LeaveRequest* request,
                                  v1::LeaveResponse* response) override;
  // Answered at once (never parked): re-registration after a restart.
  grpc::ServerUnaryReactor* Resume(grpc::CallbackServerContext* context,
                                   const v1::JoinRequest* request,
                                   v1::ResumeResponse* response) override;
  grpc::ServerUnaryReactor* Status(grpc::CallbackServerContext* context,
                                   const v1::StatusRequest* request,
                                   v1::StatusResponse* response) override;

  // Finishes the Joins and releases the store scopes `effects` names.
  void Apply(Effects effects);
  // The jobs' time-driven transitions (JobTable::Tick); returns when the
  // next is due.
  absl::Time Tick();
  void CancelAll(const grpc::Status& status);
  // Join calls parked now (a batched Join counts once: it holds one call).
  size_t num_parked() const { return parked_.size(); }
  // The most Join calls parked at once since the last call.
  size_t TakePeakParked() { return parked_.TakePeak(); }
  // Nodes of batched Joins whose answer is not decided yet.
  size_t num_batched_waiting() const { return slots_.size(); }

 private:
  // A parked Join call; `batch` is set for a batched one.
  struct ParkedJoin {
    JoinCall* call = nullptr;
    std::shared_ptr<JoinBatch> batch;
  };
  // One node of a batched Join, by its waiter id.
  struct BatchSlot {
    std::shared_ptr<JoinBatch> batch;
    int slot = 0;
  };

  // A Join carrying JoinRequest.more, its token admitted.
  void OnJoinBatch(JoinCall* call);
  // Fills a batch node's slot; answers the call when it was the last.
  void FillSlot(const BatchSlot& slot,
                absl::StatusOr<v1::JoinResponse> response,
                const std::shared_ptr<void>& delivered);

  JobTable* const jobs_;
  StoreService* const store_;
  const TokenCheck* const token_;
  // Parked Join calls by call id (a single Join's id is its node's waiter).
  ParkedSet<ParkedJoin> parked_;
  // The undecided nodes of batched Joins, by waiter id (ids from parked_).
  ParkedSet<BatchSlot> slots_;
  HeartbeatStreams streams_;
  JoinQueues joins_;
};

}  // namespace ddprun::rendezvous
