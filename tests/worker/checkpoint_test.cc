// Checkpoints: atomic, failures keep the previous file, newest wins, and
// Python's torch.load reads what ddprun-mnist wrote.
#include "worker/checkpoint.h"

#include <signal.h>
#include <sys/resource.h>

#include <fstream>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "absl/strings/ascii.h"
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
  absl::Status status = WriteFileAtomically(dir.File("ckpt"), std::string(1 << 20, 'x'));
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
  EXPECT_TRUE(absl::StrContains(status.message(), "--checkpoint-dir")) << status;
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
    ASSERT_TRUE(SaveCheckpoint(dir.path(), c, /*keep=*/2).ok());
  }
  EXPECT_EQ(CountFiles(dir.path()), 2);
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
  EXPECT_DOUBLE_EQ(c.lr, 0.5);
  EXPECT_TRUE(c.model.at("1.weight").equal(at::full({3, 2}, 30.0f)));
}

TEST(CheckpointTest, NoFolderMeansFreshStart) {
  TempDir dir;
  auto none = LoadNewestCheckpoint(dir.File("absent"));
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->has_value());
}

TEST(CheckpointTest, PythonTorchLoadGivesTheSameTestAccuracy) {
  TempDir dir;
  auto run = RunCommand(
      {BinaryPath("mnist/ddprun-mnist"), "--data-dir", MnistDir(), "--epochs",
       "1", "--train-limit", "4096", "--save", dir.File("model.pt"),
       "--checkpoint-dir", dir.File("ckpt"), "--summary-json",
       dir.File("summary.json")},
      absl::Seconds(120));
  ASSERT_TRUE(run.exit.ok()) << run.err;
  const char* script = R"(
import glob, json, sys
import numpy as np, torch
ckpt = torch.load(sorted(glob.glob(sys.argv[1] + '/ckpt-*.pt'))[-1])
assert ckpt['epoch'] == 1 and ckpt['epoch_position'] == 0, ckpt
assert ckpt['optimizer']['param_groups'][0]['lr'] == 0.01
model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(784, 128),
                            torch.nn.ReLU(), torch.nn.Linear(128, 10))
model.load_state_dict(ckpt['model'])
raw = open(sys.argv[2] + '/t10k-images-idx3-ubyte', 'rb').read()[16:]
x = torch.from_numpy(np.frombuffer(raw, dtype=np.uint8).copy()).float()
x = (x.view(-1, 1, 28, 28) / 255.0 - 0.1307) / 0.3081
y = torch.from_numpy(np.frombuffer(open(sys.argv[2] + '/t10k-labels-idx1-ubyte', 'rb').read()[8:], dtype=np.uint8).copy()).long()
with torch.no_grad():
    acc = (model(x).argmax(1) == y).float().mean().item()
cpp = json.load(open(sys.argv[3]))['test_accuracy']
print(acc, cpp)
assert abs(acc - cpp) <= 1e-4, (acc, cpp)
assert acc > 0.8, acc
)";
  auto python = RunCommand({"/usr/bin/python3", "-c", script, dir.File("ckpt"),
                            MnistDir(), dir.File("summary.json")},
                           absl::Seconds(120));
  EXPECT_TRUE(python.exit.ok()) << python.out << python.err;
}

}  // namespace
}  // namespace ddprun::worker
