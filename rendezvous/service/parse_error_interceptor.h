#pragma once

#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/string_view.h"
#include "grpcpp/support/server_interceptor.h"

namespace ddprun::rendezvous {

// Answers a call to a ddprun.v1 method whose request bytes are not that
// method's message INVALID_ARGUMENT, naming the method and the message
// expected. gRPC 1.51's callback API answers such a call UNIMPLEMENTED with
// no message (its handler cannot tell a request it failed to parse from a
// handler that made no reactor), which sends a client's author looking for
// a method the server lacks. The interceptor rewrites the status as it is
// sent: UNIMPLEMENTED with an empty message from a method the server
// implements is only ever that parse failure, since every handler here
// answers an error with a message. (The async Join parses its own request:
// async_join.cc.)
class ParseErrorInterceptorFactory final
    : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  ParseErrorInterceptorFactory();
  // Null (no hooks) for a call of any other method.
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override;

 private:
  // "/ddprun.v1.Store/Set" -> "ddprun.v1.SetRequest", for every method of
  // both services.
  absl::flat_hash_map<std::string, std::string> request_types_;
};

// The status for a request to `method` ("/ddprun.v1.Store/Set") that is not
// a valid serialized `message` ("ddprun.v1.SetRequest").
grpc::Status UnparsableRequest(absl::string_view method,
                               absl::string_view message);

}  // namespace ddprun::rendezvous
