// The gRPC metrics interceptor on a real server on a kernel-picked port: every
// call is counted by method and status code and its latency observed, by
// the time the client has its answer.
#include "common/metrics_grpc.h"

#include <memory>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "ddprun/v1/store.grpc.pb.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server_builder.h"
#include "gtest/gtest.h"

namespace ddprun::common {
namespace {

// Set succeeds, Get finds nothing, the rest is the generated UNIMPLEMENTED.
class FakeStore final : public v1::Store::CallbackService {
  grpc::ServerUnaryReactor* Set(grpc::CallbackServerContext* context,
                                const v1::SetRequest*,
                                v1::SetResponse*) override {
    auto* reactor = context->DefaultReactor();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }
  grpc::ServerUnaryReactor* Get(grpc::CallbackServerContext* context,
                                const v1::GetRequest* request,
                                v1::GetResponse*) override {
    auto* reactor = context->DefaultReactor();
    reactor->Finish(
        grpc::Status(grpc::StatusCode::NOT_FOUND, "no key " + request->key()));
    return reactor;
  }
};

TEST(MetricsGrpcTest, CountsCallsByMethodAndCodeAndTimesThem) {
  MetricsRegistry registry;
  FakeStore service;
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                           &port);
  builder.RegisterService(&service);
  builder.experimental().SetInterceptorCreators(
      GrpcServerMetricsInterceptors(&registry));
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);
  ASSERT_GT(port, 0);

  auto stub = v1::Store::NewStub(grpc::CreateChannel(
      absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials()));
  for (int i = 0; i < 2; ++i) {
    grpc::ClientContext context;
    v1::SetRequest request;
    v1::SetResponse response;
    ASSERT_TRUE(stub->Set(&context, request, &response).ok());
  }
  {
    grpc::ClientContext context;
    v1::GetRequest request;
    v1::GetResponse response;
    EXPECT_EQ(stub->Get(&context, request, &response).error_code(),
              grpc::StatusCode::NOT_FOUND);
  }
  {
    grpc::ClientContext context;
    v1::AddRequest request;
    v1::AddResponse response;
    EXPECT_EQ(stub->Add(&context, request, &response).error_code(),
              grpc::StatusCode::UNIMPLEMENTED);
  }

  std::string text = registry.Render();
  for (const char* line : {
           "ddprun_grpc_server_started_total{service=\"ddprun.v1.Store\","
           "method=\"Set\"} 2\n",
           "ddprun_grpc_server_handled_total{service=\"ddprun.v1.Store\","
           "method=\"Set\",code=\"OK\"} 2\n",
           "ddprun_grpc_server_handled_total{service=\"ddprun.v1.Store\","
           "method=\"Get\",code=\"NOT_FOUND\"} 1\n",
           "ddprun_grpc_server_handled_total{service=\"ddprun.v1.Store\","
           "method=\"Add\",code=\"UNIMPLEMENTED\"} 1\n",
           "ddprun_grpc_server_handling_seconds_count{service=\"ddprun.v1."
           "Store\",method=\"Set\"} 2\n",
       }) {
    EXPECT_TRUE(absl::StrContains(text, line)) << line << "\nnot in\n" << text;
  }
  server->Shutdown();
}

TEST(MetricsGrpcTest, CodeNames) {
  EXPECT_STREQ(GrpcCodeName(grpc::StatusCode::OK), "OK");
  EXPECT_STREQ(GrpcCodeName(grpc::StatusCode::UNAUTHENTICATED),
               "UNAUTHENTICATED");
  EXPECT_STREQ(GrpcCodeName(grpc::StatusCode::DEADLINE_EXCEEDED),
               "DEADLINE_EXCEEDED");
}

}  // namespace
}  // namespace ddprun::common
