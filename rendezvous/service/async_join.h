#pragma once

#include <atomic>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "ddprun/v1/rendezvous.grpc.pb.h"
#include "grpcpp/server_builder.h"
#include "grpcpp/server_context.h"
#include "grpcpp/support/byte_buffer.h"
#include "rendezvous/core/effects.h"

namespace ddprun::rendezvous {

// The Rendezvous service's gRPC base: Join on the async (completion queue)
// API, every other method on the callback API.
//
// Why Join is not a callback method: a parked call holds one tag on its
// completion queue until it is answered, and Debian's libgrpc (1.51, built
// without NDEBUG) scans every outstanding tag of a queue on each completion
// (cq_check_tag). The callback API has one queue for the whole process, so
// 100,000 parked Joins made each completion cost 100,000 steps: 28 % of the
// server's CPU during a 100,000-node join (perf, bench/rendezvous/README).
// On the async API the Joins spread over several queues, each scanned only
// for its own calls.
// Join is raw (bytes in, bytes out) so that JoinCall parses its request:
// gRPC's own parse of an async request that fails cancels the call
// INTERNAL, "Unable to parse request", naming neither the method nor the
// message.
using RendezvousServiceBase = v1::Rendezvous::WithRawMethod_Join<
    v1::Rendezvous::WithCallbackMethod_Heartbeat<
        v1::Rendezvous::WithCallbackMethod_ReportFailure<
            v1::Rendezvous::WithCallbackMethod_Leave<
                v1::Rendezvous::WithCallbackMethod_Resume<
                    v1::Rendezvous::WithCallbackMethod_Status<
                        v1::Rendezvous::WithCallbackMethod_Heartbeats<
                            v1::Rendezvous::Service>>>>>>>;

class JoinCall;

// What the owner of the Join calls does with them. Both methods run on a
// queue's thread; they may finish calls of any queue.
class JoinHandler {
 public:
  virtual ~JoinHandler() = default;
  // A Join arrived: answer `call` now (JoinCall::Finish) or park it until
  // the round closes.
  virtual void OnJoin(JoinCall* call) = 0;
  // The client cancelled `call` (or its connection died) after OnJoin.
  // Called once at most; the call may have been answered meanwhile.
  virtual void OnJoinCancelled(JoinCall* call) = 0;
};

// One Join call on the async API. Lives until it was answered and gRPC is
// done with it; the handler finishes it exactly once, from any thread.
class JoinCall {
 public:
  const grpc::ServerContext& context() const { return context_; }
  const v1::JoinRequest& request() const { return request_; }
  WaiterId id() const { return id_; }
  void set_id(WaiterId id) { id_ = id; }
  // Sends `status` (and `response` when OK). `keep` stays alive until the
  // answer was sent or the client is gone. Exactly once per call.
  void Finish(const grpc::Status& status, v1::JoinResponse response,
              std::shared_ptr<void> keep);

 private:
  friend class JoinQueues;
  enum class Event { kRequested, kDone, kFinished };
  // A completion queue tag: which call, which of its events.
  struct Tag {
    JoinCall* call;
    Event event;
  };

  JoinCall(RendezvousServiceBase* service, grpc::ServerCompletionQueue* cq,
           JoinHandler* handler);
  // Asks gRPC for the next Join on the queue.
  void Request();
  // Handles one of this call's events; runs on its queue's thread (one per
  // queue, so a call's events never run concurrently).
  void On(Event event, bool ok);
  void Unref();

  grpc::ServerContext context_;
  grpc::ByteBuffer request_bytes_;
  v1::JoinRequest request_;
  grpc::ByteBuffer response_bytes_;
  grpc::ServerAsyncResponseWriter<grpc::ByteBuffer> responder_{&context_};
  // OnJoin was called (the request parsed): the handler hears of its
  // cancellation.
  bool handed_to_handler_ = false;
  RendezvousServiceBase* const service_;
  grpc::ServerCompletionQueue* const cq_;
  JoinHandler* const handler_;
  WaiterId id_ = 0;
  std::shared_ptr<void> keep_;
  // Held by the done event and by the answer (released when it was sent).
  std::atomic<int> refs_{2};
  Tag requested_{this, Event::kRequested};
  Tag done_{this, Event::kDone};
  Tag finished_{this, Event::kFinished};
};

// The completion queues that serve Join, one thread each. Lifecycle:
// AddTo (before the server is built), Start (after), Stop (after the server
// shut down; also the destructor). Thread-safe after Start.
class JoinQueues {
 public:
  // `service` and `handler` must outlive this.
  JoinQueues(RendezvousServiceBase* service, JoinHandler* handler,
             int num_queues);
  ~JoinQueues();
  JoinQueues(const JoinQueues&) = delete;
  JoinQueues& operator=(const JoinQueues&) = delete;

  void AddTo(grpc::ServerBuilder* builder);
  void Start();
  void Stop();
  // Join calls each queue has received so far (how evenly they spread).
  std::vector<int64_t> CallsPerQueue() const;
  // Join calls received so far, all queues.
  int64_t calls() const;

 private:
  // One queue and what serves it.
  struct Queue {
    std::unique_ptr<grpc::ServerCompletionQueue> cq;
    std::thread thread;
    absl::Mutex mu;  // orders new requests against Shutdown
    bool stopped ABSL_GUARDED_BY(mu) = false;
    std::atomic<int64_t> calls{0};
  };
  void Run(Queue* queue);
  // A new call object waiting for the next Join on `queue`, unless stopped.
  void RequestOn(Queue* queue);

  RendezvousServiceBase* const service_;
  JoinHandler* const handler_;
  std::vector<std::unique_ptr<Queue>> queues_;
  bool started_ = false;
  bool stopped_ = false;
};

}  // namespace ddprun::rendezvous
