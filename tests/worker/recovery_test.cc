// worker/recovery.h's Membership against a real pipe, as the agent writes
// it (one JSON environment per line on DDPRUN_CONTROL_FD): the new round
// arrives, aborts the collective in flight, and comes back as a WorkerEnv.
#include "worker/recovery.h"

#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <stdexcept>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"
#include "tests/testing/wait_for.h"
#include "worker/collective_abort.h"

namespace ddprun::worker {
namespace {

// A pipe whose ends close with the test.
struct Pipe {
  Pipe() { EXPECT_EQ(pipe2(fds, O_CLOEXEC), 0); }
  ~Pipe() {
    CloseWrite();
    if (fds[0] >= 0) close(fds[0]);
  }
  void CloseWrite() {
    if (fds[1] >= 0) close(fds[1]);
    fds[1] = -1;
  }
  void Write(const std::string& s) {
    ASSERT_EQ(write(fds[1], s.data(), s.size()),
              static_cast<ssize_t>(s.size()));
  }
  int fds[2] = {-1, -1};
};

WorkerEnv UnderDdprun(int control_fd, int progress_fd) {
  WorkerEnv env;
  env.control_fd = control_fd;
  env.progress_fd = progress_fd;
  return env;
}

TEST(MembershipTest, WithoutAControlChannelNothingEverChanges) {
  auto m = Membership::Start(WorkerEnv{});
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_FALSE((*m)->enabled());
  EXPECT_FALSE((*m)->changed());
  absl::StatusOr<WorkerEnv> next =
      (*m)->NextRound(absl::UnavailableError("peer gone"));
  EXPECT_EQ(next.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(next.status().message().find("peer gone"), std::string::npos);
}

TEST(MembershipTest, DeclaresInPlaceAndDeliversTheNextRound) {
  Pipe control, progress;
  auto m = Membership::Start(UnderDdprun(control.fds[0], progress.fds[1]));
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_TRUE((*m)->enabled());
  // The agent's progress reader looks for this line.
  char buffer[16] = {};
  ASSERT_EQ(read(progress.fds[0], buffer, sizeof(buffer)), 8);
  EXPECT_EQ(std::string(buffer, 8), "inplace\n");

  EXPECT_FALSE((*m)->changed());
  ClearCollectiveAbort();
  control.Write(
      "{\"RANK\":\"2\",\"WORLD_SIZE\":\"3\",\"LOCAL_RANK\":\"0\","
      "\"LOCAL_WORLD_SIZE\":\"1\",\"DDPRUN_ROUND\":\"7\","
      "\"DDPRUN_STORE_ENDPOINT\":\"127.0.0.1:1\"}\n");
  ASSERT_TRUE(
      testing::WaitFor([&] { return (*m)->changed(); }, absl::Seconds(30)));
  // The shared-memory allreduce's waits end at once.
  EXPECT_TRUE(CollectiveAbortRequested());
  absl::StatusOr<WorkerEnv> next = (*m)->NextRound(absl::OkStatus());
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(next->rank, 2);
  EXPECT_EQ(next->world_size, 3);
  EXPECT_EQ(next->round, 7);
  EXPECT_FALSE((*m)->changed());
  EXPECT_FALSE(CollectiveAbortRequested());
}

TEST(MembershipTest, OnlyTheNewestOfSeveralRoundsCounts) {
  Pipe control;
  auto m = Membership::Start(UnderDdprun(control.fds[0], -1));
  ASSERT_TRUE(m.ok()) << m.status();
  control.Write("{\"DDPRUN_ROUND\":\"3\"}\n{\"DDPRUN_ROUND\":\"4\"}\n");
  ASSERT_TRUE(
      testing::WaitFor([&] { return (*m)->changed(); }, absl::Seconds(30)));
  // Both lines were written at once; give the watcher the second too.
  absl::StatusOr<WorkerEnv> next;
  ASSERT_TRUE(testing::WaitFor(
      [&] {
        next = (*m)->NextRound(absl::OkStatus());
        return next.ok() && next->round == 4;
      },
      absl::Seconds(30)))
      << next.status();
}

TEST(MembershipTest, NoRoundWithinTheTimeoutReturnsTheCause) {
  Pipe control;
  MembershipOptions options;
  options.round_timeout = std::chrono::milliseconds(50);
  auto m = Membership::Start(UnderDdprun(control.fds[0], -1), options);
  ASSERT_TRUE(m.ok()) << m.status();
  absl::StatusOr<WorkerEnv> next =
      (*m)->NextRound(absl::InternalError("allreduce failed"));
  EXPECT_EQ(next.status().code(), absl::StatusCode::kInternal);
  EXPECT_NE(next.status().message().find("allreduce failed"),
            std::string::npos);
  EXPECT_NE(next.status().message().find("no next round"), std::string::npos);
}

TEST(MembershipTest, TheAgentClosingTheChannelEndsTheWait) {
  Pipe control;
  auto m = Membership::Start(UnderDdprun(control.fds[0], -1));
  ASSERT_TRUE(m.ok()) << m.status();
  control.CloseWrite();
  absl::StatusOr<WorkerEnv> next = (*m)->NextRound(absl::OkStatus());
  EXPECT_FALSE(next.ok());
  EXPECT_NE(next.status().message().find("DDPRUN_CONTROL_FD"),
            std::string::npos)
      << next.status();
}

TEST(MembershipTest, AMalformedRoundIsAClearError) {
  Pipe control;
  auto m = Membership::Start(UnderDdprun(control.fds[0], -1));
  ASSERT_TRUE(m.ok()) << m.status();
  control.Write("{\"RANK\": 3\n");
  absl::StatusOr<WorkerEnv> next = (*m)->NextRound(absl::OkStatus());
  EXPECT_EQ(next.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(next.status().message().find("not a JSON object of strings"),
            std::string::npos)
      << next.status();
}

// A round that ends while it forms (a member lost before the group exists)
// is followed by the next one: JoinNextRound waits for it and joins that.
TEST(MembershipTest, ARoundThatEndsWhileItFormsIsFollowedByTheNext) {
  Pipe control;
  auto m = Membership::Start(UnderDdprun(control.fds[0], -1));
  ASSERT_TRUE(m.ok()) << m.status();
  control.Write("{\"DDPRUN_ROUND\":\"3\"}\n");
  std::vector<int64_t> tried;
  absl::StatusOr<WorkerEnv> joined = (*m)->JoinNextRound(
      absl::UnavailableError("peer gone"), [&](const WorkerEnv& env) {
        tried.push_back(env.round);
        if (env.round == 3) {
          // The agent's next round comes while this one fails to form.
          control.Write("{\"DDPRUN_ROUND\":\"4\"}\n");
          return absl::FailedPreconditionError("round 3 is over");
        }
        return absl::OkStatus();
      });
  ASSERT_TRUE(joined.ok()) << joined.status();
  EXPECT_EQ(joined->round, 4);
  EXPECT_EQ(tried, (std::vector<int64_t>{3, 4}));
}

// A collective's exception while joining counts as a lost member too; an
// error of another kind (a malformed state) ends the recovery at once.
TEST(MembershipTest, JoinNextRoundRetriesExceptionsNotOtherErrors) {
  Pipe control;
  auto m = Membership::Start(UnderDdprun(control.fds[0], -1));
  ASSERT_TRUE(m.ok()) << m.status();
  control.Write("{\"DDPRUN_ROUND\":\"5\"}\n");
  int calls = 0;
  absl::StatusOr<WorkerEnv> joined = (*m)->JoinNextRound(
      absl::OkStatus(), [&](const WorkerEnv&) -> absl::Status {
        if (++calls == 1) {
          control.Write("{\"DDPRUN_ROUND\":\"6\"}\n");
          throw std::runtime_error("Connection reset by peer");
        }
        return absl::InternalError("malformed state record");
      });
  EXPECT_EQ(calls, 2);
  EXPECT_EQ(joined.status().code(), absl::StatusCode::kInternal)
      << joined.status();
}

// A replacement's first round can end while its group forms (another fault
// meanwhile): it waits for the next round, as survivors do, instead of
// failing (ddprun would replace it again, one more round for the job).
TEST(MembershipTest, AFirstRoundThatEndsWhileItFormsIsFollowedByTheNext) {
  Pipe control;
  auto m = Membership::Start(UnderDdprun(control.fds[0], -1));
  ASSERT_TRUE(m.ok()) << m.status();
  WorkerEnv first;
  first.round = 2;
  std::vector<int64_t> tried;
  absl::StatusOr<WorkerEnv> joined =
      (*m)->JoinFirstRound(first, [&](const WorkerEnv& env) {
        tried.push_back(env.round);
        if (env.round == 2) {
          control.Write("{\"DDPRUN_ROUND\":\"3\"}\n");
          return absl::FailedPreconditionError("round 2 is over");
        }
        return absl::OkStatus();
      });
  ASSERT_TRUE(joined.ok()) << joined.status();
  EXPECT_EQ(joined->round, 3);
  EXPECT_EQ(tried, (std::vector<int64_t>{2, 3}));
}

// The first round joined: its own environment back, no wait. Without a
// control channel (torchrun, --no-in-place) a failure is the program's, at
// once; so is an error that is not a round's end.
TEST(MembershipTest, AFirstRoundFailsAtOnceWithoutInPlaceRecovery) {
  WorkerEnv first;
  first.round = 7;
  auto m = Membership::Start(WorkerEnv{});
  ASSERT_TRUE(m.ok()) << m.status();
  absl::StatusOr<WorkerEnv> joined = (*m)->JoinFirstRound(
      first, [](const WorkerEnv&) { return absl::OkStatus(); });
  ASSERT_TRUE(joined.ok()) << joined.status();
  EXPECT_EQ(joined->round, 7);
  int calls = 0;
  joined = (*m)->JoinFirstRound(first, [&](const WorkerEnv&) {
    ++calls;
    return absl::UnavailableError("peer gone");
  });
  EXPECT_EQ(joined.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(calls, 1);

  Pipe control;
  auto in_place = Membership::Start(UnderDdprun(control.fds[0], -1));
  ASSERT_TRUE(in_place.ok()) << in_place.status();
  joined = (*in_place)->JoinFirstRound(first, [](const WorkerEnv&) {
    return absl::InvalidArgumentError("no such backend");
  });
  EXPECT_EQ(joined.status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace ddprun::worker
