// The agent's shared-memory folder: created with its lock, removed when the
// agent ends, and removed by the next agent when the owner died; never
// another user's folder, never through a symbolic link.
#include "launcher/posix/shm_dir.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <thread>
#include <vector>

#include "tests/testing/ci.h"
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

// Agents that start together each clean up abandoned folders while the
// others create theirs: none may take another's new folder for abandoned.
TEST(ShmDirTest, AgentsStartingTogetherKeepEachOthersFolders) {
  TempDir parent;
  constexpr int kAgents = 8;
  constexpr int kRounds = 500;
  for (int round = 0; round < kRounds; ++round) {
    std::vector<std::unique_ptr<ShmDir>> dirs(kAgents);
    std::vector<std::thread> agents;
    for (int i = 0; i < kAgents; ++i) {
      agents.emplace_back([&dirs, &parent, i] {
        absl::StatusOr<std::unique_ptr<ShmDir>> made =
            ShmDir::Create(parent.path());
        if (made.ok()) dirs[i] = std::move(*made);
      });
    }
    for (std::thread& t : agents) t.join();
    for (int i = 0; i < kAgents; ++i) {
      ASSERT_NE(dirs[i], nullptr) << "round " << round << ", agent " << i;
      ASSERT_TRUE(std::filesystem::exists(
          std::filesystem::path(dirs[i]->path()) / kShmDirLockFile))
          << dirs[i]->path() << " was removed under its agent (round " << round
          << ")";
    }
  }
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

// A folder as a dead agent leaves it: its lock file, unlocked, and data.
void MakeAbandoned(const std::string& dir) {
  std::filesystem::create_directory(dir);
  std::ofstream(dir + "/" + kShmDirLockFile) << "";
  std::ofstream(dir + "/cached.f32") << "data";
}

TEST(ShmDirTest, ALinkAtTheNameIsNeverFollowed) {
  TempDir parent;
  // Someone else's folder that looks abandoned, and a link to it planted
  // where an agent's folder would be.
  TempDir victim;
  MakeAbandoned(victim.File("precious"));
  std::filesystem::create_directory_symlink(victim.File("precious"),
                                            parent.File("ddprun-planted"));
  // A real abandoned folder next to it is still removed: the pass ran.
  MakeAbandoned(parent.File("ddprun-dead"));

  EXPECT_EQ(RemoveAbandonedShmDirs(parent.path()), 1);
  EXPECT_FALSE(std::filesystem::exists(parent.File("ddprun-dead")));
  EXPECT_TRUE(std::filesystem::is_symlink(parent.File("ddprun-planted")));
  EXPECT_TRUE(std::filesystem::exists(victim.File("precious/cached.f32")));
  EXPECT_TRUE(
      std::filesystem::exists(victim.File("precious/") + kShmDirLockFile));
}

TEST(ShmDirTest, LinksInsideAnAbandonedFolderAreRemovedNotFollowed) {
  TempDir parent;
  TempDir victim;
  std::ofstream(victim.File("keep")) << "not the agent's";
  std::filesystem::create_directory(victim.File("tree"));
  std::ofstream(victim.File("tree/keep")) << "not the agent's";
  MakeAbandoned(parent.File("ddprun-dead"));
  std::filesystem::create_directory(parent.File("ddprun-dead/sub"));
  std::filesystem::create_directory_symlink(
      victim.path(), parent.File("ddprun-dead/sub/link"));
  std::filesystem::create_symlink(victim.File("keep"),
                                  parent.File("ddprun-dead/file-link"));

  EXPECT_EQ(RemoveAbandonedShmDirs(parent.path()), 1);
  EXPECT_FALSE(std::filesystem::exists(parent.File("ddprun-dead")));
  EXPECT_TRUE(std::filesystem::exists(victim.File("keep")));
  EXPECT_TRUE(std::filesystem::exists(victim.File("tree/keep")));
}

TEST(ShmDirTest, ALockFileThatIsALinkIsNotOurs) {
  TempDir parent;
  TempDir victim;
  std::ofstream(victim.File("lock")) << "";
  std::filesystem::create_directory(parent.File("ddprun-odd"));
  std::filesystem::create_symlink(victim.File("lock"),
                                  parent.File("ddprun-odd/") + kShmDirLockFile);

  EXPECT_EQ(RemoveAbandonedShmDirs(parent.path()), 0);
  EXPECT_TRUE(std::filesystem::is_directory(parent.File("ddprun-odd")));
  EXPECT_TRUE(std::filesystem::exists(victim.File("lock")));
}

TEST(ShmDirTest, AnotherUsersFolderIsLeftAlone) {
  // Needs root to give a folder to another user (the tests run as root).
  if (geteuid() != 0) {
    DDPRUN_SKIP_UNLESS_CI("chown to another uid needs root");
  }
  TempDir parent;
  const uid_t other = 54321;
  std::string theirs = parent.File("ddprun-theirs");
  MakeAbandoned(theirs);
  for (const char* file : {"", "/agent.lock", "/cached.f32"}) {
    ASSERT_EQ(lchown((theirs + file).c_str(), other, other), 0)
        << theirs + file;
  }
  // Ours, abandoned too, beside it: removed.
  MakeAbandoned(parent.File("ddprun-ours"));
  // Ours, with another user's lock file in it: not an agent's of ours.
  MakeAbandoned(parent.File("ddprun-mixed"));
  ASSERT_EQ(
      lchown(parent.File("ddprun-mixed/agent.lock").c_str(), other, other), 0);

  EXPECT_EQ(RemoveAbandonedShmDirs(parent.path()), 1);
  EXPECT_FALSE(std::filesystem::exists(parent.File("ddprun-ours")));
  EXPECT_TRUE(std::filesystem::exists(theirs + "/cached.f32"));
  EXPECT_TRUE(std::filesystem::exists(parent.File("ddprun-mixed/cached.f32")));
}

TEST(ShmDirTest, AnUnwritableParentIsAClearError) {
  auto dir = ShmDir::Create("/nonexistent/shm");
  ASSERT_FALSE(dir.ok());
  EXPECT_NE(dir.status().message().find("/nonexistent/shm"), std::string::npos)
      << dir.status();
}

}  // namespace
}  // namespace ddprun::launcher
