// GrpcStore through the c10d::Store interface against a real rendezvous
// server on a kernel-chosen port, in this process.
#include "worker/grpc_store.h"

#include <c10/util/Exception.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "rendezvous/service/server.h"
#include "tests/testing/wait_for.h"
#include "worker/collective_abort.h"

namespace ddprun::worker {
namespace {

using std::chrono::milliseconds;

std::vector<uint8_t> Bytes(const std::string& s) {
  return std::vector<uint8_t>(s.begin(), s.end());
}

class GrpcStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    rendezvous::ServerOptions options;
    options.host = "127.0.0.1";
    options.port = 0;
    auto server = rendezvous::Server::Start(options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    ASSERT_GT(server_->port(), 0);
  }

  // A store in a free-standing scope (no rendezvous job has this run id).
  c10::intrusive_ptr<GrpcStore> MakeStore(
      const std::string& run_id, int64_t round = 0,
      milliseconds timeout = milliseconds(10000)) {
    StoreClientOptions options;
    options.endpoint = server_->endpoint();
    options.run_id = run_id;
    options.round = round;
    return c10::make_intrusive<GrpcStore>(options, timeout);
  }

  std::unique_ptr<rendezvous::Server> server_;
};

TEST_F(GrpcStoreTest, SetGetCheckDeleteNumKeys) {
  auto store = MakeStore("set-get");
  EXPECT_FALSE(store->check({"a"}));
  EXPECT_EQ(store->getNumKeys(), 0);
  store->set("a", Bytes("alpha"));
  store->set("b", Bytes("beta"));
  EXPECT_EQ(store->get("a"), Bytes("alpha"));
  EXPECT_TRUE(store->check({"a", "b"}));
  EXPECT_FALSE(store->check({"a", "c"}));
  EXPECT_EQ(store->getNumKeys(), 2);
  EXPECT_TRUE(store->deleteKey("a"));
  EXPECT_FALSE(store->deleteKey("a"));
  EXPECT_FALSE(store->check({"a"}));
  EXPECT_EQ(store->getNumKeys(), 1);
  store->set("b", Bytes("overwritten"));
  EXPECT_EQ(store->get("b"), Bytes("overwritten"));
}

TEST_F(GrpcStoreTest, AddKeepsAsciiDecimalAndCountsMissingAsZero) {
  auto store = MakeStore("add");
  EXPECT_EQ(store->add("n", 5), 5);
  EXPECT_EQ(store->add("n", -2), 3);
  EXPECT_EQ(store->get("n"), Bytes("3"));
  EXPECT_EQ(store->add("m", 0), 0);
}

TEST_F(GrpcStoreTest, CompareSetAsHashStore) {
  auto store = MakeStore("cas");
  // Missing key, expected empty: set.
  EXPECT_EQ(store->compareSet("k", {}, Bytes("one")), Bytes("one"));
  // Missing key, expected non-empty: not set, expected returned.
  EXPECT_EQ(store->compareSet("j", Bytes("x"), Bytes("y")), Bytes("x"));
  EXPECT_FALSE(store->check({"j"}));
  // Matching: swapped.
  EXPECT_EQ(store->compareSet("k", Bytes("one"), Bytes("two")), Bytes("two"));
  // Not matching: current returned, unchanged.
  EXPECT_EQ(store->compareSet("k", Bytes("one"), Bytes("three")), Bytes("two"));
  EXPECT_EQ(store->get("k"), Bytes("two"));
}

TEST_F(GrpcStoreTest, BlockingGetIsReleasedBySetFromAnotherThread) {
  auto store = MakeStore("blocking-get");
  auto writer_store = MakeStore("blocking-get");
  std::atomic<bool> got{false};
  std::vector<uint8_t> value;
  std::thread reader([&] {
    value = store->get("late");
    got = true;
  });
  // The reader is parked on the server; it must not have returned.
  absl::SleepFor(absl::Milliseconds(100));  // not a wait for a condition:
                                            // gives a wrong reader a chance
  EXPECT_FALSE(got.load());
  writer_store->set("late", Bytes("here"));
  reader.join();
  EXPECT_TRUE(got.load());
  EXPECT_EQ(value, Bytes("here"));
}

TEST_F(GrpcStoreTest, WaitIsReleasedWhenAllKeysExist) {
  auto store = MakeStore("wait");
  auto writer = MakeStore("wait");
  std::thread waiter([&] { store->wait({"x", "y"}, milliseconds(10000)); });
  writer->set("x", Bytes("1"));
  writer->set("y", Bytes("2"));
  waiter.join();
  EXPECT_TRUE(store->check({"x", "y"}));
}

TEST_F(GrpcStoreTest, GetTimesOutWithErrorNamingKeyAndEndpoint) {
  auto store = MakeStore("get-timeout", 0, milliseconds(300));
  absl::Time start = absl::Now();
  try {
    store->get("never");
    FAIL() << "get of a missing key returned";
  } catch (const c10::Error& e) {
    std::string what = e.what_without_backtrace();
    EXPECT_NE(what.find("never"), std::string::npos) << what;
    EXPECT_NE(what.find(server_->endpoint()), std::string::npos) << what;
  }
  absl::Duration took = absl::Now() - start;
  EXPECT_GE(took, absl::Milliseconds(250));
  EXPECT_LT(took, absl::Seconds(5));
}

TEST_F(GrpcStoreTest, WaitWithTimeoutTimesOut) {
  auto store = MakeStore("wait-timeout");
  absl::Time start = absl::Now();
  EXPECT_THROW(store->wait({"absent"}, milliseconds(300)), c10::Error);
  absl::Duration took = absl::Now() - start;
  EXPECT_GE(took, absl::Milliseconds(250));
  EXPECT_LT(took, absl::Seconds(5));
}

TEST_F(GrpcStoreTest, BinaryValueWithZeroBytesIsIntact) {
  // The size of an ncclUniqueId, zero bytes included.
  std::vector<uint8_t> id(128);
  for (size_t i = 0; i < id.size(); ++i) id[i] = static_cast<uint8_t>(i * 7);
  id[0] = 0;
  id[64] = 0;
  id[127] = 0;
  auto store = MakeStore("binary");
  store->set("nccl_id", id);
  EXPECT_EQ(MakeStore("binary")->get("nccl_id"), id);
}

TEST_F(GrpcStoreTest, ScopesAreApart) {
  auto round0 = MakeStore("scopes", 0);
  auto round1 = MakeStore("scopes", 1);
  auto other = MakeStore("other-run", 0);
  round0->set("0/rank_0", Bytes("old-address"));
  EXPECT_FALSE(round1->check({"0/rank_0"}));
  EXPECT_FALSE(other->check({"0/rank_0"}));
}

TEST(GrpcStoreTokenTest, TokenIsSentAndAWrongOneIsRefusedClearly) {
  rendezvous::ServerOptions server_options;
  server_options.token = "s3cret";
  auto server = rendezvous::Server::Start(server_options);
  ASSERT_TRUE(server.ok()) << server.status();
  StoreClientOptions options;
  options.endpoint = (*server)->endpoint();
  options.run_id = "token";
  options.credentials.token = "s3cret";
  auto good = c10::make_intrusive<GrpcStore>(options, milliseconds(5000));
  good->set("k", Bytes("v"));
  EXPECT_EQ(good->get("k"), Bytes("v"));
  options.credentials.token = "wrong";
  auto bad = c10::make_intrusive<GrpcStore>(options, milliseconds(5000));
  try {
    bad->get("k");
    FAIL() << "a wrong token was accepted";
  } catch (const c10::Error& e) {
    std::string what = e.what_without_backtrace();
    EXPECT_NE(what.find("UNAUTHENTICATED"), std::string::npos) << what;
    EXPECT_NE(what.find("DDPRUN_TOKEN"), std::string::npos) << what;
  }
}

TEST(GrpcStoreNoServerTest, UnreachableServerFailsBoundedAndSaysSo) {
  StoreClientOptions options;
  options.endpoint = "127.0.0.1:1";  // nothing listens on port 1
  options.run_id = "nobody";
  options.retry_unavailable_for = absl::Milliseconds(300);
  auto store = c10::make_intrusive<GrpcStore>(options, milliseconds(1000));
  absl::Time start = absl::Now();
  try {
    store->set("k", Bytes("v"));
    FAIL() << "set against no server succeeded";
  } catch (const c10::Error& e) {
    std::string what = e.what_without_backtrace();
    EXPECT_NE(what.find("127.0.0.1:1"), std::string::npos) << what;
    EXPECT_NE(what.find("'k'"), std::string::npos) << what;
  }
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
}

// A rendezvous restart: the client's connects were refused while the server
// was down, and a server is back on the same port. The next call reaches it
// within its retry budget (gRPC's own channel, once its connect failed, kept
// failing calls for seconds after the server was up: a worker forming its
// group waited out all of it).
TEST(GrpcStoreNoServerTest, AServerThatIsBackIsReachedWithinTheRetryBudget) {
  // A loopback port that refuses connections (bound, not listening).
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  const int port = ntohs(addr.sin_port);
  StoreClientOptions options;
  options.endpoint = absl::StrCat("127.0.0.1:", port);
  options.run_id = "restarted";
  options.retry_unavailable_for = absl::Seconds(1);
  absl::StatusOr<std::unique_ptr<StoreClient>> client =
      StoreClient::Create(options);
  ASSERT_TRUE(client.ok()) << client.status();
  EXPECT_EQ((*client)->Set("k", "v").code(), absl::StatusCode::kUnavailable)
      << "nothing listens yet";
  close(fd);
  rendezvous::ServerOptions server_options;
  server_options.host = "127.0.0.1";
  server_options.port = port;
  absl::StatusOr<std::unique_ptr<rendezvous::Server>> server =
      rendezvous::Server::Start(server_options);
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_TRUE((*client)->Set("k", "v").ok())
      << "the server is back, but the client did not reach it";
}

// The soak's stall: a node cut off while its workers waited in a store Get
// of a round that then ended. The server's answer ("round over") was lost
// with the connection, the Get waited out its deadline, and the workers
// never read their next round. Here a server that accepts the connection
// and never answers stands for that connection: the Get is in flight when
// the agent announces the next round (the watcher requests a collective
// abort), and it ends then, ABORTED, saying why.
TEST(GrpcStoreRoundEndTest, ACallWhoseAnswerNeverComesEndsWhenTheRoundEnds) {
  int listener = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(listener, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)),
            0);
  ASSERT_EQ(listen(listener, 4), 0);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  StoreClientOptions options;
  options.endpoint = absl::StrCat("127.0.0.1:", ntohs(addr.sin_port));
  options.run_id = "cut-off";
  absl::StatusOr<std::unique_ptr<StoreClient>> client =
      StoreClient::Create(options);
  ASSERT_TRUE(client.ok()) << client.status();

  ClearCollectiveAbort();
  std::atomic<bool> done{false};
  absl::Status got;
  std::thread getter([&] {
    got = (*client)->Get("ddp_grad/node/2", absl::InfiniteDuration()).status();
    done = true;
  });
  // The call is in flight once its channel connected (gRPC connects at
  // the first call); the connection is accepted and never answered.
  pollfd pending{listener, POLLIN, 0};
  ASSERT_EQ(poll(&pending, 1, 30000), 1) << "the Get never connected";
  int connection = accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
  ASSERT_GE(connection, 0);
  EXPECT_FALSE(done) << "the Get ended before the round did: " << got;

  RequestCollectiveAbort();
  const bool ended =
      testing::WaitFor([&] { return done.load(); }, absl::Seconds(30));
  ClearCollectiveAbort();
  EXPECT_TRUE(ended) << "the Get outlived the end of its round";
  if (!ended) close(connection);  // then it fails, and the thread ends
  getter.join();
  EXPECT_EQ(got.code(), absl::StatusCode::kAborted) << got;
  EXPECT_NE(got.message().find("the round ended"), std::string::npos) << got;
  EXPECT_NE(got.message().find("'ddp_grad/node/2'"), std::string::npos) << got;
  if (ended) close(connection);
  close(listener);

  // The next round's calls run again (here: the same unanswered server,
  // so the Set fails on its own short deadline, not ABORTED).
  options.call_timeout = absl::Milliseconds(200);
  options.retry_unavailable_for = absl::ZeroDuration();
  absl::StatusOr<std::unique_ptr<StoreClient>> next =
      StoreClient::Create(options);
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_NE((*next)->Set("k", "v").code(), absl::StatusCode::kAborted);
}

}  // namespace
}  // namespace ddprun::worker
