// The agent's round lifecycle driven through every transition with fakes at
// its seams, as job_test.cc drives Job: a fake RendezvousApi, a fake
// ProcessControl (no process is spawned) and a fake clock that moves only
// when the agent waits. No sockets: the master port comes from the context.
// The heartbeat loop is the real one, on its own thread, against the fake
// rendezvous (1 ms interval); tests wait on conditions, never on time.
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <deque>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "common/progress_record.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "launcher/agent/agent.h"
#include "launcher/agent/agent_events.h"
#include "launcher/agent/rendezvous_api.h"
#include "launcher/posix/process_control.h"
#include "tests/testing/fake_process_control.h"
#include "tests/testing/fake_rendezvous.h"
#include "tests/testing/temp_dir.h"

namespace ddprun::launcher {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;
using ::testing::SizeIs;

constexpr int kNproc = 2;

// The agent's one sleep, stepped: a short real wait lets the heartbeat
// thread post its news, then fake time moves by what the agent asked for.
class SteppedEvents final : public AgentEvents {
 public:
  explicit SteppedEvents(common::FakeClock& clock) : clock_(clock) {}
  void Wait(absl::Duration timeout) override {
    AgentEvents::Wait(std::min(timeout, absl::Milliseconds(1)));
    clock_.Advance(timeout);
  }

 private:
  common::FakeClock& clock_;
};

// A worker as the fake process table knows it.
struct FakeWorker {
  pid_t pid = 0;
  int local_rank = 0;
  int64_t round = 0;
  std::map<std::string, std::string> env;
  std::vector<int> signals;
  // A read end of its control pipe (DDPRUN_CONTROL_FD), kept by the fake as
  // the worker would; -1 when it has none.
  int control_fd = -1;
  // The write end of its progress pipe (DDPRUN_PROGRESS_FD), for a test
  // that has it report a step; -1 when it has none.
  int progress_fd = -1;
  // What arrived there so far (ControlLines reads it).
  mutable std::string control_data;
};

// The lines the agent wrote to `w`'s control pipe (the next rounds'
// environments, in-place recovery).
std::vector<std::string> ControlLines(const FakeWorker& w) {
  char buffer[65536];
  ssize_t n;
  while (w.control_fd >= 0 &&
         (n = read(w.control_fd, buffer, sizeof(buffer))) > 0) {
    w.control_data.append(buffer, static_cast<size_t>(n));
  }
  std::vector<std::string> lines;
  size_t start = 0, end;
  while ((end = w.control_data.find('\n', start)) != std::string::npos) {
    lines.push_back(w.control_data.substr(start, end - start));
    start = end + 1;
  }
  return lines;
}

// The shared fake of the ProcessControl seam with the workers as these
// tests look at them: their environment, their pipes, the signals each got.
// Every signal ends a worker.
class LifecycleControl final : public ::ddprun::testing::FakeProcessControl {
 public:
  explicit LifecycleControl(common::FakeClock& clock)
      : FakeProcessControl(&clock) {
    ends_on = [](const Process&, int) { return true; };
    on_spawn = [this](Process& p) { AddWorker(p); };
    // The base's hook asks this class's, which takes the worker.
    FakeProcessControl::exit_when =
        [this](const Process& p) -> std::optional<ExitStatus> {
      return exit_when(*Worker(p.pid));
    };
  }

  // Asked about each running worker whenever the agent reaps: how it ends
  // now, or nullopt while it runs on. Default: it runs until signalled.
  std::function<std::optional<ExitStatus>(const FakeWorker&)> exit_when =
      [](const FakeWorker&) { return std::nullopt; };
  // Each worker reports progress once when it starts.
  bool progress_at_start = false;
  // Each worker declares in-place recovery (as libddp's Membership does)
  // when it starts, unless it starts in a round after
  // `declare_up_to_round` (a replacement still loading its program).
  bool declare_in_place = false;
  int64_t declare_up_to_round = std::numeric_limits<int64_t>::max();

  void SignalGroup(pid_t pgid, int sig) override {
    FakeProcessControl::SignalGroup(pgid, sig);
    if (FakeWorker* w = Worker(pgid)) w->signals = Find(pgid)->signals;
  }

  // The workers of `round`, by local rank.
  std::vector<const FakeWorker*> Round(int64_t round) const {
    std::vector<const FakeWorker*> out;
    for (const FakeWorker& w : workers) {
      if (w.round == round) out.push_back(&w);
    }
    return out;
  }

  ~LifecycleControl() {
    for (FakeWorker& w : workers) {
      if (w.control_fd >= 0) close(w.control_fd);
      if (w.progress_fd >= 0) close(w.progress_fd);
    }
  }

  std::vector<FakeWorker> workers;

 private:
  void AddWorker(const Process& p) {
    const SpawnRequest& request = p.request;
    FakeWorker w;
    w.pid = p.pid;
    for (const std::string& entry : request.env) {
      size_t eq = entry.find('=');
      w.env[entry.substr(0, eq)] = entry.substr(eq + 1);
    }
    EXPECT_TRUE(absl::SimpleAtoi(w.env["LOCAL_RANK"], &w.local_rank));
    EXPECT_TRUE(absl::SimpleAtoi(w.env["DDPRUN_ROUND"], &w.round));
    // [0] the progress pipe, [1] the control pipe.
    EXPECT_THAT(request.inherit_fds, SizeIs(2));
    if (progress_at_start) {
      EXPECT_EQ(write(request.inherit_fds[0], "step\n", 5), 5);
    }
    if (declare_in_place && w.round <= declare_up_to_round) {
      const std::string line = common::kInPlaceLine;
      EXPECT_EQ(write(request.inherit_fds[0], line.data(), line.size()),
                static_cast<ssize_t>(line.size()));
    }
    if (request.inherit_fds.size() == 2) {
      w.progress_fd = dup(request.inherit_fds[0]);
      w.control_fd = dup(request.inherit_fds[1]);
      fcntl(w.control_fd, F_SETFL, fcntl(w.control_fd, F_GETFL) | O_NONBLOCK);
    }
    workers.push_back(std::move(w));
  }

  FakeWorker* Worker(pid_t pid) {
    for (FakeWorker& w : workers) {
      if (w.pid == pid) return &w;
    }
    return nullptr;
  }
};

v1::Assignment MakeAssignment(int64_t round, int restart_count,
                              int num_nodes = 1) {
  v1::Assignment a;
  a.set_round(round);
  a.set_node_rank(0);
  a.set_num_nodes(num_nodes);
  a.set_rank_offset(0);
  a.set_world_size(num_nodes * kNproc);
  a.set_master_addr("10.0.0.1");
  a.set_master_port(29500);
  a.set_restart_count(restart_count);
  a.set_max_restarts(3);
  a.set_heartbeat_interval_ms(1);
  return a;
}

v1::JoinResponse Assigned(const v1::Assignment& a) {
  v1::JoinResponse r;
  *r.mutable_assignment() = a;
  return r;
}

v1::HeartbeatResponse Running() {
  v1::HeartbeatResponse r;
  r.set_state(v1::JOB_STATE_RUNNING);
  return r;
}

using HeartbeatFn = std::function<absl::StatusOr<v1::HeartbeatResponse>(
    const v1::HeartbeatRequest&, int)>;

// Heartbeats of `round` answer `answer`; later rounds run on.
HeartbeatFn InRound(int64_t round,
                    absl::StatusOr<v1::HeartbeatResponse> answer) {
  return [round, answer](const v1::HeartbeatRequest& request,
                         int) -> absl::StatusOr<v1::HeartbeatResponse> {
    if (request.round() == round) return answer;
    return Running();
  };
}

// The server's word that the node's round is over.
v1::HeartbeatResponse RoundOver(int nodes_waiting = 0) {
  v1::HeartbeatResponse r;
  r.set_state(v1::JOB_STATE_JOINING);
  r.set_rejoin(true);
  r.set_nodes_waiting(nodes_waiting);
  return r;
}

// Workers that run until signalled, except those of `round`, which exit 0.
std::function<std::optional<ExitStatus>(const FakeWorker&)> SucceedInRound(
    int64_t round) {
  return [round](const FakeWorker& w) -> std::optional<ExitStatus> {
    if (w.round == round) return ExitStatus::Exited(0);
    return std::nullopt;
  };
}

class AgentLifecycleTest : public ::testing::Test {
 protected:
  AgentLifecycleTest() : events_(clock_), control_(clock_) {
    options_.nproc_per_node = kNproc;
    options_.rdzv_id = "job";
    options_.max_restarts = 3;
    options_.monitor_interval = absl::Seconds(1);
    options_.shutdown_grace = absl::Seconds(3);
  }

  int RunAgent() {
    AgentContext context;
    context.store_endpoint = "fake:0";
    context.local_addr = "10.0.0.1";
    context.node_id = "node-a";
    context.scratch_dir = scratch_.path();
    context.worker_argv = {"train"};
    context.base_env = {"PATH=/usr/bin", "HOME=/root"};
    context.reserve_port = [](const std::string&) { return 29500; };
    Agent agent(options_, std::move(context), rdzv_, control_, events_, clock_);
    return agent.Run();
  }

  void ExpectJoins(std::vector<absl::StatusOr<v1::JoinResponse>> joins) {
    absl::MutexLock lock(&rdzv_.mu);
    for (auto& j : joins) rdzv_.joins.push_back(std::move(j));
  }

  // The workers of `round` all got `sig` (and nothing else).
  void ExpectStoppedWith(int64_t round, int sig) {
    std::vector<const FakeWorker*> ws = control_.Round(round);
    ASSERT_THAT(ws, SizeIs(kNproc));
    for (const FakeWorker* w : ws) EXPECT_THAT(w->signals, ElementsAre(sig));
  }

  common::FakeClock clock_;
  SteppedEvents events_;
  LifecycleControl control_;
  ::ddprun::testing::FakeRendezvous rdzv_;
  AgentOptions options_;
  testing::TempDir scratch_;
};

TEST_F(AgentLifecycleTest, AllWorkersExitZeroLeavesAsSucceeded) {
  ExpectJoins({Assigned(MakeAssignment(1, 0))});
  control_.exit_when = [](const FakeWorker&) { return ExitStatus::Exited(0); };

  EXPECT_EQ(RunAgent(), 0);

  ASSERT_THAT(control_.workers, SizeIs(kNproc));
  const FakeWorker& w1 = control_.workers[1];
  EXPECT_EQ(w1.env.at("RANK"), "1");
  EXPECT_EQ(w1.env.at("WORLD_SIZE"), "2");
  EXPECT_EQ(w1.env.at("MASTER_PORT"), "29500");
  EXPECT_EQ(w1.env.at("TORCHELASTIC_ERROR_FILE"),
            scratch_.path() + "/attempt_0/1/error.json");
  ASSERT_THAT(rdzv_.join_requests, SizeIs(1));
  EXPECT_EQ(rdzv_.join_requests[0].master_port(), 29500);
  EXPECT_THAT(rdzv_.reports, IsEmpty());
  ASSERT_THAT(rdzv_.leaves, SizeIs(1));
  EXPECT_EQ(rdzv_.leaves[0].reason(), v1::LeaveRequest::REASON_SUCCEEDED);
  EXPECT_EQ(rdzv_.leaves[0].round(), 1);
}

TEST_F(AgentLifecycleTest, WorkerExitIsReportedAndTheRestartSucceeds) {
  ExpectJoins({Assigned(MakeAssignment(1, 0)), Assigned(MakeAssignment(2, 1))});
  control_.exit_when = [](const FakeWorker& w) -> std::optional<ExitStatus> {
    if (w.round == 1) {
      if (w.local_rank == 1) return ExitStatus::Exited(3);
      return std::nullopt;
    }
    return ExitStatus::Exited(0);
  };

  EXPECT_EQ(RunAgent(), 0);

  ASSERT_THAT(rdzv_.reports, SizeIs(1));
  ASSERT_THAT(rdzv_.reports[0].failures(), SizeIs(1));
  const v1::WorkerFailure& f = rdzv_.reports[0].failures(0);
  EXPECT_EQ(f.failure_cause(), v1::FAILURE_CAUSE_EXITED);
  EXPECT_EQ(f.exit_code(), 3);
  EXPECT_EQ(f.rank(), 1);
  EXPECT_EQ(rdzv_.reports[0].round(), 1);
  // The surviving worker of round 1 was stopped; the failed one was not.
  std::vector<const FakeWorker*> round1 = control_.Round(1);
  ASSERT_THAT(round1, SizeIs(kNproc));
  EXPECT_THAT(round1[0]->signals, ElementsAre(SIGTERM));
  EXPECT_THAT(round1[1]->signals, IsEmpty());
  std::vector<const FakeWorker*> round2 = control_.Round(2);
  ASSERT_THAT(round2, SizeIs(kNproc));
  EXPECT_EQ(round2[0]->env.at("TORCHELASTIC_RESTART_COUNT"), "1");
  EXPECT_EQ(round2[0]->env.at("TORCHELASTIC_ERROR_FILE"),
            scratch_.path() + "/attempt_1/0/error.json");
  EXPECT_THAT(rdzv_.join_requests, SizeIs(2));
  ASSERT_THAT(rdzv_.leaves, SizeIs(1));
  EXPECT_EQ(rdzv_.leaves[0].round(), 2);
}

TEST_F(AgentLifecycleTest, WorkerKilledBySignalIsReportedAsSignaled) {
  ExpectJoins({Assigned(MakeAssignment(1, 0)), Assigned(MakeAssignment(2, 1))});
  control_.exit_when = [](const FakeWorker& w) -> std::optional<ExitStatus> {
    if (w.round == 1 && w.local_rank == 0) return ExitStatus::Signaled(SIGSEGV);
    if (w.round == 2) return ExitStatus::Exited(0);
    return std::nullopt;
  };

  EXPECT_EQ(RunAgent(), 0);

  ASSERT_THAT(rdzv_.reports, SizeIs(1));
  const v1::WorkerFailure& f = rdzv_.reports[0].failures(0);
  EXPECT_EQ(f.failure_cause(), v1::FAILURE_CAUSE_SIGNALED);
  EXPECT_EQ(f.signal(), SIGSEGV);
  EXPECT_EQ(f.signal_name(), "SIGSEGV");
  EXPECT_EQ(f.rank(), 0);
}

TEST_F(AgentLifecycleTest, SilentWorkerIsHungAfterTheWorkerTimeout) {
  // As --worker-timeout 30 sets it: every phase after the start.
  for (int i = 1; i < common::kNumPhases; ++i) {
    options_.hang_bounds.fixed[i] = absl::Seconds(30);
  }
  control_.progress_at_start = true;
  ExpectJoins({Assigned(MakeAssignment(1, 0)), Assigned(MakeAssignment(2, 1))});
  // Round 1: silent after one progress report.
  control_.exit_when = SucceedInRound(2);
  absl::Time start = clock_.Now();

  EXPECT_EQ(RunAgent(), 0);

  ASSERT_THAT(rdzv_.reports, SizeIs(1));
  ASSERT_THAT(rdzv_.reports[0].failures(), SizeIs(kNproc));
  EXPECT_EQ(rdzv_.reports[0].failures(0).failure_cause(),
            v1::FAILURE_CAUSE_HUNG);
  // A hung worker gets no grace: it could not use it.
  ExpectStoppedWith(1, SIGKILL);
  EXPECT_GE(clock_.Now() - start, absl::Seconds(30));
}

TEST_F(AgentLifecycleTest, PeerFailureLearnedByHeartbeatRejoins) {
  ExpectJoins({Assigned(MakeAssignment(1, 0)), Assigned(MakeAssignment(2, 1))});
  rdzv_.heartbeat = InRound(1, RoundOver());
  control_.exit_when = SucceedInRound(2);

  EXPECT_EQ(RunAgent(), 0);

  // Not this node's failure: nothing reported, its workers stopped.
  EXPECT_THAT(rdzv_.reports, IsEmpty());
  ExpectStoppedWith(1, SIGTERM);
  EXPECT_THAT(rdzv_.join_requests, SizeIs(2));
  ASSERT_THAT(rdzv_.leaves, SizeIs(1));
  EXPECT_EQ(rdzv_.leaves[0].round(), 2);
}

TEST_F(AgentLifecycleTest, RendezvousUnreachableAndBackKeepsTheRound) {
  options_.rdzv_conf.heartbeat_timeout = absl::Seconds(60);
  ExpectJoins({Assigned(MakeAssignment(1, 0))});
  rdzv_.heartbeat = [](const v1::HeartbeatRequest&,
                       int call) -> absl::StatusOr<v1::HeartbeatResponse> {
    if (call < 3) return absl::UnavailableError("rendezvous down");
    return Running();
  };
  // The workers finish once the rendezvous answered again.
  control_.exit_when = [this](const FakeWorker&) -> std::optional<ExitStatus> {
    if (rdzv_.heartbeat_count() >= 5) return ExitStatus::Exited(0);
    return std::nullopt;
  };

  EXPECT_EQ(RunAgent(), 0);

  EXPECT_THAT(rdzv_.join_requests, SizeIs(1));
  EXPECT_THAT(rdzv_.reports, IsEmpty());
  EXPECT_THAT(control_.workers, SizeIs(kNproc));
}

TEST_F(AgentLifecycleTest, HeartbeatsFailingPastTheTimeoutEndTheRound) {
  options_.rdzv_conf.heartbeat_timeout = absl::Milliseconds(20);
  ExpectJoins({Assigned(MakeAssignment(1, 0)), Assigned(MakeAssignment(2, 0))});
  rdzv_.heartbeat = InRound(1, absl::UnavailableError("cut off"));
  control_.exit_when = SucceedInRound(2);

  EXPECT_EQ(RunAgent(), 0);

  ExpectStoppedWith(1, SIGTERM);
  EXPECT_THAT(rdzv_.reports, IsEmpty());
  EXPECT_THAT(rdzv_.join_requests, SizeIs(2));
}

// Past read_timeout: EX_TEMPFAIL, so that a supervisor starts the agent
// again later; a failed job exits 1.
TEST_F(AgentLifecycleTest, UnreachableRendezvousAtJoinExitsTempFail) {
  ExpectJoins({absl::UnavailableError("Join to rendezvous fake:0 failed")});

  EXPECT_EQ(RunAgent(), kExitRendezvousUnreachable);

  EXPECT_THAT(control_.workers, IsEmpty());
  EXPECT_THAT(rdzv_.leaves, IsEmpty());
}

TEST_F(AgentLifecycleTest, SignalToTheAgentStopsWorkersAndLeaves) {
  ExpectJoins({Assigned(MakeAssignment(1, 0))});
  control_.exit_when = [this](const FakeWorker&) -> std::optional<ExitStatus> {
    events_.PostSignal(SIGTERM);
    return std::nullopt;
  };

  EXPECT_EQ(RunAgent(), 128 + SIGTERM);

  // Forwarded once; the two-phase stop's own SIGTERM finds them gone.
  ExpectStoppedWith(1, SIGTERM);
  EXPECT_THAT(rdzv_.reports, IsEmpty());
  ASSERT_THAT(rdzv_.leaves, SizeIs(1));
  EXPECT_EQ(rdzv_.leaves[0].reason(), v1::LeaveRequest::REASON_SHUTDOWN);
  EXPECT_EQ(rdzv_.leaves[0].round(), 1);
}

TEST_F(AgentLifecycleTest, SignalWhileJoiningLeavesWithoutStartingWorkers) {
  ExpectJoins({absl::CancelledError("join cancelled")});
  rdzv_.on_join = [this] { events_.PostSignal(SIGINT); };

  EXPECT_EQ(RunAgent(), 128 + SIGINT);

  EXPECT_THAT(control_.workers, IsEmpty());
  ASSERT_THAT(rdzv_.leaves, SizeIs(1));
  EXPECT_EQ(rdzv_.leaves[0].reason(), v1::LeaveRequest::REASON_SHUTDOWN);
}

TEST_F(AgentLifecycleTest, RestartsExhaustedEndsWithExitOne) {
  rdzv_.restarts_exhausted = true;
  v1::JoinResponse ended;
  ended.mutable_ended()->set_state(v1::JOB_STATE_FAILED);
  v1::WorkerFailure* root = ended.mutable_ended()->add_failures();
  root->set_rank(1);
  root->set_cause("exited");
  root->set_exit_code(3);
  ExpectJoins({Assigned(MakeAssignment(1, 3)), ended});
  control_.exit_when = [](const FakeWorker& w) -> std::optional<ExitStatus> {
    if (w.local_rank == 1) return ExitStatus::Exited(3);
    return std::nullopt;
  };

  EXPECT_EQ(RunAgent(), 1);

  EXPECT_THAT(rdzv_.reports, SizeIs(1));
  EXPECT_THAT(rdzv_.join_requests, SizeIs(2));
  EXPECT_THAT(control_.workers, SizeIs(kNproc));  // no round after the last
}

TEST_F(AgentLifecycleTest, JobThatAlreadySucceededExitsZero) {
  v1::JoinResponse ended;
  ended.mutable_ended()->set_state(v1::JOB_STATE_SUCCEEDED);
  ExpectJoins({ended});

  EXPECT_EQ(RunAgent(), 0);

  EXPECT_THAT(control_.workers, IsEmpty());
}

TEST_F(AgentLifecycleTest, ScaleUpRejoinsIntoTheLargerWorld) {
  ExpectJoins({Assigned(MakeAssignment(1, 0, /*num_nodes=*/1)),
               Assigned(MakeAssignment(2, 0, /*num_nodes=*/2))});
  rdzv_.heartbeat = InRound(1, RoundOver(/*nodes_waiting=*/1));
  control_.exit_when = SucceedInRound(2);

  EXPECT_EQ(RunAgent(), 0);

  EXPECT_THAT(rdzv_.reports, IsEmpty());
  ExpectStoppedWith(1, SIGTERM);
  std::vector<const FakeWorker*> round2 = control_.Round(2);
  ASSERT_THAT(round2, SizeIs(kNproc));
  EXPECT_EQ(round2[1]->env.at("WORLD_SIZE"), "4");
  EXPECT_EQ(round2[1]->env.at("GROUP_WORLD_SIZE"), "2");
  EXPECT_EQ(round2[1]->env.at("TORCHELASTIC_RESTART_COUNT"), "0");
}

// In-place recovery: workers that declared it are not stopped, so a fault
// costs the job one worker's restart, not every worker's.

TEST_F(AgentLifecycleTest, InPlaceOnlyTheFailedWorkerIsReplaced) {
  control_.declare_in_place = true;
  ExpectJoins({Assigned(MakeAssignment(1, 0)), Assigned(MakeAssignment(2, 1))});
  control_.exit_when =
      [this](const FakeWorker& w) -> std::optional<ExitStatus> {
    if (w.round == 1 && w.local_rank == 1) return ExitStatus::Signaled(SIGKILL);
    // Everyone ends well once the replacement runs.
    if (!control_.Round(2).empty()) return ExitStatus::Exited(0);
    return std::nullopt;
  };

  EXPECT_EQ(RunAgent(), 0);

  ASSERT_THAT(rdzv_.reports, SizeIs(1));
  EXPECT_EQ(rdzv_.reports[0].failures(0).cause(), "signaled");
  EXPECT_EQ(rdzv_.reports[0].failures(0).rank(), 1);
  // Three processes in all: the survivor was neither stopped nor started
  // again; only local rank 1 was, into round 2.
  ASSERT_THAT(control_.workers, SizeIs(3));
  const FakeWorker& survivor = control_.workers[0];
  EXPECT_EQ(survivor.local_rank, 0);
  EXPECT_THAT(survivor.signals, IsEmpty());
  const FakeWorker& replacement = control_.workers[2];
  EXPECT_EQ(replacement.local_rank, 1);
  EXPECT_EQ(replacement.round, 2);
  EXPECT_EQ(replacement.env.at("TORCHELASTIC_RESTART_COUNT"), "1");
  EXPECT_EQ(replacement.env.count("DDPRUN_CONTROL_FD"), 1u);
  // The survivor learned round 2 on its control pipe: its whole new
  // environment, one line.
  std::vector<std::string> lines = ControlLines(survivor);
  ASSERT_THAT(lines, SizeIs(1));
  EXPECT_NE(lines[0].find("\"DDPRUN_ROUND\":\"2\""), std::string::npos)
      << lines[0];
  EXPECT_NE(lines[0].find("\"RANK\":\"0\""), std::string::npos);
  ASSERT_THAT(rdzv_.leaves, SizeIs(1));
  EXPECT_EQ(rdzv_.leaves[0].round(), 2);
}

TEST_F(AgentLifecycleTest, InPlaceWorkersContinueWhenAnotherNodeFails) {
  control_.declare_in_place = true;
  ExpectJoins({Assigned(MakeAssignment(1, 0)), Assigned(MakeAssignment(2, 1))});
  rdzv_.heartbeat = InRound(1, RoundOver());
  control_.exit_when = [](const FakeWorker& w) -> std::optional<ExitStatus> {
    // A worker ends once it has been told round 2.
    if (!ControlLines(w).empty()) return ExitStatus::Exited(0);
    return std::nullopt;
  };

  EXPECT_EQ(RunAgent(), 0);

  EXPECT_THAT(rdzv_.reports, IsEmpty());
  ASSERT_THAT(control_.workers, SizeIs(kNproc));  // nobody started again
  for (const FakeWorker& w : control_.workers) {
    EXPECT_THAT(w.signals, IsEmpty());
    ASSERT_THAT(ControlLines(w), SizeIs(1));
  }
  EXPECT_THAT(rdzv_.join_requests, SizeIs(2));
}

// The soak's case (bench/fault/README.md, wave 17): the server ended the
// round (another node missed its heartbeats), but the workers, not yet told,
// trained to the end with the other node's and exited 0 while this agent
// joined the next round, which nothing would form. The Join's check
// (asked whenever a child changes state: RendezvousApi::JoinUnless) finds
// every worker succeeded, and the agent leaves as succeeded in the round
// they ran.
TEST_F(AgentLifecycleTest, InPlaceWorkersThatFinishTheJobWhileJoiningSucceed) {
  control_.declare_in_place = true;
  ExpectJoins({Assigned(MakeAssignment(1, 0)),
               ::ddprun::testing::FakeRendezvous::Parked()});
  rdzv_.heartbeat = InRound(1, RoundOver());
  control_.exit_when = [this](const FakeWorker&) -> std::optional<ExitStatus> {
    absl::MutexLock lock(&rdzv_.mu);
    if (rdzv_.join_requests.size() >= 2) return ExitStatus::Exited(0);
    return std::nullopt;
  };

  EXPECT_EQ(RunAgent(), 0);

  EXPECT_THAT(rdzv_.reports, IsEmpty());
  EXPECT_THAT(rdzv_.join_requests, SizeIs(2));
  ASSERT_THAT(control_.workers, SizeIs(kNproc));  // nobody started again
  for (const FakeWorker& w : control_.workers) {
    EXPECT_THAT(w.signals, IsEmpty());
    EXPECT_THAT(ControlLines(w), IsEmpty());  // no next round was told
  }
  ASSERT_THAT(rdzv_.leaves, SizeIs(1));
  EXPECT_EQ(rdzv_.leaves[0].reason(), v1::LeaveRequest::REASON_SUCCEEDED);
  EXPECT_EQ(rdzv_.leaves[0].round(), 1);
}

// A hung worker is killed and replaced in place; its exit comes while the
// agent joins the next round, and the Join's check of the workers reaps it
// (asked before the Join, or when the kill's SIGCHLD wakes it). That exit is
// the old process's: the replacement, started after, runs on and nothing else
// is reported (the fault harness found it counted against the replacement, a
// new round each time).
TEST_F(AgentLifecycleTest,
       AHungWorkersExitReapedWhileJoiningIsNotItsReplacements) {
  for (int i = 1; i < common::kNumPhases; ++i) {
    options_.hang_bounds.fixed[i] = absl::Seconds(30);
  }
  control_.declare_in_place = true;
  control_.progress_at_start = true;
  ExpectJoins({Assigned(MakeAssignment(1, 0)), Assigned(MakeAssignment(2, 1))});
  control_.exit_when =
      [this](const FakeWorker& w) -> std::optional<ExitStatus> {
    if (!control_.Round(2).empty()) return ExitStatus::Exited(0);
    // Local rank 0 steps at every look; local rank 1 goes silent.
    if (w.local_rank == 0) {
      EXPECT_EQ(write(w.progress_fd, "step\n", 5), 5);
    }
    return std::nullopt;
  };

  EXPECT_EQ(RunAgent(), 0);

  ASSERT_THAT(rdzv_.reports, SizeIs(1));
  ASSERT_THAT(rdzv_.reports[0].failures(), SizeIs(1));
  EXPECT_EQ(rdzv_.reports[0].failures(0).failure_cause(),
            v1::FAILURE_CAUSE_HUNG);
  EXPECT_EQ(rdzv_.reports[0].failures(0).rank(), 1);
  EXPECT_THAT(rdzv_.join_requests, SizeIs(2));
  ASSERT_THAT(control_.workers, SizeIs(3));  // one replacement only
  EXPECT_THAT(control_.workers[0].signals, IsEmpty());
  EXPECT_THAT(control_.workers[1].signals, ElementsAre(SIGKILL));
  EXPECT_EQ(control_.workers[2].round, 2);
  ASSERT_THAT(rdzv_.leaves, SizeIs(1));
  EXPECT_EQ(rdzv_.leaves[0].round(), 2);
}

// A replacement still loading its program when another node ends its round
// has not declared in-place recovery yet, but its program has (its
// predecessor did): the agent keeps it and its survivor, and tells both the
// next round, instead of stopping the node's workers and starting them
// afresh (the fault harness: a hang at a round change cost two cold starts).
// It is still starting in that round, so its start's bound applies, not the
// join's, which a cold start outlasts.
TEST_F(AgentLifecycleTest, AReplacementStillStartingIsKeptWhenTheRoundEnds) {
  options_.hang_bounds.fixed[static_cast<int>(common::Phase::kJoin)] =
      absl::Seconds(2);
  control_.declare_in_place = true;
  control_.declare_up_to_round = 1;
  ExpectJoins({Assigned(MakeAssignment(1, 0)), Assigned(MakeAssignment(2, 1)),
               Assigned(MakeAssignment(3, 2))});
  rdzv_.heartbeat = InRound(2, RoundOver());
  std::optional<absl::Time> told_round_3;
  control_.exit_when = [&](const FakeWorker& w) -> std::optional<ExitStatus> {
    if (w.round == 1 && w.local_rank == 1) return ExitStatus::Signaled(SIGKILL);
    const std::vector<std::string> lines = ControlLines(w);
    if (lines.empty() ||
        lines.back().find("\"DDPRUN_ROUND\":\"3\"") == std::string::npos) {
      return std::nullopt;
    }
    // Round 3 runs 10 s (the replacement silent in its start), then ends.
    if (!told_round_3) told_round_3 = clock_.Now();
    if (clock_.Now() - *told_round_3 < absl::Seconds(10)) return std::nullopt;
    return ExitStatus::Exited(0);
  };

  EXPECT_EQ(RunAgent(), 0);

  ASSERT_THAT(rdzv_.reports, SizeIs(1));     // round 1's kill, nothing more
  ASSERT_THAT(control_.workers, SizeIs(3));  // nobody started afresh
  const FakeWorker& survivor = control_.workers[0];
  const FakeWorker& replacement = control_.workers[2];
  EXPECT_EQ(replacement.round, 2);
  EXPECT_THAT(survivor.signals, IsEmpty());
  EXPECT_THAT(replacement.signals, IsEmpty());
  EXPECT_THAT(ControlLines(survivor), SizeIs(2));     // rounds 2 and 3
  EXPECT_THAT(ControlLines(replacement), SizeIs(1));  // round 3
  ASSERT_THAT(rdzv_.leaves, SizeIs(1));
  EXPECT_EQ(rdzv_.leaves[0].round(), 3);
}

TEST_F(AgentLifecycleTest, WorkersThatDoNotDeclareAreAllRestarted) {
  // The default fake declares nothing (a Python script): torchrun's way.
  ExpectJoins({Assigned(MakeAssignment(1, 0)), Assigned(MakeAssignment(2, 1))});
  control_.exit_when = [](const FakeWorker& w) -> std::optional<ExitStatus> {
    if (w.round == 1 && w.local_rank == 1) return ExitStatus::Exited(1);
    if (w.round == 2) return ExitStatus::Exited(0);
    return std::nullopt;
  };

  EXPECT_EQ(RunAgent(), 0);

  EXPECT_THAT(control_.Round(1)[0]->signals, ElementsAre(SIGTERM));
  EXPECT_THAT(control_.Round(2), SizeIs(kNproc));
  EXPECT_THAT(ControlLines(control_.workers[0]), IsEmpty());
}

}  // namespace
}  // namespace ddprun::launcher

namespace ddprun::launcher {
namespace {

// The rendezvous server restarted (kill -9, started again): it answers
// NOT_FOUND for the job until a node resumes the round with its record.
class ServerRestartTest : public AgentLifecycleTest {
 protected:
  void RestartServerAfterHeartbeats(int healthy) {
    rdzv_.heartbeat = [this, healthy](
                          const v1::HeartbeatRequest&,
                          int call) -> absl::StatusOr<v1::HeartbeatResponse> {
      if (call < healthy || rdzv_.resume_count() > 0) return Running();
      return absl::NotFoundError("no job 'job' on this server");
    };
  }
};

TEST_F(ServerRestartTest, TheRoundGoesOnAndNoWorkerRestarts) {
  ExpectJoins({Assigned(MakeAssignment(4, 2))});
  RestartServerAfterHeartbeats(3);
  rdzv_.resume = [](const v1::JoinRequest& request) {
    v1::ResumeResponse r;
    *r.mutable_assignment() = request.record().assignment();
    return absl::StatusOr<v1::ResumeResponse>(r);
  };
  // The workers finish a while after the server took the round back.
  control_.exit_when = [this](const FakeWorker&) -> std::optional<ExitStatus> {
    if (rdzv_.resume_count() > 0 && rdzv_.heartbeat_count() >= 8) {
      return ExitStatus::Exited(0);
    }
    return std::nullopt;
  };

  EXPECT_EQ(RunAgent(), 0);

  EXPECT_THAT(control_.workers, SizeIs(kNproc)) << "no worker restarted";
  for (const FakeWorker& w : control_.workers)
    EXPECT_THAT(w.signals, IsEmpty());
  EXPECT_THAT(rdzv_.join_requests, SizeIs(1));
  ASSERT_GE(rdzv_.resume_requests.size(), 1u);
  const v1::JoinRequest& resume = rdzv_.resume_requests[0];
  EXPECT_EQ(resume.node_id(), "node-a");
  EXPECT_EQ(resume.record().assignment().round(), 4);
  EXPECT_EQ(resume.record().restart_count(), 2);
  EXPECT_FALSE(resume.record().failed());
  EXPECT_EQ(resume.config().max_restarts(), 3) << "the job's config too";
  ASSERT_THAT(rdzv_.leaves, SizeIs(1));
  EXPECT_EQ(rdzv_.leaves[0].round(), 4);
}

TEST_F(ServerRestartTest, ARoundTheServerCannotTakeBackRejoinsWithTheRecord) {
  ExpectJoins({Assigned(MakeAssignment(4, 2)), Assigned(MakeAssignment(5, 2))});
  RestartServerAfterHeartbeats(2);
  rdzv_.resume = [](const v1::JoinRequest&) {
    v1::ResumeResponse r;
    r.set_rejoin("job 'job' is in round 5");
    return absl::StatusOr<v1::ResumeResponse>(r);
  };
  control_.exit_when = SucceedInRound(5);

  EXPECT_EQ(RunAgent(), 0);

  ExpectStoppedWith(4, SIGTERM);
  ASSERT_THAT(rdzv_.join_requests, SizeIs(2));
  EXPECT_FALSE(rdzv_.join_requests[0].has_record()) << "no round before";
  const v1::RoundRecord& record = rdzv_.join_requests[1].record();
  EXPECT_EQ(record.assignment().round(), 4);
  EXPECT_EQ(record.restart_count(), 2);
  EXPECT_THAT(rdzv_.reports, IsEmpty()) << "not a failure of this node";
}

TEST_F(ServerRestartTest, AServerWithoutResumeEndsTheRound) {
  ExpectJoins({Assigned(MakeAssignment(4, 2)), Assigned(MakeAssignment(5, 2))});
  RestartServerAfterHeartbeats(2);  // rdzv_.resume unset: UNIMPLEMENTED
  control_.exit_when = SucceedInRound(5);

  EXPECT_EQ(RunAgent(), 0);

  ExpectStoppedWith(4, SIGTERM);
  EXPECT_THAT(rdzv_.join_requests, SizeIs(2));
}

TEST_F(ServerRestartTest, TheRecordCarriesTheCountAndAnUnheardFailure) {
  ExpectJoins({Assigned(MakeAssignment(1, 0)), Assigned(MakeAssignment(2, 1)),
               Assigned(MakeAssignment(3, 2))});
  // Round 1 fails and is reported (restart count 1 in the answer); round 2
  // fails while the server is down.
  control_.exit_when =
      [this](const FakeWorker& w) -> std::optional<ExitStatus> {
    if (w.round == 3) return ExitStatus::Exited(0);
    if (w.local_rank != 0) return std::nullopt;
    if (w.round == 2) rdzv_.report_error = absl::UnavailableError("down");
    return ExitStatus::Exited(1);
  };

  EXPECT_EQ(RunAgent(), 0);

  ASSERT_THAT(rdzv_.join_requests, SizeIs(3));
  const v1::RoundRecord& after1 = rdzv_.join_requests[1].record();
  EXPECT_EQ(after1.assignment().round(), 1);
  EXPECT_EQ(after1.restart_count(), 1) << "from ReportFailure's answer";
  EXPECT_FALSE(after1.failed());
  const v1::RoundRecord& after2 = rdzv_.join_requests[2].record();
  EXPECT_EQ(after2.assignment().round(), 2);
  EXPECT_TRUE(after2.failed()) << "no server counted round 2's failure";
}

// The workers all succeed while the server is down: the Leave fails. A
// restarted server would rebuild the round from the other nodes' records
// and wait for this one; so the agent tells it again, after a Resume with
// its record (the server then knows the node and its round), until it
// answers.
TEST_F(ServerRestartTest, ASuccessWhileTheServerIsDownIsToldOnceItIsBack) {
  ExpectJoins({Assigned(MakeAssignment(4, 2))});
  control_.exit_when = [](const FakeWorker&) { return ExitStatus::Exited(0); };
  rdzv_.leave_errors.push_back(absl::UnavailableError("server down"));
  rdzv_.resume = [this](const v1::JoinRequest& request)
      -> absl::StatusOr<v1::ResumeResponse> {
    if (rdzv_.resume_count() == 1) return absl::UnavailableError("still down");
    v1::ResumeResponse r;
    *r.mutable_assignment() = request.record().assignment();
    return r;
  };

  EXPECT_EQ(RunAgent(), 0);

  ASSERT_THAT(rdzv_.leaves, SizeIs(2));
  EXPECT_EQ(rdzv_.leaves[1].reason(), v1::LeaveRequest::REASON_SUCCEEDED);
  EXPECT_EQ(rdzv_.leaves[1].round(), 4);
  EXPECT_THAT(rdzv_.resumes_at_leave, ElementsAre(0, 2))
      << "the answered Leave follows an answered Resume";
  ASSERT_THAT(rdzv_.resume_requests, SizeIs(2));
  EXPECT_EQ(rdzv_.resume_requests[1].record().assignment().round(), 4);
  EXPECT_EQ(rdzv_.resume_requests[1].node_id(), "node-a");
}

// The server restarted within one heartbeat interval: it answers, but has
// not relearned the job yet (NOT_FOUND). The agent re-registers at once
// (Resume with its record) and leaves again, without waiting for a
// heartbeat, so the new server records that this node's workers succeeded.
TEST_F(ServerRestartTest, ASuccessToAServerThatLostTheJobResumesAndLeaves) {
  ExpectJoins({Assigned(MakeAssignment(4, 2))});
  control_.exit_when = [](const FakeWorker&) { return ExitStatus::Exited(0); };
  rdzv_.leave_errors.push_back(absl::NotFoundError("no job 'job' here"));
  rdzv_.resume = [](const v1::JoinRequest& request) {
    v1::ResumeResponse r;
    *r.mutable_assignment() = request.record().assignment();
    return absl::StatusOr<v1::ResumeResponse>(r);
  };
  std::vector<absl::Time> leave_times;
  rdzv_.on_leave = [&] { leave_times.push_back(clock_.Now()); };

  EXPECT_EQ(RunAgent(), 0);

  ASSERT_THAT(rdzv_.leaves, SizeIs(2));
  EXPECT_EQ(rdzv_.leaves[1].reason(), v1::LeaveRequest::REASON_SUCCEEDED);
  EXPECT_EQ(rdzv_.leaves[1].round(), 4);
  EXPECT_THAT(rdzv_.resumes_at_leave, ElementsAre(0, 1))
      << "one Resume between the NOT_FOUND and the answered Leave";
  ASSERT_THAT(rdzv_.resume_requests, SizeIs(1));
  const v1::JoinRequest& resume = rdzv_.resume_requests[0];
  EXPECT_EQ(resume.node_id(), "node-a");
  EXPECT_EQ(resume.record().assignment().round(), 4);
  EXPECT_EQ(resume.record().restart_count(), 2);
  ASSERT_THAT(leave_times, SizeIs(2));
  EXPECT_EQ(leave_times[1], leave_times[0]) << "no wait for a heartbeat";
}

// A stopping agent's Leave (SIGTERM) to such a server: re-registers and
// leaves again too, so no round the new server rebuilds waits for the node.
TEST_F(ServerRestartTest, AShutdownLeaveToAServerThatLostTheJobIsSentAgain) {
  ExpectJoins({Assigned(MakeAssignment(4, 2))});
  control_.exit_when = [this](const FakeWorker&) -> std::optional<ExitStatus> {
    events_.PostSignal(SIGTERM);
    return std::nullopt;
  };
  rdzv_.leave_errors.push_back(absl::NotFoundError("no job 'job' here"));
  rdzv_.resume = [](const v1::JoinRequest& request) {
    v1::ResumeResponse r;
    *r.mutable_assignment() = request.record().assignment();
    return absl::StatusOr<v1::ResumeResponse>(r);
  };

  EXPECT_EQ(RunAgent(), 128 + SIGTERM);

  ASSERT_THAT(rdzv_.leaves, SizeIs(2));
  for (const v1::LeaveRequest& leave : rdzv_.leaves) {
    EXPECT_EQ(leave.reason(), v1::LeaveRequest::REASON_SHUTDOWN);
    EXPECT_EQ(leave.round(), 4);
  }
  EXPECT_THAT(rdzv_.resumes_at_leave, ElementsAre(0, 1));
}

// Any other failure of a Leave (the server is down) is not a reason to
// Resume at once: a shutdown Leave is sent once.
TEST_F(ServerRestartTest, AShutdownLeaveToAServerThatIsDownIsSentOnce) {
  ExpectJoins({Assigned(MakeAssignment(4, 2))});
  control_.exit_when = [this](const FakeWorker&) -> std::optional<ExitStatus> {
    events_.PostSignal(SIGTERM);
    return std::nullopt;
  };
  rdzv_.leave_errors.push_back(absl::UnavailableError("server down"));

  EXPECT_EQ(RunAgent(), 128 + SIGTERM);

  EXPECT_THAT(rdzv_.leaves, SizeIs(1));
  EXPECT_EQ(rdzv_.resume_count(), 0);
}

// A server that never comes back: the agent gives up after close_timeout
// and still exits 0 (its workers succeeded).
TEST_F(ServerRestartTest, ASuccessTheServerNeverHearsEndsInBoundedTime) {
  ExpectJoins({Assigned(MakeAssignment(4, 2))});
  control_.exit_when = [](const FakeWorker&) { return ExitStatus::Exited(0); };
  for (int i = 0; i < 1000; ++i) {
    rdzv_.leave_errors.push_back(absl::UnavailableError("server down"));
  }
  rdzv_.resume =
      [](const v1::JoinRequest&) -> absl::StatusOr<v1::ResumeResponse> {
    return absl::UnavailableError("server down");
  };
  const absl::Time start = clock_.Now();

  EXPECT_EQ(RunAgent(), 0);

  EXPECT_THAT(rdzv_.leaves, SizeIs(1)) << "no Leave while Resume fails";
  EXPECT_GE(rdzv_.resume_count(), 2);
  // --rdzv-conf close_timeout bounds it (torchrun's 60 s), plus the last
  // heartbeat interval's wait and the round itself (its output's last copy
  // waits up to a second).
  EXPECT_LE(clock_.Now() - start, options_.rdzv_conf.close_timeout +
                                      options_.rdzv_conf.heartbeat_interval +
                                      absl::Seconds(1));
}

}  // namespace
}  // namespace ddprun::launcher
