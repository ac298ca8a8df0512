// ddprun-mnist's flags become the options it trains with; a bad value ends
// the program with the usage code.
#include "mnist/mnist_flags.h"

#include <gtest/gtest.h>

#include <vector>

namespace ddprun::worker {
namespace {

MnistCommandLine Parse(std::vector<const char*> args) {
  args.insert(args.begin(), "ddprun-mnist");
  return ParseMnistFlags(static_cast<int>(args.size()), args.data());
}

TEST(MnistFlagsTest, FlagsFillTheTrainOptions) {
  MnistCommandLine command = Parse({"--epochs",
                                    "3",
                                    "--data-dir",
                                    "/data",
                                    "--dataset",
                                    "fashion-mnist",
                                    "--model",
                                    "cnn",
                                    "--hidden",
                                    "256",
                                    "--seed",
                                    "7",
                                    "--batch-size",
                                    "64",
                                    "--lr",
                                    "0.5",
                                    "--accumulate",
                                    "2",
                                    "--max-steps",
                                    "100",
                                    "--train-limit",
                                    "1000",
                                    "--test-limit",
                                    "500",
                                    "--save",
                                    "",
                                    "--checkpoint-dir",
                                    "/ckpt",
                                    "--checkpoint-every",
                                    "10",
                                    "--summary-json",
                                    "/s.json",
                                    "--step-times",
                                    "/t",
                                    "--backend",
                                    "gloo",
                                    "--bucket-mb",
                                    "1.5",
                                    "--no-in-place",
                                    "--no-progress",
                                    "--gradient-sync",
                                    "process-group",
                                    "--test-die-in-sync",
                                    "source:/x",
                                    "--test-stop-in-sync",
                                    "receiver:/y",
                                    "--test-block-in-sync",
                                    "source:/z",
                                    "--log-level",
                                    "debug"});
  ASSERT_FALSE(command.exit_code.has_value());
  const MnistTrainOptions& o = command.train;
  EXPECT_EQ(o.epochs, 3);
  EXPECT_EQ(o.data_dir, "/data");
  EXPECT_EQ(o.dataset, "fashion-mnist");
  EXPECT_EQ(o.model, "cnn");
  EXPECT_EQ(o.hidden, 256);
  EXPECT_EQ(o.seed, 7u);
  EXPECT_EQ(o.batch_size, 64);
  EXPECT_EQ(o.lr, 0.5);
  EXPECT_EQ(o.accumulate, 2);
  EXPECT_EQ(o.max_steps, 100);
  EXPECT_EQ(o.train_limit, 1000);
  EXPECT_EQ(o.test_limit, 500);
  EXPECT_EQ(o.save_path, "");
  EXPECT_EQ(o.checkpoint_dir, "/ckpt");
  EXPECT_EQ(o.checkpoint_every, 10);
  EXPECT_EQ(o.summary_json, "/s.json");
  EXPECT_EQ(o.step_times, "/t");
  EXPECT_EQ(o.backend, "gloo");
  EXPECT_EQ(o.bucket_mb, 1.5);
  EXPECT_FALSE(o.in_place);
  EXPECT_FALSE(o.progress);
  EXPECT_EQ(o.gradient_sync, "process-group");
  EXPECT_EQ(o.test_die_in_sync, "source:/x");
  EXPECT_EQ(o.test_stop_in_sync, "receiver:/y");
  EXPECT_EQ(o.test_block_in_sync, "source:/z");
  EXPECT_EQ(command.logging.level, "debug");
  EXPECT_EQ(command.logging.name, "ddprun-mnist");
}

TEST(MnistFlagsTest, DefaultsAreTheOptionsDefaults) {
  MnistCommandLine command = Parse({});
  ASSERT_FALSE(command.exit_code.has_value());
  const MnistTrainOptions defaults;
  const MnistTrainOptions& o = command.train;
  EXPECT_EQ(o.epochs, defaults.epochs);
  EXPECT_EQ(o.data_dir, defaults.data_dir);
  EXPECT_EQ(o.batch_size, defaults.batch_size);
  EXPECT_EQ(o.lr, defaults.lr);
  EXPECT_EQ(o.save_path, defaults.save_path);
  EXPECT_EQ(o.gradient_sync, defaults.gradient_sync);
  EXPECT_TRUE(o.in_place);
  EXPECT_TRUE(o.progress);
  EXPECT_EQ(command.logging.level, "info");
  // Empty: DDPRUN_LOG_FORMAT, which the agent passes to its workers.
  EXPECT_EQ(command.logging.format, "");
}

TEST(MnistFlagsTest, ABadValueEndsWithTheUsageCode) {
  EXPECT_EQ(Parse({"--epochs", "many"}).exit_code, 2);
  EXPECT_EQ(Parse({"--gradient-sync", "ring"}).exit_code, 2);
  EXPECT_EQ(Parse({"--log-level", "loud"}).exit_code, 2);
  EXPECT_EQ(Parse({"--no-such-flag"}).exit_code, 2);
  EXPECT_EQ(Parse({"--version"}).exit_code, 0);
}

}  // namespace
}  // namespace ddprun::worker
