#include "rendezvous/service/async_join.h"

#include <algorithm>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "rendezvous/service/parse_error_interceptor.h"

namespace ddprun::rendezvous {

JoinCall::JoinCall(RendezvousServiceBase* service,
                   grpc::ServerCompletionQueue* cq, JoinHandler* handler)
    : service_(service), cq_(cq), handler_(handler) {}

void JoinCall::Request() {
  // Before the call starts, or gRPC never says when it is done: the done
  // event is how a parked Join learns its client went away.
  context_.AsyncNotifyWhenDone(&done_);
  service_->RequestJoin(&context_, &request_bytes_, &responder_, cq_, cq_,
                        &requested_);
}

void JoinCall::Finish(const grpc::Status& status, v1::JoinResponse response,
                      std::shared_ptr<void> keep) {
  keep_ = std::move(keep);
  bool own_buffer = false;
  if (status.ok() && grpc::SerializationTraits<v1::JoinResponse>::Serialize(
                         response, &response_bytes_, &own_buffer)
                         .ok()) {
    responder_.Finish(response_bytes_, status, &finished_);
  } else if (status.ok()) {
    responder_.FinishWithError(
        grpc::Status(grpc::StatusCode::INTERNAL,
                     "the Join response could not be serialized"),
        &finished_);
  } else {
    responder_.FinishWithError(status, &finished_);
  }
}

void JoinCall::On(Event event, bool ok) {
  switch (event) {
    case Event::kRequested:
      // Not ok: the server is shutting down and no call started (nor will
      // its done event come).
      if (!ok) {
        delete this;
        return;
      }
      if (!grpc::SerializationTraits<v1::JoinRequest>::Deserialize(
               &request_bytes_, &request_)
               .ok()) {
        Finish(
            UnparsableRequest(
                absl::StrCat("/", v1::Rendezvous::service_full_name(), "/Join"),
                v1::JoinRequest::descriptor()->full_name()),
            {}, nullptr);
        return;
      }
      handed_to_handler_ = true;
      handler_->OnJoin(this);
      return;
    case Event::kDone:
      // After OnJoin: both run on this call's queue thread.
      if (handed_to_handler_ && context_.IsCancelled()) {
        handler_->OnJoinCancelled(this);
      }
      Unref();
      return;
    case Event::kFinished:
      keep_.reset();
      Unref();
      return;
  }
}

void JoinCall::Unref() {
  if (refs_.fetch_sub(1, std::memory_order_acq_rel) == 1) delete this;
}

JoinQueues::JoinQueues(RendezvousServiceBase* service, JoinHandler* handler,
                       int num_queues)
    : service_(service), handler_(handler) {
  for (int i = 0; i < std::max(1, num_queues); ++i) {
    queues_.push_back(std::make_unique<Queue>());
  }
}

JoinQueues::~JoinQueues() { Stop(); }

void JoinQueues::AddTo(grpc::ServerBuilder* builder) {
  for (auto& queue : queues_) queue->cq = builder->AddCompletionQueue();
}

void JoinQueues::Start() {
  started_ = true;
  for (auto& queue : queues_) {
    Queue* q = queue.get();
    q->thread = std::thread([this, q] { Run(q); });
  }
}

void JoinQueues::RequestOn(Queue* queue) {
  absl::MutexLock lock(&queue->mu);
  if (queue->stopped) return;
  (new JoinCall(service_, queue->cq.get(), handler_))->Request();
}

void JoinQueues::Run(Queue* queue) {
  // A few requests outstanding per queue: a burst of Joins waits in the
  // server's own queue for the next one, never refused.
  constexpr int kRequestsPerQueue = 4;
  for (int i = 0; i < kRequestsPerQueue; ++i) RequestOn(queue);
  void* tag = nullptr;
  bool ok = false;
  while (queue->cq->Next(&tag, &ok)) {
    auto* t = static_cast<JoinCall::Tag*>(tag);
    if (t->event == JoinCall::Event::kRequested && ok) {
      queue->calls.fetch_add(1, std::memory_order_relaxed);
      RequestOn(queue);
    }
    t->call->On(t->event, ok);
  }
}

void JoinQueues::Stop() {
  if (stopped_) return;
  stopped_ = true;
  for (auto& queue : queues_) {
    if (queue->cq == nullptr) continue;
    absl::MutexLock lock(&queue->mu);
    queue->stopped = true;
    queue->cq->Shutdown();
  }
  for (auto& queue : queues_) {
    if (queue->thread.joinable()) {
      queue->thread.join();
    } else if (queue->cq != nullptr && !started_) {
      void* tag = nullptr;
      bool ok = false;
      while (queue->cq->Next(&tag, &ok)) {
      }
    }
  }
}

int64_t JoinQueues::calls() const {
  int64_t calls = 0;
  for (const auto& queue : queues_) {
    calls += queue->calls.load(std::memory_order_relaxed);
  }
  return calls;
}

std::vector<int64_t> JoinQueues::CallsPerQueue() const {
  std::vector<int64_t> calls;
  for (const auto& queue : queues_) calls.push_back(queue->calls.load());
  return calls;
}

}  // namespace ddprun::rendezvous
