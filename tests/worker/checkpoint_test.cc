// Checkpoints: atomic, durable (a failed fsync is an error), modes from the
// umask, failures keep the previous file, newest wins, old files still
// load, and Python's torch.load reads what ddprun-mnist wrote, with
// weights_only=True too.
#include "worker/checkpoint.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <torch/csrc/jit/serialization/pickle.h>
#include <unistd.h>

#include <cerrno>
#include <fstream>
#include <set>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/temp_dir.h"
#include "worker/atomic_file.h"

namespace ddprun::worker {
namespace {

using ::ddprun::testing::BinaryPath;
using ::ddprun::testing::MnistDir;
using ::ddprun::testing::ReadFileOrEmpty;
using ::ddprun::testing::RunCommand;
using ::ddprun::testing::TempDir;

int CountFiles(const std::string& dir) {
  auto result = RunCommand({"/bin/sh", "-c", "ls -A \"$0\" | wc -l", dir},
                           absl::Seconds(10));
  int n = -1;
  EXPECT_TRUE(absl::SimpleAtoi(absl::StripAsciiWhitespace(result.out), &n));
  return n;
}

TEST(AtomicFileTest, ReplacesWholeAndLeavesNoTemporary) {
  TempDir dir;
  ASSERT_TRUE(WriteFileAtomically(dir.File("f"), "first").ok());
  ASSERT_TRUE(WriteFileAtomically(dir.File("f"), "second").ok());
  EXPECT_EQ(ReadFileOrEmpty(dir.File("f")), "second");
  EXPECT_EQ(CountFiles(dir.path()), 1);
}

TEST(AtomicFileTest, FailedWriteKeepsThePreviousFile) {
  TempDir dir;
  ASSERT_TRUE(WriteFileAtomically(dir.File("ckpt"), "good old").ok());
  // A file-size limit makes write() fail part-way, as a full disk does.
  struct rlimit old_limit;
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &old_limit), 0);
  auto old_handler = signal(SIGXFSZ, SIG_IGN);
  struct rlimit small = old_limit;
  small.rlim_cur = 4096;
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &small), 0);
  absl::Status status =
      WriteFileAtomically(dir.File("ckpt"), std::string(1 << 20, 'x'));
  setrlimit(RLIMIT_FSIZE, &old_limit);
  signal(SIGXFSZ, old_handler);
  ASSERT_FALSE(status.ok());
  EXPECT_TRUE(absl::StrContains(status.message(), dir.File("ckpt"))) << status;
  EXPECT_TRUE(absl::StrContains(status.message(), "intact")) << status;
  EXPECT_EQ(ReadFileOrEmpty(dir.File("ckpt")), "good old");
  EXPECT_EQ(CountFiles(dir.path()), 1) << "the temporary was left behind";
}

TEST(AtomicFileTest, UnwritableFolderIsAClearError) {
  TempDir dir;
  // A regular file where the folder should be: unwritable even for root.
  std::ofstream(dir.File("not-a-dir")) << "x";
  TrainingCheckpoint c;
  c.model["w"] = at::ones({2});
  absl::Status status = SaveCheckpoint(dir.File("not-a-dir/sub"), c);
  ASSERT_FALSE(status.ok());
  EXPECT_TRUE(absl::StrContains(status.message(), "not-a-dir")) << status;
  EXPECT_TRUE(
      absl::StrContains(status.message(), "a folder this process can write"))
      << status;
  // libddp's errors name its own API, not a program's flags.
  EXPECT_FALSE(absl::StrContains(status.message(), "--")) << status;
}

// A fake fsync: records which file or folder each call synced (from
// /proc/self/fd), fails call number `fail_call` (1-based; 0: none) with EIO,
// and syncs for real otherwise.
struct RecordingSync {
  int fail_call = 0;
  int calls = 0;
  std::vector<std::string> synced;

  SyncOptions Options() {
    return {[this](int fd) {
      char target[4096];
      ssize_t n = readlink(absl::StrCat("/proc/self/fd/", fd).c_str(), target,
                           sizeof(target) - 1);
      synced.emplace_back(target, n > 0 ? n : 0);
      if (++calls == fail_call) {
        errno = EIO;
        return -1;
      }
      return fsync(fd);
    }};
  }
};

TEST(AtomicFileTest, AFailedFsyncOfTheFileIsAnErrorAndKeepsThePrevious) {
  TempDir dir;
  ASSERT_TRUE(WriteFileAtomically(dir.File("ckpt"), "good old").ok());
  RecordingSync sync{.fail_call = 1};
  absl::Status status =
      WriteFileAtomically(dir.File("ckpt"), "new", sync.Options());
  ASSERT_FALSE(status.ok());
  EXPECT_TRUE(absl::StrContains(status.message(), "fsync")) << status;
  EXPECT_TRUE(absl::StrContains(status.message(), dir.File("ckpt"))) << status;
  EXPECT_TRUE(absl::StrContains(status.message(), "intact")) << status;
  EXPECT_EQ(ReadFileOrEmpty(dir.File("ckpt")), "good old");
  EXPECT_EQ(CountFiles(dir.path()), 1) << "the temporary was left behind";
}

TEST(AtomicFileTest, AFailedFsyncOfTheFolderIsAnError) {
  TempDir dir;
  RecordingSync sync{.fail_call = 2};  // 1: the file, 2: its folder
  absl::Status status =
      WriteFileAtomically(dir.File("ckpt"), "new", sync.Options());
  ASSERT_FALSE(status.ok());
  ASSERT_EQ(sync.synced.size(), 2u);
  EXPECT_EQ(sync.synced[1], dir.path());
  EXPECT_TRUE(absl::StrContains(status.message(), "sync the folder")) << status;
  EXPECT_TRUE(absl::StrContains(status.message(), dir.path())) << status;
}

TEST(AtomicFileTest, ANewCheckpointFolderIsSyncedInItsParent) {
  TempDir dir;
  TrainingCheckpoint c;
  c.model["w"] = at::ones({2});
  RecordingSync sync;
  ASSERT_TRUE(SaveCheckpoint(dir.File("new/sub"), c, 2, sync.Options()).ok());
  std::set<std::string> synced(sync.synced.begin(), sync.synced.end());
  // Each created folder's entry, in its parent; the file's, in its folder.
  EXPECT_TRUE(synced.count(dir.path())) << "parent of new/ not synced";
  EXPECT_TRUE(synced.count(dir.File("new"))) << "parent of sub/ not synced";
  EXPECT_TRUE(synced.count(dir.File("new/sub"))) << "the file's folder";

  // The same folder again: nothing new to sync but the file's folder.
  RecordingSync again;
  c.step = 1;
  ASSERT_TRUE(SaveCheckpoint(dir.File("new/sub"), c, 2, again.Options()).ok());
  EXPECT_EQ(std::set<std::string>(again.synced.begin(), again.synced.end())
                .count(dir.File("new")),
            0u);

  // A failed sync of a new folder's parent is an error naming the folder.
  RecordingSync failing{.fail_call = 1};
  absl::Status status =
      SaveCheckpoint(dir.File("other"), c, 2, failing.Options());
  ASSERT_FALSE(status.ok());
  ASSERT_FALSE(failing.synced.empty());
  EXPECT_EQ(failing.synced[0], dir.path());
  EXPECT_TRUE(absl::StrContains(status.message(), dir.File("other"))) << status;
}

mode_t ModeOf(const std::string& path) {
  struct stat st {};
  EXPECT_EQ(stat(path.c_str(), &st), 0) << path;
  return st.st_mode & 07777;
}

TEST(AtomicFileTest, FilesAndFoldersFollowTheUmask) {
  TempDir dir;
  TrainingCheckpoint c;
  c.model["w"] = at::ones({2});
  for (mode_t mask : {mode_t{027}, mode_t{077}, mode_t{002}}) {
    const std::string folder = dir.File(absl::StrCat("umask", mask));
    mode_t old = umask(mask);
    absl::Status saved = SaveCheckpoint(folder, c);
    absl::Status model = SaveStateDict(folder + "/model.pt", c.model);
    umask(old);
    ASSERT_TRUE(saved.ok()) << saved;
    ASSERT_TRUE(model.ok()) << model;
    EXPECT_EQ(ModeOf(folder), 0777 & ~mask) << "umask " << mask;
    EXPECT_EQ(ModeOf(folder + "/ckpt-0000000000.pt"), 0666 & ~mask)
        << "umask " << mask;
    EXPECT_EQ(ModeOf(folder + "/model.pt"), 0666 & ~mask) << "umask " << mask;
  }
}

TEST(CheckpointTest, NewestReadableWinsAndOldOnesArePruned) {
  TempDir dir;
  for (int64_t step : {10, 20, 30}) {
    TrainingCheckpoint c;
    c.model["1.weight"] = at::full({3, 2}, static_cast<float>(step));
    c.lr = 0.5;
    c.epoch = step / 10;
    c.epoch_position = step * 64;
    c.step = step;
    c.seed = 9;
    c.world_size = 2;
    c.epoch_samples = {12000, 12000, step * 64};
    ASSERT_TRUE(SaveCheckpoint(dir.path(), c, /*keep=*/2).ok());
  }
  EXPECT_EQ(CountFiles(dir.path()), 2);
  // No global that torch.load's weights_only refuses.
  EXPECT_FALSE(absl::StrContains(
      ReadFileOrEmpty(dir.File("ckpt-0000000030.pt")), "restore_type_tag"));
  // A newer file that does not read is skipped.
  std::ofstream(dir.File("ckpt-0000000040.pt")) << "garbage";
  auto newest = LoadNewestCheckpoint(dir.path());
  ASSERT_TRUE(newest.ok()) << newest.status();
  ASSERT_TRUE(newest->has_value());
  const TrainingCheckpoint& c = **newest;
  EXPECT_EQ(c.step, 30);
  EXPECT_EQ(c.epoch, 3);
  EXPECT_EQ(c.epoch_position, 30 * 64);
  EXPECT_EQ(c.seed, 9u);
  EXPECT_EQ(c.world_size, 2);
  EXPECT_EQ(c.epoch_samples, (std::vector<int64_t>{12000, 12000, 30 * 64}));
  EXPECT_DOUBLE_EQ(c.lr, 0.5);
  EXPECT_TRUE(c.model.at("1.weight").equal(at::full({3, 2}, 30.0f)));
}

// What ddprun-mnist wrote before its checkpoints loaded under weights_only:
// LibTorch's pickle_save, dicts and lists with type tags, lr a float.
TEST(CheckpointTest, CheckpointsOfTheEarlierFormatStillLoad) {
  TempDir dir;
  auto dict = [] {
    return c10::impl::GenericDict(c10::StringType::get(), c10::AnyType::get());
  };
  c10::impl::GenericDict model = dict();
  model.insert("1.weight", at::full({3, 2}, 7.0f));
  c10::impl::GenericDict group = dict();
  group.insert("lr", 0.25);
  c10::impl::GenericList groups(c10::AnyType::get());
  groups.push_back(group);
  c10::impl::GenericDict optimizer = dict();
  optimizer.insert("state", dict());
  optimizer.insert("param_groups", groups);
  c10::impl::GenericDict old = dict();
  old.insert("model", model);
  old.insert("optimizer", optimizer);
  old.insert("epoch", int64_t{2});
  old.insert("epoch_position", int64_t{640});
  old.insert("step", int64_t{70});
  old.insert("seed", int64_t{3});
  old.insert("world_size", int64_t{2});
  std::vector<char> bytes = torch::jit::pickle_save(c10::IValue(old));
  ASSERT_NE(std::string(bytes.begin(), bytes.end()).find("restore_type_tag"),
            std::string::npos)
      << "not the earlier, tagged format";
  std::ofstream(dir.File("ckpt-0000000070.pt"), std::ios::binary)
      .write(bytes.data(), static_cast<std::streamsize>(bytes.size()));

  auto loaded = LoadNewestCheckpoint(dir.path());
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ASSERT_TRUE(loaded->has_value());
  const TrainingCheckpoint& c = **loaded;
  EXPECT_EQ(c.step, 70);
  EXPECT_EQ(c.epoch, 2);
  EXPECT_EQ(c.epoch_position, 640);
  EXPECT_EQ(c.world_size, 2);
  EXPECT_TRUE(c.epoch_samples.empty()) << "not recorded then";
  EXPECT_DOUBLE_EQ(c.lr, 0.25);
  EXPECT_TRUE(c.model.at("1.weight").equal(at::full({3, 2}, 7.0f)));
}

TEST(CheckpointTest, NoFolderMeansFreshStart) {
  TempDir dir;
  auto none = LoadNewestCheckpoint(dir.File("absent"));
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->has_value());
}

TEST(CheckpointTest, PythonTorchLoadGivesTheSameTestAccuracy) {
  TempDir dir;
  auto run =
      RunCommand({BinaryPath("mnist/ddprun-mnist"), "--data-dir", MnistDir(),
                  "--epochs", "1", "--train-limit", "4096", "--save",
                  dir.File("model.pt"), "--checkpoint-dir", dir.File("ckpt"),
                  "--summary-json", dir.File("summary.json")},
                 absl::Seconds(120));
  ASSERT_TRUE(run.exit.ok()) << run.err;
  // torch.load(path) as a user writes it, and with weights_only=True: the
  // default from PyTorch 2.6, and what Debian 12's 1.13 checks strictest
  // (it knows no float, no type tag).
  const char* script = R"(
import glob, json, sys
import numpy as np, torch
raw = open(sys.argv[2] + '/t10k-images-idx3-ubyte', 'rb').read()[16:]
x = torch.from_numpy(np.frombuffer(raw, dtype=np.uint8).copy()).float()
x = (x.view(-1, 1, 28, 28) / 255.0 - 0.1307) / 0.3081
y = torch.from_numpy(np.frombuffer(open(sys.argv[2] + '/t10k-labels-idx1-ubyte', 'rb').read()[8:], dtype=np.uint8).copy()).long()
cpp = json.load(open(sys.argv[3]))['test_accuracy']
def accuracy(state):
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(784, 128),
                                torch.nn.ReLU(), torch.nn.Linear(128, 10))
    model.load_state_dict(state)
    with torch.no_grad():
        return (model(x).argmax(1) == y).float().mean().item()
newest = sorted(glob.glob(sys.argv[1] + '/ckpt-*.pt'))[-1]
for kwargs in ({}, {'weights_only': True}):
    ckpt = torch.load(newest, **kwargs)
    assert ckpt['epoch'] == 1 and ckpt['epoch_position'] == 0, ckpt
    assert float(ckpt['optimizer']['param_groups'][0]['lr']) == 0.01, ckpt
    for state in (ckpt['model'], torch.load(sys.argv[4], **kwargs)):
        acc = accuracy(state)
        print(kwargs, acc, cpp)
        assert abs(acc - cpp) <= 1e-4, (acc, cpp)
        assert acc > 0.8, acc
)";
  auto python =
      RunCommand({"/usr/bin/python3", "-c", script, dir.File("ckpt"),
                  MnistDir(), dir.File("summary.json"), dir.File("model.pt")},
                 absl::Seconds(120));
  EXPECT_TRUE(python.exit.ok()) << python.out << python.err;
}

}  // namespace
}  // namespace ddprun::worker
