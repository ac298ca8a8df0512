#pragma once

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "ddprun/v1/rendezvous.grpc.pb.h"

namespace ddprun::testing {

// A rendezvous server older than the Rendezvous.Heartbeats stream: the
// generated service answers the stream UNIMPLEMENTED, and unary heartbeats
// get the round (`round`, or the request's when -1) with the job running.
// It counts both. The one fake of such a server, for the clients that must
// fall back to unary heartbeats (the agent's heartbeat loop, the relay).
class NoStreamServer : public v1::Rendezvous::CallbackService {
 public:
  explicit NoStreamServer(int64_t round = -1) : round_(round) {}

  grpc::ServerUnaryReactor* Heartbeat(
      grpc::CallbackServerContext* context, const v1::HeartbeatRequest* request,
      v1::HeartbeatResponse* response) override {
    response->set_round(round_ >= 0 ? round_ : request->round());
    response->set_state(v1::JOB_STATE_RUNNING);
    ++unary;
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }
  grpc::ServerBidiReactor<v1::HeartbeatRequest, v1::HeartbeatResponse>*
  Heartbeats(grpc::CallbackServerContext* context) override {
    ++streams;
    return v1::Rendezvous::CallbackService::Heartbeats(context);
  }

  std::atomic<int> unary = 0;    // unary heartbeats answered
  std::atomic<int> streams = 0;  // Heartbeats streams tried

 private:
  const int64_t round_;
};

// `service` on a kernel-chosen loopback port; its address lands in
// *endpoint. Null when the server could not start.
inline std::unique_ptr<grpc::Server> StartFakeServer(grpc::Service* service,
                                                     std::string* endpoint) {
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                           &port);
  builder.RegisterService(service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  *endpoint = absl::StrCat("127.0.0.1:", port);
  return port != 0 ? std::move(server) : nullptr;
}

}  // namespace ddprun::testing
