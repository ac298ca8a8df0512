// The agent's shared-memory folder: created with its lock, removed when the
// agent ends, and removed by the next agent when the owner died.
#include "launcher/posix/shm_dir.h"

#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include "tests/testing/temp_dir.h"

namespace ddprun::launcher {
namespace {

using ::ddprun::testing::TempDir;

TEST(ShmDirTest, LivesAsLongAsTheObject) {
  TempDir parent;
  std::string path;
  {
    auto dir = ShmDir::Create(parent.path());
    ASSERT_TRUE(dir.ok()) << dir.status();
    path = (*dir)->path();
    EXPECT_EQ(std::filesystem::path(path).parent_path(), parent.path());
    EXPECT_TRUE(std::filesystem::is_directory(path));
    EXPECT_TRUE(std::filesystem::exists(path + "/" + kShmDirLockFile));
    std::ofstream(path + "/cached.f32") << "data";
  }
  EXPECT_FALSE(std::filesystem::exists(path));
}

TEST(ShmDirTest, AFolderWhoseAgentDiedIsRemovedAndALiveOneKept) {
  TempDir parent;
  auto live = ShmDir::Create(parent.path());
  ASSERT_TRUE(live.ok()) << live.status();
  // An agent killed with -9: it made its folder and never removed it.
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    auto dead = ShmDir::Create(parent.path());
    if (!dead.ok()) _exit(1);
    std::ofstream(parent.path() + "/dead_path") << (*dead)->path();
    _exit(0);  // no destructor: as after SIGKILL
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  std::string dead_path;
  std::ifstream(parent.path() + "/dead_path") >> dead_path;
  ASSERT_TRUE(std::filesystem::is_directory(dead_path));
  // Something else's folder of a similar name, without a lock file.
  std::filesystem::create_directory(parent.File("ddprun-other"));

  EXPECT_EQ(RemoveAbandonedShmDirs(parent.path()), 1);
  EXPECT_FALSE(std::filesystem::exists(dead_path));
  EXPECT_TRUE(std::filesystem::is_directory((*live)->path()));
  EXPECT_TRUE(std::filesystem::is_directory(parent.File("ddprun-other")));
}

TEST(ShmDirTest, AnUnwritableParentIsAClearError) {
  auto dir = ShmDir::Create("/nonexistent/shm");
  ASSERT_FALSE(dir.ok());
  EXPECT_NE(dir.status().message().find("/nonexistent/shm"), std::string::npos)
      << dir.status();
}

}  // namespace
}  // namespace ddprun::launcher
