#include "rendezvous/service/parse_error_interceptor.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "google/protobuf/descriptor.h"

namespace ddprun::rendezvous {
namespace {

using grpc::experimental::InterceptionHookPoints;

// One per call of a ddprun.v1 method; its hooks run one at a time.
class ParseErrorInterceptor final : public grpc::experimental::Interceptor {
 public:
  // `method` and `request_type` outlive it (the factory's).
  ParseErrorInterceptor(const std::string& method,
                        const std::string& request_type)
      : method_(method), request_type_(request_type) {}

  void Intercept(
      grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            InterceptionHookPoints::PRE_SEND_STATUS)) {
      const grpc::Status status = methods->GetSendStatus();
      if (status.error_code() == grpc::StatusCode::UNIMPLEMENTED &&
          status.error_message().empty()) {
        methods->ModifySendStatus(UnparsableRequest(method_, request_type_));
      }
    }
    methods->Proceed();
  }

 private:
  const std::string& method_;
  const std::string& request_type_;
};

}  // namespace

grpc::Status UnparsableRequest(absl::string_view method,
                               absl::string_view message) {
  return grpc::Status(
      grpc::StatusCode::INVALID_ARGUMENT,
      absl::StrFormat("the request to %s is not a valid %s message (its "
                      "bytes do not parse); send that message, serialized, "
                      "as proto/ddprun/v1/ defines it",
                      method, message));
}

ParseErrorInterceptorFactory::ParseErrorInterceptorFactory() {
  for (const char* name : {"ddprun.v1.Rendezvous", "ddprun.v1.Store"}) {
    const google::protobuf::ServiceDescriptor* service =
        google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(
            name);
    if (service == nullptr) continue;
    for (int i = 0; i < service->method_count(); ++i) {
      const google::protobuf::MethodDescriptor* method = service->method(i);
      request_types_[absl::StrCat("/", name, "/", method->name())] =
          method->input_type()->full_name();
    }
  }
}

grpc::experimental::Interceptor*
ParseErrorInterceptorFactory::CreateServerInterceptor(
    grpc::experimental::ServerRpcInfo* info) {
  if (info->method() == nullptr) return nullptr;
  auto it = request_types_.find(info->method());
  if (it == request_types_.end()) return nullptr;  // not ddprun's: no hooks
  return new ParseErrorInterceptor(it->first, it->second);
}

}  // namespace ddprun::rendezvous
