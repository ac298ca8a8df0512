// A bounded, deterministic fuzz of the gRPC handlers themselves: random but
// well-formed requests (every field filled with random values through
// protobuf reflection) and random bytes, sent to every Rendezvous and Store
// method of a real server. Every handler must be reached many times; the
// server must answer every call itself (the client's deadline is far away;
// the client gives up only on calls the server may park: Join, Get, Wait,
// and then the server must release them: no parked call leaks), never
// crash, and keep serving a well-behaved client.
#include <memory>
#include <random>
#include <string>
#include <thread>
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
#include "rendezvous/service/server.h"
#include "spdlog/spdlog.h"
#include "tests/testing/wait_for.h"

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
      // A field of the message's own type (JoinRequest.more) only in one
      // message of four: each nested message adds strings, one in four of
      // them random bytes that do not parse, and with a batch in most
      // Joins almost none would reach the handler.
      if (f->message_type() == d && Pick(4) != 0) continue;
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

// A call of the fuzz: what was sent and how it ended.
struct FuzzCall {
  grpc::ClientContext context;
  grpc::ByteBuffer request;
  grpc::ByteBuffer response;
  int method = 0;
  absl::Time sent;
  bool answered = false;
  bool cancelled_by_us = false;
  grpc::Status status;
};

// Whether a status came from one of our handlers: OK, or a code they use
// with a sentence of theirs. gRPC's own refusals (a body that does not
// parse: INTERNAL) and the client's cancellations do not count.
bool FromHandler(const FuzzCall& call) {
  if (call.status.ok()) return true;
  if (call.cancelled_by_us) return false;
  switch (call.status.error_code()) {
    case grpc::StatusCode::INVALID_ARGUMENT:
    case grpc::StatusCode::NOT_FOUND:
    case grpc::StatusCode::FAILED_PRECONDITION:
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
    case grpc::StatusCode::DEADLINE_EXCEEDED:
    case grpc::StatusCode::ABORTED:
    case grpc::StatusCode::CANCELLED:
      return call.status.error_message().size() > 20;
    default:
      return false;
  }
}

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
  ASSERT_EQ(methods.size(), 15u);
  // Only these may be parked by the server (and so need the client to give
  // up on them); every other method must be answered at once.
  auto parkable = [&](int m) {
    const std::string& name = methods[m]->name();
    return name == "Join" || name == "Get" || name == "Wait";
  };

  google::protobuf::DynamicMessageFactory factory;
  RandomMessages random(20261202);
  absl::Mutex mu;
  int in_flight = 0;
  bool sending_done = false;
  std::vector<std::unique_ptr<FuzzCall>> calls;
  // Enough that each method gets about 20 or more answers from its handler
  // whatever the messages' shape (the random stream depends on it).
  constexpr int kCalls = 2000;
  constexpr int kMaxInFlight = 32;
  // A parked call the client gives up on after this (its server-side
  // timeouts are random and may be hours).
  const absl::Duration kGiveUp = absl::Milliseconds(300);

  // Gives up on parked calls: a client cancellation, which the server must
  // turn into the release of the parked call.
  std::thread canceller([&] {
    absl::MutexLock lock(&mu);
    while (!(sending_done && in_flight == 0)) {
      auto finished = [&] { return sending_done && in_flight == 0; };
      mu.AwaitWithTimeout(absl::Condition(&finished), absl::Milliseconds(20));
      std::vector<FuzzCall*> overdue;
      absl::Time now = absl::Now();
      for (auto& call : calls) {
        if (!call->answered && !call->cancelled_by_us &&
            parkable(call->method) && now - call->sent > kGiveUp) {
          call->cancelled_by_us = true;
          overdue.push_back(call.get());
        }
      }
      mu.Unlock();
      for (FuzzCall* call : overdue) call->context.TryCancel();
      mu.Lock();
    }
  });

  for (int i = 0; i < kCalls; ++i) {
    const int m = random.Pick(methods.size());
    const auto* method = methods[m];
    std::string payload;
    if (random.Pick(8) == 0) {
      payload = random.Bytes(64);
    } else {
      std::unique_ptr<Message> request(
          factory.GetPrototype(method->input_type())->New());
      random.Fill(request.get(), 0);
      ASSERT_TRUE(request->SerializeToString(&payload));
    }
    FuzzCall* call = nullptr;
    {
      absl::MutexLock lock(&mu);
      auto room = [&] { return in_flight < kMaxInFlight; };
      ASSERT_TRUE(
          mu.AwaitWithTimeout(absl::Condition(&room), absl::Seconds(30)))
          << "calls stopped being answered";
      ++in_flight;
      calls.push_back(std::make_unique<FuzzCall>());
      call = calls.back().get();
      call->method = m;
      call->sent = absl::Now();
    }
    // Far beyond the test: an answer comes from the server (or from our
    // cancellation of a parked call), never from this deadline.
    call->context.set_deadline(
        absl::ToChronoTime(absl::Now() + absl::Minutes(10)));
    grpc::Slice slice(payload);
    call->request = grpc::ByteBuffer(&slice, 1);
    std::string path =
        absl::StrCat("/", method->service()->full_name(), "/", method->name());
    generic.UnaryCall(&call->context, path, grpc::StubOptions(), &call->request,
                      &call->response, [&, call](grpc::Status status) {
                        absl::MutexLock lock(&mu);
                        call->status = std::move(status);
                        call->answered = true;
                        --in_flight;
                      });
  }
  {
    absl::MutexLock lock(&mu);
    sending_done = true;
    auto drained = [&] { return in_flight == 0; };
    bool all =
        mu.AwaitWithTimeout(absl::Condition(&drained), absl::Seconds(60));
    if (!all) {
      for (auto& call : calls) {
        if (!call->answered) {
          ADD_FAILURE() << methods[call->method]->name()
                        << " never answered (cancelled by the client: "
                        << call->cancelled_by_us << ")";
        }
      }
    }
    ASSERT_TRUE(all) << in_flight << " calls never answered";
  }
  canceller.join();

  // Every handler was reached, many times, and answered with its own words;
  // the client gave up only on calls the server may park.
  std::vector<int> reached(methods.size(), 0);
  int ok = 0;
  int refused = 0;
  int given_up = 0;
  for (const auto& call : calls) {
    if (call->cancelled_by_us && !call->status.ok()) {
      EXPECT_TRUE(parkable(call->method))
          << methods[call->method]->name() << " was not answered within "
          << kGiveUp;
      ++given_up;
      continue;
    }
    ok += call->status.ok();
    refused += !call->status.ok();
    reached[call->method] += FromHandler(*call);
  }
  for (size_t m = 0; m < methods.size(); ++m) {
    EXPECT_GE(reached[m], 20)
        << methods[m]->name() << " was reached " << reached[m] << " times";
  }
  EXPECT_GT(ok, 0) << "some random requests must be valid";
  EXPECT_GT(refused, 0) << "and some must be refused";
  EXPECT_GT(given_up, 0) << "some calls were parked";

  // No parked call leaked: every one the client gave up on was released.
  EXPECT_TRUE(
      testing::WaitFor([&] { return (*server)->NumParkedCallsForTest() == 0; },
                       absl::Seconds(10)))
      << (*server)->NumParkedCallsForTest() << " parked calls leaked";
  EXPECT_EQ((*server)->NumStoreWaitersForTest(), 0u);

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
