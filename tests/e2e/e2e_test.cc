// The whole path with real parts: ddprun spawns real ddprun-mnist workers that
// rendezvous through a real gRPC server, train with Gloo on real MNIST and
// report what they reached.
#include <signal.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "gtest/gtest.h"
#include "tests/e2e/summary_json.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/wait_for.h"

namespace ddprun::testing {
namespace {

// One epoch over this slice of MNIST with the seed's settings reaches well
// above this test accuracy; a broken gradient sync or sampler does not.
constexpr int kTrainSamples = 20000;
constexpr double kMinAccuracy = 0.85;

std::string Rendezvous() { return BinaryPath("rendezvous/ddprun-rendezvous"); }

std::vector<std::string> MnistArgs(const TempDir& dir) {
  return {Mnist(),
          "--epochs",
          "1",
          "--data-dir",
          MnistDir(),
          "--train-limit",
          std::to_string(kTrainSamples),
          "--summary-json",
          dir.File("summary.json"),
          "--save",
          dir.File("model.pt")};
}

void ExpectTrained(const TempDir& dir, int world_size) {
  std::string summary =
      ExpectTrainedSummary(dir.File("summary.json"), world_size, kMinAccuracy);
  if (summary.empty()) return;
  EXPECT_GT(SummaryNumber(summary, "samples_per_sec").value_or(0), 0)
      << summary;
  EXPECT_FALSE(ReadFileOrEmpty(dir.File("model.pt")).empty())
      << "rank 0 saved no model";
}

TEST(E2eTest, StandaloneTwoWorkersTrainMnist) {
  TempDir dir;
  RunResult run =
      RunCommand(Concat({Ddprun(), "--standalone", "--nproc-per-node", "2"},
                        MnistArgs(dir)),
                 absl::Minutes(5));
  ASSERT_FALSE(run.timed_out) << run.err;
  ASSERT_TRUE(run.exit.ok()) << run.exit.ToString() << "\n" << run.err;
  ExpectTrained(dir, 2);
}

TEST(E2eTest, MnistRunsAloneWithoutDdprun) {
  TempDir dir;
  RunResult run = RunCommand(MnistArgs(dir), absl::Minutes(5));
  ASSERT_TRUE(run.exit.ok()) << run.exit.ToString() << "\n" << run.err;
  ExpectTrained(dir, 1);
}

// ddprun-mnist --hidden 8192: an MLP of 6.5 M parameters, 26 MB of
// gradients per step (the seed's: 0.4 MB), trained for one epoch under
// ddprun at world 2 and 3 with the default gradient sync. The epoch is
// over the first kWideTrainSamples samples, to keep CI's time in bounds.
constexpr int kWideHidden = 8192;
constexpr int kWideTrainSamples = 6000;
constexpr double kWideMinAccuracy = 0.80;

class WideMlpTest : public ::testing::TestWithParam<int> {};

TEST_P(WideMlpTest, TrainsOneEpochUnderDdprun) {
  const int world = GetParam();
  TempDir dir;
  RunResult run = RunCommand(
      {Ddprun(), "--standalone", "--nproc-per-node", std::to_string(world),
       Mnist(), "--hidden", std::to_string(kWideHidden), "--epochs", "1",
       "--data-dir", MnistDir(), "--train-limit",
       std::to_string(kWideTrainSamples), "--summary-json",
       dir.File("summary.json"), "--save", "", "--no-progress"},
      absl::Minutes(8));
  ASSERT_FALSE(run.timed_out) << run.err;
  ASSERT_TRUE(run.exit.ok()) << run.exit.ToString() << "\n" << run.err;
  std::string summary =
      ExpectTrainedSummary(dir.File("summary.json"), world, kWideMinAccuracy);
  // nn.Linear(784, h) and nn.Linear(h, 10): weights and biases.
  EXPECT_EQ(SummaryNumber(summary, "parameters"),
            784.0 * kWideHidden + kWideHidden + kWideHidden * 10.0 + 10)
      << summary;
  EXPECT_EQ(SummaryNumber(summary, "epochs"), 1) << summary;
  EXPECT_EQ(SummaryNumber(summary, "steps"),
            (kWideTrainSamples / world + 31) / 32)
      << summary;
  // The default sync's fast path ran at every step: the gradients were
  // allocated in the node's shared memory and summed where they lay, none
  // copied. (One bucket: the weights of the first layer alone pass 25 MB.)
  EXPECT_TRUE(absl::StrContains(run.out + run.err, "1 gradient bucket(s)"))
      << run.out << run.err;
  EXPECT_EQ(SummaryNumber(summary, "allreduces_in_place"),
            SummaryNumber(summary, "steps"))
      << summary;
  EXPECT_EQ(SummaryNumber(summary, "allreduces_in_place_fallbacks"), 0)
      << summary;
}

INSTANTIATE_TEST_SUITE_P(Worlds, WideMlpTest, ::testing::Values(2, 3),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return absl::StrCat("World", info.param);
                         });

// An evaluation is no hang: ddprun-mnist evaluates the whole test set on
// rank 0 after each epoch while rank 1 waits in its next step; it reports
// Phase::kEval on both ranks, so a step bound far shorter than the
// evaluation (and far longer than a step) kills no one. Unreported, the
// default 10 s floor killed rank 0 of WideMlpTest when the machine was
// loaded. How long an evaluation takes against a step varies fivefold
// between LibTorch builds (9.3 s on Debian 12's 1.13, 1.9 s on Debian 13's
// 2.6, steps 0.05-0.12 s), so a first run, without a step bound, measures
// both from the steps' own timestamps, and the second runs with a bound
// between the two (their geometric mean).
struct EpochGaps {
  double longest_step = 0;  // seconds between consecutive steps of an epoch
  double evaluation = 0;    // between the first epoch's last step and the
                            // second's first (any rank: "STEP MICROS PID")
};

EpochGaps ReadEpochGaps(const std::string& step_times, int steps_per_epoch) {
  std::map<int, std::pair<int64_t, int64_t>> span;  // step: first, last
  for (absl::string_view line :
       absl::StrSplit(step_times, '\n', absl::SkipEmpty())) {
    std::vector<absl::string_view> f = absl::StrSplit(line, ' ');
    int step = 0;
    int64_t micros = 0;
    EXPECT_TRUE(f.size() == 3 && absl::SimpleAtoi(f[0], &step) &&
                absl::SimpleAtoi(f[1], &micros))
        << line;
    auto [it, added] = span.try_emplace(step, micros, micros);
    it->second.first = std::min(it->second.first, micros);
    it->second.second = std::max(it->second.second, micros);
  }
  EpochGaps gaps;
  for (auto it = span.begin(); it != span.end(); ++it) {
    auto next = std::next(it);
    if (next == span.end()) break;
    const double gap = (next->second.first - it->second.second) / 1e6;
    if (it->first == steps_per_epoch) {
      gaps.evaluation = gap;
    } else {
      gaps.longest_step = std::max(gaps.longest_step, gap);
    }
  }
  return gaps;
}

TEST(E2eTest, AnEvaluationLongerThanTheStepBoundIsNoHang) {
  constexpr int kStepsPerEpoch = 10;  // 640 samples, 2 ranks x 32
  auto run = [&](const TempDir& dir, const std::string& step_bound) {
    return RunCommand({Ddprun(),
                       "--standalone",
                       "--nproc-per-node",
                       "2",
                       "--hang-bound",
                       absl::StrCat("step=", step_bound),
                       Mnist(),
                       "--hidden",
                       "16384",
                       "--epochs",
                       "2",
                       "--data-dir",
                       MnistDir(),
                       "--train-limit",
                       "640",
                       "--summary-json",
                       dir.File("summary.json"),
                       "--step-times",
                       dir.File("steps.txt"),
                       "--save",
                       "",
                       "--no-progress"},
                      absl::Minutes(5));
  };
  TempDir measured;
  RunResult unbounded = run(measured, "0");  // 0: never hung in a step
  ASSERT_TRUE(unbounded.exit.ok()) << unbounded.err;
  const EpochGaps seen = ReadEpochGaps(
      ReadFileOrEmpty(measured.File("steps.txt")), kStepsPerEpoch);
  // The test means something only if a bound fits between the two.
  ASSERT_GT(seen.evaluation, 10 * seen.longest_step)
      << "evaluation " << seen.evaluation << " s, longest step "
      << seen.longest_step << " s";
  const double bound = std::sqrt(seen.evaluation * seen.longest_step);

  TempDir dir;
  RunResult bounded = run(dir, absl::StrFormat("%.3f", bound));
  ASSERT_FALSE(bounded.timed_out) << bounded.err;
  ASSERT_TRUE(bounded.exit.ok()) << "step bound " << bound << " s\n"
                                 << bounded.exit.ToString() << "\n"
                                 << bounded.err;
  EXPECT_FALSE(absl::StrContains(bounded.err, "is hung")) << bounded.err;
  EXPECT_EQ(SummaryNumber(ReadFileOrEmpty(dir.File("summary.json")), "steps"),
            2 * kStepsPerEpoch);
  // And in this run too, the evaluation outlasted the bound.
  EXPECT_GT(
      ReadEpochGaps(ReadFileOrEmpty(dir.File("steps.txt")), kStepsPerEpoch)
          .evaluation,
      bound)
      << "the evaluation took less than the step bound";
}

// ddprun-mnist --hidden 32768: 26 M parameters, a 104 MB gradient, at an
// odd world and at 8 ranks (on 2 cores). The default sync sums it in
// shared memory at every step, and trains as the process group does
// (--gradient-sync process-group; its sums' order differs, so within
// rounding). A few steps only:
// each takes a tenth of a second per rank here.
class HundredMegabyteModelTest : public ::testing::TestWithParam<int> {};

TEST_P(HundredMegabyteModelTest, SumsItsGradientInPlaceAsTheProcessGroupDoes) {
  const int world = GetParam();
  constexpr int kSteps = 5;
  std::map<std::string, std::string> summaries;
  for (const std::string mode : {"auto", "process-group"}) {
    SCOPED_TRACE(mode);
    TempDir dir;
    RunResult run = RunCommand({Ddprun(),
                                "--standalone",
                                "--nproc-per-node",
                                std::to_string(world),
                                Mnist(),
                                "--hidden",
                                "32768",
                                "--epochs",
                                "1",
                                "--max-steps",
                                std::to_string(kSteps),
                                "--data-dir",
                                MnistDir(),
                                "--train-limit",
                                "2048",
                                "--test-limit",
                                "100",
                                "--summary-json",
                                dir.File("summary.json"),
                                "--save",
                                "",
                                "--no-progress",
                                "--gradient-sync",
                                mode},
                               absl::Minutes(5));
    ASSERT_FALSE(run.timed_out) << run.err;
    ASSERT_TRUE(run.exit.ok()) << run.exit.ToString() << "\n" << run.err;
    summaries[mode] = ReadFileOrEmpty(dir.File("summary.json"));
    const std::string& summary = summaries[mode];
    EXPECT_EQ(SummaryNumber(summary, "parameters"),
              784.0 * 32768 + 32768 + 327680 + 10)
        << summary;
    EXPECT_EQ(SummaryNumber(summary, "steps"), kSteps) << summary;
    // One bucket (the first layer's weights alone pass 25 MB).
    EXPECT_EQ(SummaryNumber(summary, "allreduces_in_place"),
              mode == "auto" ? kSteps : 0)
        << summary;
    EXPECT_EQ(SummaryNumber(summary, "allreduces_in_place_fallbacks"), 0)
        << summary;
  }
  const std::optional<double> in_place =
      SummaryNumber(summaries["auto"], "final_loss");
  const std::optional<double> process_group =
      SummaryNumber(summaries["process-group"], "final_loss");
  ASSERT_TRUE(in_place.has_value() && process_group.has_value());
  EXPECT_NEAR(*in_place, *process_group, 1e-4);
}

INSTANTIATE_TEST_SUITE_P(Worlds, HundredMegabyteModelTest,
                         ::testing::Values(3, 8),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return absl::StrCat("World", info.param);
                         });

// Reads "ddprun-rendezvous listening on HOST:PORT" from the server's stdout.
std::string WaitForListeningLine(const std::string& stdout_path) {
  std::string endpoint;
  WaitFor(
      [&] {
        std::string out = ReadFileOrEmpty(stdout_path);
        for (absl::string_view line : absl::StrSplit(out, '\n')) {
          if (absl::ConsumePrefix(&line, "ddprun-rendezvous listening on ")) {
            endpoint = std::string(line);
            return true;
          }
        }
        return false;
      },
      absl::Seconds(30));
  return endpoint;
}

TEST(E2eTest, TwoAgentsTrainTogetherThroughOneRendezvous) {
  TempDir dir;
  SubprocessOptions server_options;
  server_options.argv = {Rendezvous(), "--port", "0"};
  server_options.stdout_path = dir.File("server.out");
  server_options.stderr_path = dir.File("server.err");
  auto server = Subprocess::Start(server_options);
  ASSERT_TRUE(server.ok()) << server.status();
  std::string endpoint = WaitForListeningLine(dir.File("server.out"));
  ASSERT_FALSE(endpoint.empty()) << ReadFileOrEmpty(dir.File("server.err"));

  std::vector<Subprocess> agents;
  for (int node = 0; node < 2; ++node) {
    TempDir* out_dir = &dir;
    SubprocessOptions options;
    options.argv =
        Concat({Ddprun(), "--nnodes", "2", "--nproc-per-node", "1",
                "--rdzv-endpoint", endpoint, "--rdzv-id", "e2e-two-agents"},
               // Only rank 0 writes the summary and the model; both agents get
               // the same arguments, as on a real cluster.
               MnistArgs(*out_dir));
    options.stdout_path = dir.File(absl::StrCat("agent", node, ".out"));
    options.stderr_path = dir.File(absl::StrCat("agent", node, ".err"));
    auto agent = Subprocess::Start(options);
    ASSERT_TRUE(agent.ok()) << agent.status();
    agents.push_back(std::move(*agent));
  }
  for (int node = 0; node < 2; ++node) {
    auto exit = agents[node].Wait(absl::Minutes(5));
    ASSERT_TRUE(exit.has_value()) << "agent " << node << " did not finish";
    EXPECT_TRUE(exit->ok())
        << "agent " << node << ": " << exit->ToString() << "\n"
        << ReadFileOrEmpty(dir.File(absl::StrCat("agent", node, ".err")));
  }
  ExpectTrained(dir, 2);
}

TEST(E2eTest, MissingMnistIsOneClearErrorThroughDdprun) {
  TempDir dir;
  RunResult run = RunCommand({Ddprun(), "--standalone", "--nproc-per-node", "2",
                              Mnist(), "--data-dir", dir.File("no-such-dir")},
                             absl::Minutes(2));
  ASSERT_FALSE(run.timed_out) << "a missing data set must not hang";
  EXPECT_FALSE(run.exit.ok());
  // The worker's own line names the folder it looked in.
  EXPECT_TRUE(absl::StrContains(run.out + run.err, dir.File("no-such-dir")))
      << run.out << run.err;
}

}  // namespace
}  // namespace ddprun::testing
