// The Rendezvous service on a real server: agents joining concurrently,
// heartbeats, cancellation, health; and the ddprun-rendezvous binary.
#include "rendezvous/service/server.h"

#include <signal.h>

#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "ddprun/v1/rendezvous.grpc.pb.h"
#include "ddprun/v1/store.grpc.pb.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/security/credentials.h"
#include "gtest/gtest.h"
#include "tests/testing/frozen_proxy.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/wait_for.h"

namespace ddprun::rendezvous {
namespace {

std::unique_ptr<grpc::ClientContext> Context(absl::Duration deadline) {
  auto context = std::make_unique<grpc::ClientContext>();
  context->set_deadline(absl::ToChronoTime(absl::Now() + deadline));
  return context;
}

v1::JoinRequest JoinRequest(const std::string& node, int nnodes) {
  v1::JoinRequest request;
  request.set_run_id("two-nodes");
  request.set_node_id(node);
  request.set_local_world_size(2);
  request.set_node_rank(-1);
  request.set_address("host-" + node);
  request.set_master_port(node == "a" ? 5001 : 5002);
  request.mutable_config()->set_min_nodes(nnodes);
  request.mutable_config()->set_max_nodes(nnodes);
  return request;
}

class ServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto server = Server::Start(ServerOptions{});
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    channel_ = grpc::CreateChannel(server_->endpoint(),
                                   grpc::InsecureChannelCredentials());
    stub_ = v1::Rendezvous::NewStub(channel_);
  }

  v1::JobStatus JobStatus(const std::string& run_id) {
    v1::StatusRequest request;
    request.set_run_id(run_id);
    v1::StatusResponse response;
    // NOT_FOUND until the first Join: then an empty status.
    stub_->Status(Context(absl::Seconds(5)).get(), request, &response);
    return response.jobs_size() > 0 ? response.jobs(0) : v1::JobStatus();
  }

  std::unique_ptr<Server> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Rendezvous::Stub> stub_;
};

TEST_F(ServerTest, TwoAgentsJoinAndGetConsistentAssignments) {
  v1::JoinResponse responses[2];
  grpc::Status statuses[2];
  std::vector<std::thread> agents;
  const char* names[2] = {"a", "b"};
  for (int i = 0; i < 2; ++i) {
    agents.emplace_back([&, i] {
      // Each agent has its own channel, as separate processes would.
      auto channel = grpc::CreateChannel(server_->endpoint(),
                                         grpc::InsecureChannelCredentials());
      auto stub = v1::Rendezvous::NewStub(channel);
      statuses[i] = stub->Join(Context(absl::Seconds(20)).get(),
                               JoinRequest(names[i], 2), &responses[i]);
    });
  }
  for (auto& t : agents) t.join();
  ASSERT_TRUE(statuses[0].ok()) << statuses[0].error_message();
  ASSERT_TRUE(statuses[1].ok()) << statuses[1].error_message();
  const v1::Assignment& x = responses[0].assignment();
  const v1::Assignment& y = responses[1].assignment();
  EXPECT_EQ(x.round(), y.round());
  EXPECT_EQ(x.world_size(), 4);
  EXPECT_EQ(y.world_size(), 4);
  EXPECT_NE(x.node_rank(), y.node_rank());
  EXPECT_EQ(x.node_rank() + y.node_rank(), 1);
  EXPECT_EQ(x.rank_offset(), 2 * x.node_rank());
  EXPECT_EQ(y.rank_offset(), 2 * y.node_rank());
  EXPECT_EQ(x.master_addr(), y.master_addr());
  EXPECT_EQ(x.master_port(), y.master_port());
  const v1::Assignment& rank0 = x.node_rank() == 0 ? x : y;
  EXPECT_EQ(x.master_addr(), rank0.peers(0).address());

  v1::HeartbeatRequest hb;
  hb.set_run_id("two-nodes");
  hb.set_node_id("a");
  hb.set_round(x.round());
  v1::HeartbeatResponse beat;
  ASSERT_TRUE(
      stub_->Heartbeat(Context(absl::Seconds(5)).get(), hb, &beat).ok());
  EXPECT_FALSE(beat.rejoin());
  EXPECT_EQ(beat.state(), v1::JOB_STATE_RUNNING);
  v1::JobStatus status = JobStatus("two-nodes");
  EXPECT_EQ(status.nodes_size(), 2);
  EXPECT_EQ(status.world_size(), 4);
}

// Joins every node at once through the callback client API; returns the
// answers by node index.
std::vector<v1::JoinResponse> JoinConcurrently(v1::Rendezvous::Stub* stub,
                                               int nodes,
                                               std::vector<grpc::Status>* out) {
  std::vector<v1::JoinResponse> responses(nodes);
  std::vector<std::unique_ptr<grpc::ClientContext>> contexts;
  std::vector<v1::JoinRequest> requests(nodes);
  out->assign(nodes, grpc::Status());
  absl::Mutex mu;
  int done = 0;
  for (int i = 0; i < nodes; ++i) {
    requests[i].set_run_id("many");
    requests[i].set_node_id(absl::StrCat("node-", i));
    requests[i].set_local_world_size(1 + i % 3);
    requests[i].set_node_rank(-1);
    requests[i].set_address(absl::StrCat("host-", i));
    requests[i].mutable_config()->set_min_nodes(nodes);
    requests[i].mutable_config()->set_max_nodes(nodes);
    requests[i].mutable_config()->set_max_restarts(3);
    contexts.push_back(Context(absl::Seconds(30)));
    stub->async()->Join(contexts.back().get(), &requests[i], &responses[i],
                        [&, i](grpc::Status status) {
                          absl::MutexLock lock(&mu);
                          (*out)[i] = status;
                          ++done;
                        });
  }
  absl::MutexLock lock(&mu);
  auto all = [&] { return done == nodes; };
  mu.Await(absl::Condition(&all));
  return responses;
}

TEST_F(ServerTest, ManyAgentsJoinConcurrentlyAndRejoinInTheSameOrder) {
  constexpr int kNodes = 200;
  std::vector<grpc::Status> statuses;
  std::vector<v1::JoinResponse> first =
      JoinConcurrently(stub_.get(), kNodes, &statuses);
  std::vector<int> rank_of(kNodes, -1);
  std::vector<int> offset_of_rank(kNodes, -1);
  int world = 0;
  for (int i = 0; i < kNodes; ++i) {
    ASSERT_TRUE(statuses[i].ok()) << statuses[i].error_message();
    const v1::Assignment& a = first[i].assignment();
    ASSERT_GE(a.node_rank(), 0);
    ASSERT_LT(a.node_rank(), kNodes);
    EXPECT_EQ(offset_of_rank[a.node_rank()], -1) << "rank given twice";
    offset_of_rank[a.node_rank()] = a.rank_offset();
    rank_of[i] = a.node_rank();
    world += 1 + i % 3;
    EXPECT_EQ(a.round(), 0);
  }
  EXPECT_EQ(first[0].assignment().world_size(), world);

  // A failure ends round 0; everyone rejoins and keeps its rank.
  v1::ReportFailureRequest fail;
  fail.set_run_id("many");
  fail.set_node_id("node-7");
  fail.set_round(0);
  v1::ReportFailureResponse failed;
  ASSERT_TRUE(
      stub_->ReportFailure(Context(absl::Seconds(5)).get(), fail, &failed)
          .ok());
  std::vector<v1::JoinResponse> second =
      JoinConcurrently(stub_.get(), kNodes, &statuses);
  for (int i = 0; i < kNodes; ++i) {
    ASSERT_TRUE(statuses[i].ok()) << statuses[i].error_message();
    EXPECT_EQ(second[i].assignment().round(), 1);
    EXPECT_EQ(second[i].assignment().restart_count(), 1);
    EXPECT_EQ(second[i].assignment().node_rank(), rank_of[i]);
  }
  // Every Join went through the async Join queues.
  int64_t queued = 0;
  for (int64_t calls : server_->JoinsPerQueueForTest()) queued += calls;
  EXPECT_EQ(queued, 2 * kNodes);
}

// The memory gRPC held for a large fan-out of parked Joins goes back to the
// system once they are answered (glibc would keep it for good).
TEST(ServerMemoryTest, MemoryIsGivenBackAfterALargeFanOut) {
  ServerOptions options;
  options.return_memory_after_parked = 100;
  auto server = Server::Start(options);
  ASSERT_TRUE(server.ok()) << server.status();
  auto stub = v1::Rendezvous::NewStub(grpc::CreateChannel(
      (*server)->endpoint(), grpc::InsecureChannelCredentials()));
  std::vector<grpc::Status> statuses;
  JoinConcurrently(stub.get(), 50, &statuses);
  EXPECT_EQ((*server)->MemoryTrimsForTest(), 0) << "50 parked: below 100";
  ASSERT_TRUE(statuses[0].ok()) << statuses[0].error_message();
  // 200 nodes of a second job park, then their round closes.
  std::vector<v1::JoinResponse> responses(200);
  std::vector<grpc::Status> second(200);
  {
    std::vector<std::unique_ptr<grpc::ClientContext>> contexts;
    std::vector<v1::JoinRequest> requests(200);
    absl::Mutex mu;
    int done = 0;
    for (int i = 0; i < 200; ++i) {
      requests[i] = JoinRequest(absl::StrCat("n", i), 200);
      requests[i].set_run_id("large");
      contexts.push_back(Context(absl::Seconds(30)));
      stub->async()->Join(contexts.back().get(), &requests[i], &responses[i],
                          [&, i](grpc::Status status) {
                            absl::MutexLock lock(&mu);
                            second[i] = status;
                            ++done;
                          });
    }
    absl::MutexLock lock(&mu);
    auto all = [&] { return done == 200; };
    mu.Await(absl::Condition(&all));
  }
  for (const grpc::Status& status : second) {
    ASSERT_TRUE(status.ok()) << status.error_message();
  }
  EXPECT_TRUE(testing::WaitFor(
      [&] { return (*server)->MemoryTrimsForTest() >= 1; }, absl::Seconds(20)))
      << "no memory given back after 200 parked Joins were answered";
}

TEST_F(ServerTest, CancelledJoinLeavesNoNodeBehind) {
  v1::JoinResponse response;
  grpc::Status status = stub_->Join(Context(absl::Milliseconds(200)).get(),
                                    JoinRequest("a", 2), &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_TRUE(
      testing::WaitFor([&] { return JobStatus("two-nodes").nodes_size() == 0; },
                       absl::Seconds(5)))
      << "the node whose Join went away must be dropped";
}

// The deadline thread sleeps while nothing is due (a `ddprun --standalone`
// agent shares the cores of the ranks it trains with): an idle server
// ticks about twice a second, not every tick_interval.
TEST(ServerTickTest, IdleServerSleepsBetweenTicks) {
  auto server = Server::Start(ServerOptions{});
  ASSERT_TRUE(server.ok()) << server.status();
  ASSERT_TRUE(testing::WaitFor([&] { return (*server)->TicksForTest() >= 1; },
                               absl::Seconds(10)));
  EXPECT_TRUE(testing::WaitFor(
      [&] {
        return (*server)->PlannedTickSleepForTest() ==
               ServerOptions{}.max_tick_sleep;
      },
      absl::Seconds(10)))
      << "planned " << (*server)->PlannedTickSleepForTest();
}

// After a long idle sleep a new Join's timeout still fires on time: the
// Join wakes the ticker (JobTableOptions::wake_by). With a sleep cap of an
// hour, a ticker nobody woke would answer an hour late.
TEST(ServerTickTest, JoinTimeoutFiresAfterAnIdlePeriod) {
  ServerOptions options;
  options.max_tick_sleep = absl::Hours(1);
  options.forgive_stalls_over = absl::InfiniteDuration();
  auto server = Server::Start(options);
  ASSERT_TRUE(server.ok()) << server.status();
  ASSERT_TRUE(testing::WaitFor([&] { return (*server)->TicksForTest() >= 1; },
                               absl::Seconds(10)));
  const int64_t idle_ticks = (*server)->TicksForTest();
  EXPECT_FALSE(
      testing::WaitFor([&] { return (*server)->TicksForTest() > idle_ticks; },
                       absl::Milliseconds(300)))
      << "an idle server ticked while nothing was due";
  auto stub = v1::Rendezvous::NewStub(grpc::CreateChannel(
      (*server)->endpoint(), grpc::InsecureChannelCredentials()));
  v1::JoinRequest request = JoinRequest("a", 2);
  request.mutable_config()->set_join_timeout_ms(200);
  v1::JoinResponse response;
  grpc::Status status =
      stub->Join(Context(absl::Seconds(30)).get(), request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED)
      << status.error_message();
  EXPECT_NE(status.error_message().find("join_timeout_ms"), std::string::npos)
      << "answered by the server's join timeout, not the client's deadline: "
      << status.error_message();
}

TEST(KeepaliveTest, ParkedJoinOfAHostThatWentSilentIsDropped) {
  ServerOptions options;
  options.keepalive_time = absl::Milliseconds(200);
  options.keepalive_timeout = absl::Milliseconds(300);
  auto server = Server::Start(options);
  ASSERT_TRUE(server.ok()) << server.status();
  testing::FrozenProxy proxy((*server)->port());
  // The agent reaches the server through the proxy; its Join parks.
  auto through_proxy =
      grpc::CreateChannel(absl::StrCat("127.0.0.1:", proxy.port()),
                          grpc::InsecureChannelCredentials());
  auto agent = v1::Rendezvous::NewStub(through_proxy);
  grpc::ClientContext join_context;
  join_context.set_deadline(
      absl::ToChronoTime(absl::Now() + absl::Seconds(60)));
  v1::JoinRequest join = JoinRequest("a", 2);
  v1::JoinResponse joined;
  absl::Mutex mu;
  bool join_done = false;
  agent->async()->Join(&join_context, &join, &joined, [&](grpc::Status) {
    absl::MutexLock lock(&mu);
    join_done = true;
  });
  auto direct = v1::Rendezvous::NewStub(grpc::CreateChannel(
      (*server)->endpoint(), grpc::InsecureChannelCredentials()));
  auto nodes = [&] {
    v1::StatusRequest request;
    request.set_run_id("two-nodes");
    v1::StatusResponse response;
    direct->Status(Context(absl::Seconds(5)).get(), request, &response);
    return response.jobs_size() == 0 ? 0 : response.jobs(0).nodes_size();
  };
  ASSERT_TRUE(testing::WaitFor([&] { return nodes() == 1; }, absl::Seconds(5)));
  // Pings are answered while the link works.
  absl::SleepFor(absl::Milliseconds(700));
  ASSERT_EQ(nodes(), 1) << "a live parked agent must stay";
  // The agent's host goes silent: no FIN, no RST, no ping answers.
  proxy.Freeze();
  absl::Time frozen_at = absl::Now();
  EXPECT_TRUE(testing::WaitFor([&] { return nodes() == 0; }, absl::Seconds(10)))
      << "the server must drop a node whose connection stopped answering";
  EXPECT_LT(absl::Now() - frozen_at, absl::Seconds(5));
  join_context.TryCancel();
  absl::MutexLock lock(&mu);
  mu.Await(absl::Condition(&join_done));
}

TEST_F(ServerTest, HeartbeatForAnUnknownJobIsNotFound) {
  v1::HeartbeatRequest hb;
  hb.set_run_id("nobody");
  hb.set_node_id("a");
  v1::HeartbeatResponse beat;
  grpc::Status status =
      stub_->Heartbeat(Context(absl::Seconds(5)).get(), hb, &beat);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_NE(status.error_message().find("nobody"), std::string::npos);
}

TEST_F(ServerTest, LeaveOfAnUnknownJobIsNotFound) {
  // An agent learns from NOT_FOUND that a restarted server lost the job and
  // resumes it before leaving again; OK here would drop its success.
  v1::LeaveRequest leave;
  leave.set_run_id("nobody");
  leave.set_node_id("a");
  v1::LeaveResponse left;
  grpc::Status status =
      stub_->Leave(Context(absl::Seconds(5)).get(), leave, &left);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_NE(status.error_message().find("nobody"), std::string::npos);
}

TEST_F(ServerTest, ShutdownAnswersParkedJoins) {
  grpc::Status status;
  std::thread agent([&] {
    v1::JoinResponse response;
    status = stub_->Join(Context(absl::Seconds(20)).get(), JoinRequest("a", 2),
                         &response);
  });
  ASSERT_TRUE(
      testing::WaitFor([&] { return JobStatus("two-nodes").nodes_size() == 1; },
                       absl::Seconds(5)));
  absl::Time start = absl::Now();
  server_->Shutdown();
  agent.join();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE)
      << status.error_message();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  server_->Shutdown();  // idempotent
}

TEST_F(ServerTest, HealthServiceAnswersServing) {
  grpc::GenericStub generic(channel_);
  grpc::Slice empty("");  // HealthCheckRequest{service: ""}: no bytes
  grpc::ByteBuffer request(&empty, 1);
  grpc::ByteBuffer response;
  grpc::Status status;
  bool done = false;
  absl::Mutex mu;
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
  grpc::StubOptions options;
  generic.UnaryCall(&context, "/grpc.health.v1.Health/Check", options, &request,
                    &response, [&](grpc::Status s) {
                      absl::MutexLock lock(&mu);
                      status = s;
                      done = true;
                    });
  absl::MutexLock lock(&mu);
  mu.Await(absl::Condition(&done));
  ASSERT_TRUE(status.ok()) << status.error_message();
  std::vector<grpc::Slice> slices;
  ASSERT_TRUE(response.Dump(&slices).ok());
  std::string bytes;
  for (const auto& s : slices) bytes.append(s.begin(), s.end());
  EXPECT_EQ(bytes, std::string("\x08\x01", 2)) << "status: SERVING";
}

TEST(ServerBinaryTest, PrintsItsPortServesAndStopsOnSigterm) {
  testing::TempDir dir;
  testing::SubprocessOptions options;
  options.argv = {testing::BinaryPath("rendezvous/ddprun-rendezvous"), "--port",
                  "0", "--log-level", "warn"};
  options.stdout_path = dir.File("out");
  options.stderr_path = dir.File("err");
  auto process = testing::Subprocess::Start(options);
  ASSERT_TRUE(process.ok()) << process.status();
  std::string line;
  ASSERT_TRUE(testing::WaitFor(
      [&] {
        std::string out = testing::ReadFileOrEmpty(dir.File("out"));
        size_t eol = out.find('\n');
        if (eol == std::string::npos) return false;
        line = out.substr(0, eol);
        return true;
      },
      absl::Seconds(10)))
      << testing::ReadFileOrEmpty(dir.File("err"));
  const std::string prefix = "ddprun-rendezvous listening on 127.0.0.1:";
  ASSERT_EQ(line.rfind(prefix, 0), 0u) << line;
  int port = 0;
  ASSERT_TRUE(absl::SimpleAtoi(line.substr(prefix.size()), &port)) << line;
  ASSERT_GT(port, 0);

  auto channel = grpc::CreateChannel(absl::StrCat("127.0.0.1:", port),
                                     grpc::InsecureChannelCredentials());
  auto store = v1::Store::NewStub(channel);
  v1::SetRequest set;
  set.mutable_scope()->set_run_id("binary");
  set.set_key("k");
  set.set_value("v");
  v1::SetResponse set_response;
  ASSERT_TRUE(
      store->Set(Context(absl::Seconds(5)).get(), set, &set_response).ok());
  v1::GetRequest get;
  *get.mutable_scope() = set.scope();
  get.set_key("k");
  v1::GetResponse got;
  ASSERT_TRUE(store->Get(Context(absl::Seconds(5)).get(), get, &got).ok());
  EXPECT_EQ(got.value(), "v");

  process->Signal(SIGTERM);
  std::optional<testing::ExitInfo> exit = process->Wait(absl::Seconds(10));
  ASSERT_TRUE(exit.has_value()) << "did not stop on SIGTERM";
  EXPECT_TRUE(exit->ok()) << exit->ToString();
}

TEST(ServerBinaryTest, BusyPortIsOneClearErrorAndNonZeroExit) {
  auto first = Server::Start(ServerOptions{});
  ASSERT_TRUE(first.ok());
  testing::RunResult result =
      testing::RunCommand({testing::BinaryPath("rendezvous/ddprun-rendezvous"),
                           "--port", absl::StrCat((*first)->port())},
                          absl::Seconds(20));
  ASSERT_FALSE(result.timed_out);
  EXPECT_NE(result.exit.exit_code, 0);
  EXPECT_NE(result.err.find("cannot listen on"), std::string::npos)
      << result.err;
}

}  // namespace
}  // namespace ddprun::rendezvous
