// common::UniqueFd closes what it owns exactly once, moves ownership, and
// MakePipe hands out both ends owned, with the flags asked for.
#include "common/unique_fd.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <utility>

namespace ddprun::common {
namespace {

bool IsOpen(int fd) { return fcntl(fd, F_GETFD) != -1; }

TEST(UniqueFdTest, ClosesWhatItOwnsWhenItGoes) {
  int raw = -1;
  {
    auto pipe = MakePipe();
    ASSERT_TRUE(pipe.ok()) << pipe.status();
    raw = pipe->read.get();
    EXPECT_TRUE(IsOpen(raw));
  }
  EXPECT_FALSE(IsOpen(raw));
}

TEST(UniqueFdTest, MovingHandsOverOwnership) {
  auto pipe = MakePipe();
  ASSERT_TRUE(pipe.ok()) << pipe.status();
  const int raw = pipe->write.get();
  UniqueFd moved = std::move(pipe->write);
  EXPECT_FALSE(pipe->write.valid());
  EXPECT_EQ(moved.get(), raw);
  UniqueFd assigned;
  assigned = std::move(moved);
  EXPECT_EQ(assigned.get(), raw);
  EXPECT_TRUE(IsOpen(raw));
  assigned.Reset();
  EXPECT_FALSE(assigned.valid());
  EXPECT_FALSE(IsOpen(raw));
}

TEST(UniqueFdTest, ReleaseGivesUpOwnership) {
  auto pipe = MakePipe();
  ASSERT_TRUE(pipe.ok()) << pipe.status();
  const int raw = pipe->read.Release();
  pipe->read.Reset();  // holds nothing: closes nothing
  EXPECT_TRUE(IsOpen(raw));
  close(raw);
}

TEST(UniqueFdTest, MakePipeSetsTheFlagsAskedFor) {
  auto cloexec = MakePipe(O_CLOEXEC);
  ASSERT_TRUE(cloexec.ok()) << cloexec.status();
  EXPECT_TRUE(fcntl(cloexec->read.get(), F_GETFD) & FD_CLOEXEC);
  EXPECT_TRUE(fcntl(cloexec->write.get(), F_GETFD) & FD_CLOEXEC);
  EXPECT_FALSE(fcntl(cloexec->read.get(), F_GETFL) & O_NONBLOCK);
  SetNonBlocking(cloexec->read.get());
  EXPECT_TRUE(fcntl(cloexec->read.get(), F_GETFL) & O_NONBLOCK);
  char byte;
  EXPECT_EQ(read(cloexec->read.get(), &byte, 1), -1);  // empty: EAGAIN
  ASSERT_EQ(write(cloexec->write.get(), "x", 1), 1);
  EXPECT_EQ(read(cloexec->read.get(), &byte, 1), 1);
  EXPECT_EQ(byte, 'x');
}

}  // namespace
}  // namespace ddprun::common
