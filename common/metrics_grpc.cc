#include "common/metrics_grpc.h"

#include <string>
#include <tuple>
#include <utility>

#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace ddprun::common {
namespace {

using grpc::experimental::InterceptionHookPoints;

// The families every interceptor updates; registered once per factory.
struct GrpcServerFamilies {
  explicit GrpcServerFamilies(MetricsRegistry* registry)
      : started(registry->AddCounter("ddprun_grpc_server_started_total",
                                     "gRPC calls the server received",
                                     {"service", "method"})),
        handled(registry->AddCounter(
            "ddprun_grpc_server_handled_total",
            "gRPC calls the server finished, by status code",
            {"service", "method", "code"})),
        seconds(registry->AddHistogram(
            "ddprun_grpc_server_handling_seconds",
            "Time from a call's arrival to its status (parked calls "
            "included)",
            {"service", "method"},
            // 100 us .. ~26 s: loopback store calls to long parked waits.
            ExponentialBuckets(0.0001, 4, 10))) {}

  CounterFamily& started;
  CounterFamily& handled;
  HistogramFamily& seconds;
};

// "/ddprun.v1.Store/Get" -> {"ddprun.v1.Store", "Get"}.
std::pair<std::string, std::string> SplitMethod(absl::string_view full) {
  if (!full.empty() && full.front() == '/') full.remove_prefix(1);
  size_t slash = full.rfind('/');
  if (slash == absl::string_view::npos) return {"unknown", std::string(full)};
  return {std::string(full.substr(0, slash)),
          std::string(full.substr(slash + 1))};
}

// One per call; gRPC creates it when the call arrives and deletes it when
// the call is done. Its hooks run on gRPC's threads, one at a time.
class MetricsInterceptor : public grpc::experimental::Interceptor {
 public:
  MetricsInterceptor(const GrpcServerFamilies* families, const char* method)
      : families_(families), start_(absl::Now()) {
    std::tie(service_, method_) = SplitMethod(method != nullptr ? method : "");
    families_->started.WithLabels({service_, method_}).Increment();
  }

  void Intercept(
      grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            InterceptionHookPoints::PRE_SEND_STATUS)) {
      grpc::Status status = methods->GetSendStatus();
      families_->handled
          .WithLabels({service_, method_, GrpcCodeName(status.error_code())})
          .Increment();
      families_->seconds.WithLabels({service_, method_})
          .Observe(absl::ToDoubleSeconds(absl::Now() - start_));
    }
    methods->Proceed();
  }

 private:
  const GrpcServerFamilies* const families_;
  const absl::Time start_;
  std::string service_;
  std::string method_;
};

class MetricsInterceptorFactory
    : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  explicit MetricsInterceptorFactory(MetricsRegistry* registry)
      : families_(registry) {}

  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override {
    return new MetricsInterceptor(&families_, info->method());
  }

 private:
  const GrpcServerFamilies families_;
};

}  // namespace

const char* GrpcCodeName(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::OK:
      return "OK";
    case grpc::StatusCode::CANCELLED:
      return "CANCELLED";
    case grpc::StatusCode::UNKNOWN:
      return "UNKNOWN";
    case grpc::StatusCode::INVALID_ARGUMENT:
      return "INVALID_ARGUMENT";
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return "DEADLINE_EXCEEDED";
    case grpc::StatusCode::NOT_FOUND:
      return "NOT_FOUND";
    case grpc::StatusCode::ALREADY_EXISTS:
      return "ALREADY_EXISTS";
    case grpc::StatusCode::PERMISSION_DENIED:
      return "PERMISSION_DENIED";
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
      return "RESOURCE_EXHAUSTED";
    case grpc::StatusCode::FAILED_PRECONDITION:
      return "FAILED_PRECONDITION";
    case grpc::StatusCode::ABORTED:
      return "ABORTED";
    case grpc::StatusCode::OUT_OF_RANGE:
      return "OUT_OF_RANGE";
    case grpc::StatusCode::UNIMPLEMENTED:
      return "UNIMPLEMENTED";
    case grpc::StatusCode::INTERNAL:
      return "INTERNAL";
    case grpc::StatusCode::UNAVAILABLE:
      return "UNAVAILABLE";
    case grpc::StatusCode::DATA_LOSS:
      return "DATA_LOSS";
    case grpc::StatusCode::UNAUTHENTICATED:
      return "UNAUTHENTICATED";
    default:
      return "UNKNOWN";
  }
}

std::vector<
    std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>>
GrpcServerMetricsInterceptors(MetricsRegistry* registry) {
  std::vector<
      std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>>
      factories;
  factories.push_back(std::make_unique<MetricsInterceptorFactory>(registry));
  return factories;
}

}  // namespace ddprun::common
