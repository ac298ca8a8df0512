// A missing or corrupt MNIST file ends ddprun-mnist quickly with one clear
// error line naming the file and the fix, and a non-zero exit.
#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "tests/testing/ci.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/temp_dir.h"

namespace ddprun::worker {
namespace {

using ::ddprun::testing::BinaryPath;
using ::ddprun::testing::MnistDir;
using ::ddprun::testing::ReadFileOrEmpty;
using ::ddprun::testing::RunCommand;
using ::ddprun::testing::TempDir;

const char* const kFiles[] = {
    "train-images-idx3-ubyte", "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"};

// A copy of the real data set that a test may break.
void CopyMnist(const TempDir& dir) {
  for (const char* name : kFiles) {
    std::ofstream(dir.File(name), std::ios::binary)
        << ReadFileOrEmpty(MnistDir() + "/" + name);
  }
}

std::vector<std::string> ErrorLines(const std::string& err) {
  std::vector<std::string> lines;
  for (absl::string_view line : absl::StrSplit(err, '\n', absl::SkipEmpty())) {
    if (absl::StrContains(line, "error")) lines.emplace_back(line);
  }
  return lines;
}

void ExpectOneClearError(const std::string& data_dir,
                         const std::string& names) {
  auto result = RunCommand({BinaryPath("mnist/ddprun-mnist"), "--data-dir",
                            data_dir, "--epochs", "1", "--save", ""},
                           absl::Seconds(60));
  ASSERT_FALSE(result.timed_out);
  EXPECT_NE(result.exit.exit_code, 0) << result.exit.ToString();
  std::vector<std::string> lines = ErrorLines(result.err);
  ASSERT_EQ(lines.size(), 1u) << result.err;
  EXPECT_TRUE(absl::StrContains(lines[0], names)) << lines[0];
  EXPECT_TRUE(absl::StrContains(lines[0], "scripts/setup.sh")) << lines[0];
  EXPECT_TRUE(absl::StrContains(lines[0], "--data-dir")) << lines[0];
}

TEST(MnistBadInputTest, MissingFolder) {
  TempDir dir;
  ExpectOneClearError(dir.File("nowhere"), dir.File("nowhere"));
}

TEST(MnistBadInputTest, MissingFile) {
  TempDir dir;
  CopyMnist(dir);
  std::remove(dir.File("t10k-labels-idx1-ubyte").c_str());
  ExpectOneClearError(dir.path(), dir.File("t10k-labels-idx1-ubyte"));
}

TEST(MnistBadInputTest, TruncatedFile) {
  TempDir dir;
  CopyMnist(dir);
  std::string images = ReadFileOrEmpty(dir.File("train-images-idx3-ubyte"));
  ASSERT_GT(images.size(), 1000u);
  std::ofstream(dir.File("train-images-idx3-ubyte"), std::ios::binary)
      << images.substr(0, images.size() - 1000);
  ExpectOneClearError(dir.path(), dir.File("train-images-idx3-ubyte"));
}

TEST(MnistBadInputTest, WrongMagicNumber) {
  TempDir dir;
  CopyMnist(dir);
  std::string labels = ReadFileOrEmpty(dir.File("train-labels-idx1-ubyte"));
  labels[3] = 0x03;  // 2049 → 2051, the images' magic
  std::ofstream(dir.File("train-labels-idx1-ubyte"), std::ios::binary)
      << labels;
  ExpectOneClearError(dir.path(), dir.File("train-labels-idx1-ubyte"));
}

// Found only by reading the whole file (on ddprun-mnist's loading thread,
// which overlaps the forming of the process group): still one clear line.
TEST(MnistBadInputTest, LabelThatIsNotADigit) {
  TempDir dir;
  CopyMnist(dir);
  std::string labels = ReadFileOrEmpty(dir.File("t10k-labels-idx1-ubyte"));
  labels[8 + 5000] = 42;
  std::ofstream(dir.File("t10k-labels-idx1-ubyte"), std::ios::binary) << labels;
  ExpectOneClearError(dir.path(), dir.File("t10k-labels-idx1-ubyte"));
}

TEST(MnistBadInputTest, ImageAndLabelCountsDiffer) {
  TempDir dir;
  CopyMnist(dir);
  // The test set's labels of the training set's count: each file is
  // consistent in itself.
  std::ofstream(dir.File("t10k-labels-idx1-ubyte"), std::ios::binary)
      << ReadFileOrEmpty(dir.File("train-labels-idx1-ubyte"));
  ExpectOneClearError(dir.path(), dir.File("t10k-labels-idx1-ubyte"));
}

// --hidden: one clear error naming the flag, the value and the range,
// before anything slow starts.
void ExpectHiddenRefused(const std::vector<std::string>& flags,
                         const std::string& value, const std::string& fix) {
  std::vector<std::string> argv = {BinaryPath("mnist/ddprun-mnist"),
                                   "--data-dir", MnistDir(), "--save", ""};
  argv.insert(argv.end(), flags.begin(), flags.end());
  auto result = RunCommand(argv, absl::Seconds(60));
  ASSERT_FALSE(result.timed_out);
  EXPECT_NE(result.exit.exit_code, 0) << result.exit.ToString();
  std::vector<std::string> lines = ErrorLines(result.err);
  ASSERT_EQ(lines.size(), 1u) << result.err;
  EXPECT_TRUE(absl::StrContains(lines[0], "--hidden " + value)) << lines[0];
  EXPECT_TRUE(absl::StrContains(lines[0], fix)) << lines[0];
  EXPECT_FALSE(absl::StrContains(result.err, "training")) << result.err;
}

TEST(MnistBadInputTest, HiddenOutOfRange) {
  ExpectHiddenRefused({"--hidden", "0"}, "0", "1 to 65536");
  ExpectHiddenRefused({"--hidden=-5"}, "-5", "1 to 65536");
  ExpectHiddenRefused({"--hidden", "65537"}, "65537", "1 to 65536");
}

TEST(MnistBadInputTest, HiddenWithTheCnn) {
  ExpectHiddenRefused({"--model", "cnn", "--hidden", "64"}, "64",
                      "--model mlp only");
}

}  // namespace
}  // namespace ddprun::worker

namespace ddprun::worker {
namespace {

TEST(MnistDatasetTest, FashionMnistFromDebiansGzippedFiles) {
  const std::string dir = "/usr/share/datasets/fashion-mnist";
  if (ReadFileOrEmpty(dir + "/t10k-labels-idx1-ubyte.gz").empty()) {
    DDPRUN_SKIP_UNLESS_CI(
        "dataset-fashion-mnist is not installed (scripts/setup.sh installs "
        "it)");
  }
  auto result = RunCommand(
      {BinaryPath("mnist/ddprun-mnist"), "--dataset", "fashion-mnist",
       "--epochs", "1", "--train-limit", "6400", "--save", "", "--no-progress"},
      absl::Seconds(120));
  ASSERT_TRUE(result.exit.ok()) << result.err;
  // 10 classes of clothes: far above chance (10%) after 200 steps.
  EXPECT_TRUE(absl::StrContains(result.err, "test accuracy")) << result.err;
  size_t at = result.err.find("test accuracy ");
  ASSERT_NE(at, std::string::npos);
  double accuracy = std::stod(result.err.substr(at + 14));
  EXPECT_GT(accuracy, 50.0) << result.err;
}

}  // namespace
}  // namespace ddprun::worker
