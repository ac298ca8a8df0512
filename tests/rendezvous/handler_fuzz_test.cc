// A bounded, deterministic fuzz of the gRPC handlers themselves: random but
// well-formed requests (every field filled with random values through
// protobuf reflection) and random bytes, sent to every Rendezvous and Store
// method of a real server. The server must answer every call (no hang past
// the call's deadline, no crash) and keep serving a well-behaved client.
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "ddprun/v1/rendezvous.grpc.pb.h"
#include "ddprun/v1/store.grpc.pb.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/dynamic_message.h"
#include "google/protobuf/message.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/security/credentials.h"
#include "gtest/gtest.h"
#include "rendezvous/server.h"
#include "spdlog/spdlog.h"

namespace ddprun::rendezvous {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;

class RandomMessages {
 public:
  explicit RandomMessages(uint32_t seed) : rng_(seed) {}

  int Pick(int n) { return std::uniform_int_distribution<int>(0, n - 1)(rng_); }

  std::string Bytes(int max_len) {
    std::string s(Pick(max_len + 1), '\0');
    for (char& c : s) c = static_cast<char>(Pick(256));
    return s;
  }

  // Small ids collide often, so that calls meet the same jobs and keys.
  std::string Text() {
    switch (Pick(4)) {
      case 0:
        return "";
      case 1:
        return absl::StrCat("id", Pick(4));
      case 2:
        return Bytes(16);
      default:
        return std::string(Pick(3000), 'x');
    }
  }

  int64_t Int() {
    switch (Pick(5)) {
      case 0:
        return 0;
      case 1:
        return Pick(5) - 1;
      case 2:
        return Pick(300);
      case 3:
        return -static_cast<int64_t>(Pick(1000000));
      default:
        return (int64_t{1} << 62) + Pick(1000);
    }
  }

  void Fill(Message* message, int depth) {
    const Descriptor* d = message->GetDescriptor();
    const Reflection* r = message->GetReflection();
    for (int i = 0; i < d->field_count(); ++i) {
      const FieldDescriptor* f = d->field(i);
      if (Pick(5) == 0) continue;  // leave some fields unset
      int count = f->is_repeated() ? Pick(4) : 1;
      for (int k = 0; k < count; ++k) SetOne(message, r, f, depth);
    }
  }

 private:
  void SetOne(Message* m, const Reflection* r, const FieldDescriptor* f,
              int depth) {
    bool rep = f->is_repeated();
    switch (f->cpp_type()) {
      case FieldDescriptor::CPPTYPE_STRING:
        rep ? r->AddString(m, f, Text()) : r->SetString(m, f, Text());
        break;
      case FieldDescriptor::CPPTYPE_INT32: {
        int32_t v = static_cast<int32_t>(Int());
        rep ? r->AddInt32(m, f, v) : r->SetInt32(m, f, v);
        break;
      }
      case FieldDescriptor::CPPTYPE_INT64:
        rep ? r->AddInt64(m, f, Int()) : r->SetInt64(m, f, Int());
        break;
      case FieldDescriptor::CPPTYPE_BOOL:
        rep ? r->AddBool(m, f, Pick(2)) : r->SetBool(m, f, Pick(2));
        break;
      case FieldDescriptor::CPPTYPE_ENUM: {
        int v = Pick(6) - 1;  // includes unknown values
        rep ? r->AddEnumValue(m, f, v) : r->SetEnumValue(m, f, v);
        break;
      }
      case FieldDescriptor::CPPTYPE_MESSAGE:
        if (depth < 3) {
          Fill(rep ? r->AddMessage(m, f) : r->MutableMessage(m, f), depth + 1);
        }
        break;
      default:
        break;
    }
  }

  std::mt19937 rng_;
};

TEST(HandlerFuzzTest, RandomRequestsToEveryMethod) {
  spdlog::set_level(spdlog::level::warn);
  ServerOptions options;
  options.limits.max_jobs = 50;
  auto server = Server::Start(options);
  ASSERT_TRUE(server.ok()) << server.status();
  auto channel = grpc::CreateChannel((*server)->endpoint(),
                                     grpc::InsecureChannelCredentials());
  grpc::GenericStub generic(channel);

  std::vector<const google::protobuf::MethodDescriptor*> methods;
  for (const auto* service :
       {v1::Rendezvous::service_full_name(), v1::Store::service_full_name()}) {
    const auto* s =
        google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(
            service);
    ASSERT_NE(s, nullptr);
    for (int i = 0; i < s->method_count(); ++i) methods.push_back(s->method(i));
  }
  ASSERT_EQ(methods.size(), 13u);

  google::protobuf::DynamicMessageFactory factory;
  RandomMessages random(20261202);
  absl::Mutex mu;
  int in_flight = 0;
  int answered = 0;
  int ok = 0;
  constexpr int kCalls = 1500;
  constexpr int kMaxInFlight = 32;
  absl::Time stop = absl::Now() + absl::Seconds(20);
  for (int i = 0; i < kCalls && absl::Now() < stop; ++i) {
    const auto* method = methods[random.Pick(methods.size())];
    std::string payload;
    if (random.Pick(8) == 0) {
      payload = random.Bytes(64);
    } else {
      std::unique_ptr<Message> request(
          factory.GetPrototype(method->input_type())->New());
      random.Fill(request.get(), 0);
      ASSERT_TRUE(request->SerializeToString(&payload));
    }
    struct Call {
      grpc::ClientContext context;
      grpc::ByteBuffer request;
      grpc::ByteBuffer response;
    };
    auto* call = new Call;
    // Joins, Gets and Waits may park: a short deadline bounds them.
    call->context.set_deadline(
        absl::ToChronoTime(absl::Now() + absl::Milliseconds(300)));
    grpc::Slice slice(payload);
    call->request = grpc::ByteBuffer(&slice, 1);
    {
      absl::MutexLock lock(&mu);
      auto room = [&] { return in_flight < kMaxInFlight; };
      mu.Await(absl::Condition(&room));
      ++in_flight;
    }
    std::string path =
        absl::StrCat("/", method->service()->full_name(), "/", method->name());
    generic.UnaryCall(&call->context, path, grpc::StubOptions(), &call->request,
                      &call->response, [&, call](grpc::Status status) {
                        absl::MutexLock lock(&mu);
                        --in_flight;
                        ++answered;
                        ok += status.ok();
                        delete call;
                      });
  }
  {
    absl::MutexLock lock(&mu);
    auto drained = [&] { return in_flight == 0; };
    ASSERT_TRUE(
        mu.AwaitWithTimeout(absl::Condition(&drained), absl::Seconds(20)))
        << in_flight << " calls never answered";
    EXPECT_GT(ok, 0) << "some random requests must be valid";
    EXPECT_LT(ok, answered) << "and some must be refused";
  }

  // A well-behaved client is still served.
  auto store = v1::Store::NewStub(channel);
  v1::SetRequest set;
  set.mutable_scope()->set_run_id("after-fuzz");
  set.set_key("k");
  set.set_value("v");
  v1::SetResponse set_response;
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
  grpc::Status status = store->Set(&context, set, &set_response);
  EXPECT_TRUE(status.ok()) << status.error_message();
  (*server)->Shutdown();
}

}  // namespace
}  // namespace ddprun::rendezvous
