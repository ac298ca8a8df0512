// What the agent tells people: worker environment, error files, the summary.
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <iterator>
#include <set>
#include <string>

#include "gmock/gmock.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "launcher/agent/error_file.h"
#include "launcher/agent/failure_report.h"
#include "launcher/agent/failure_summary.h"
#include "launcher/agent/worker_env.h"
#include "launcher/cli/program_command.h"
#include "launcher/cli/worker_torch.h"
#include "tests/testing/temp_dir.h"

namespace ddprun::launcher {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(ErrorFileTest, ReadsTorchrunAndFlatJsonAndPlainText) {
  testing::TempDir dir;
  auto write = [&](const std::string& name, const std::string& text) {
    FILE* f = fopen(dir.File(name).c_str(), "w");
    fputs(text.c_str(), f);
    fclose(f);
    return dir.File(name);
  };
  EXPECT_EQ(ReadWorkerErrorMessage(write(
                "torchrun", R"({"message": {"message": "RuntimeError: boom",
                  "extraInfo": {"py_callstack": "Traceback (most recent call last):\n  File \"t.py\", line 3\nRuntimeError: boom\n", "timestamp": "1"}}})")),
            "RuntimeError: boom\ntraceback:\nTraceback (most recent call "
            "last):\n  File \"t.py\", line 3\nRuntimeError: boom");
  EXPECT_EQ(ReadWorkerErrorMessage(write("flat", R"({"message": "oops"})")),
            "oops");
  EXPECT_EQ(ReadWorkerErrorMessage(write("text", "segfault in step 3\n")),
            "segfault in step 3");
  EXPECT_EQ(ReadWorkerErrorMessage(dir.File("missing")), "");
}

TEST(FailureReportTest, CarriesRanksCausesAndMessages) {
  testing::TempDir dir;
  std::string error_file = dir.File("rank_5.error.json");
  FILE* f = fopen(error_file.c_str(), "w");
  fputs(R"({"message": {"message": "CUDA out of memory"}})", f);
  fclose(f);
  FailureReportContext context{"job", "node-a", "10.0.0.7", 3, 4};
  absl::Time t = absl::FromUnixMillis(1700000000000);
  std::vector<LocalFailure> failures = {
      {1, ExitStatus::Exited(2), v1::FAILURE_CAUSE_EXITED, t},
      {0, ExitStatus::Signaled(9), v1::FAILURE_CAUSE_SIGNALED,
       t + absl::Seconds(1)},
      {2, ExitStatus{}, v1::FAILURE_CAUSE_HUNG, t + absl::Seconds(2),
       common::Phase::kJoin, absl::Seconds(30)}};
  v1::ReportFailureRequest r = BuildFailureReport(
      context, failures, {dir.File("none"), error_file, dir.File("none")}, "",
      t);
  EXPECT_EQ(r.run_id(), "job");
  EXPECT_EQ(r.round(), 3);
  ASSERT_EQ(r.failures_size(), 3);
  EXPECT_EQ(r.failures(0).rank(), 5);
  EXPECT_EQ(r.failures(0).host(), "10.0.0.7");
  EXPECT_EQ(r.failures(0).exit_code(), 2);
  EXPECT_EQ(r.failures(0).message(), "CUDA out of memory");
  EXPECT_EQ(r.failures(0).time_unix_ms(), 1700000000000);
  EXPECT_EQ(r.failures(1).rank(), 4);
  EXPECT_EQ(r.failures(1).signal_name(), "SIGKILL");
  EXPECT_EQ(r.failures(1).exit_code(), -1);
  EXPECT_EQ(r.failures(1).message(), "the worker was killed by SIGKILL");
  EXPECT_EQ(r.failures(2).failure_cause(), v1::FAILURE_CAUSE_HUNG);
  EXPECT_EQ(r.failures(2).cause(), "hung") << "the word, for older servers";
  EXPECT_THAT(r.failures(2).message(),
              HasSubstr("no progress for 30s in phase join"));
  v1::ReportFailureRequest spawn =
      BuildFailureReport(context, {}, {}, "cannot run 'x'", t);
  ASSERT_EQ(spawn.failures_size(), 1);
  EXPECT_EQ(spawn.failures(0).failure_cause(), v1::FAILURE_CAUSE_SPAWN);
  EXPECT_EQ(spawn.failures(0).cause(), "spawn");
  EXPECT_EQ(spawn.failures(0).message(), "cannot run 'x'");
}

// The "message" object of the torchrun-format error file at `path`.
google::protobuf::Struct ErrorFileMessage(const std::string& path) {
  std::ifstream in(path);
  std::string text((std::istreambuf_iterator<char>(in)),
                   std::istreambuf_iterator<char>());
  google::protobuf::Struct file;
  EXPECT_TRUE(google::protobuf::util::JsonStringToMessage(text, &file).ok())
      << text;
  if (!file.fields().contains("message")) return {};
  return file.fields().at("message").struct_value();
}

// A hang's description gives whole milliseconds, not the clock's digits.
TEST(FailureReportTest, DescribesAHangInWholeMilliseconds) {
  LocalFailure stopped{0,
                       ExitStatus{},
                       v1::FAILURE_CAUSE_HUNG,
                       absl::UnixEpoch(),
                       common::Phase::kJoin,
                       absl::Microseconds(34196.73)};
  stopped.stopped = true;
  EXPECT_EQ(DescribeHang(stopped), "stopped (state T) for 34ms in phase join");
  stopped.silent = absl::Microseconds(400);
  EXPECT_EQ(DescribeHang(stopped), "stopped (state T) in phase join");
  LocalFailure silent{0,
                      ExitStatus{},
                      v1::FAILURE_CAUSE_HUNG,
                      absl::UnixEpoch(),
                      common::Phase::kStep,
                      absl::Milliseconds(2500.7)};
  EXPECT_THAT(DescribeHang(silent),
              HasSubstr("no progress for 2.5s in phase step"));
}

TEST(FailureSummaryTest, NamesTheRootCauseFirst) {
  v1::JobEnded ended;
  ended.set_state(v1::JOB_STATE_FAILED);
  v1::WorkerFailure* root = ended.add_failures();
  root->set_rank(3);
  root->set_local_rank(1);
  root->set_host("10.0.0.2");
  root->set_exit_code(-1);
  root->set_signal(11);
  root->set_signal_name("SIGSEGV");
  root->set_failure_cause(v1::FAILURE_CAUSE_SIGNALED);
  root->set_time_unix_ms(1700000000123);
  root->set_message("bad pointer");
  v1::WorkerFailure* other = ended.add_failures();
  other->set_rank(0);
  other->set_exit_code(1);
  other->set_cause("exited");
  std::string summary = FormatFailureSummary("job9", ended);
  EXPECT_THAT(summary, HasSubstr("job 'job9' failed"));
  size_t first = summary.find("first failure");
  size_t rank3 = summary.find("rank 3 (local rank 1) on 10.0.0.2");
  size_t rank0 = summary.find("rank 0");
  ASSERT_NE(rank3, std::string::npos) << summary;
  EXPECT_LT(first, rank3);
  EXPECT_LT(rank3, rank0);
  EXPECT_THAT(summary, HasSubstr("killed by SIGSEGV (signal 11)"));
  EXPECT_THAT(summary, HasSubstr("2023-11-14 22:13:20.123 UTC"));
  EXPECT_THAT(summary, HasSubstr("bad pointer"));
  EXPECT_THAT(summary, HasSubstr("exit code 1"));
}

// The server's message names the job too; the summary says it once.
TEST(FailureSummaryTest, NamesTheJobOnce) {
  v1::JobEnded ended;
  ended.set_message(
      "job 'j7' failed: 3 restarts used, max_restarts is 3; failures[0] is "
      "the root cause");
  std::string summary = FormatFailureSummary("j7", ended);
  EXPECT_THAT(summary, ::testing::StartsWith(
                           "ddprun: job 'j7' failed: 3 restarts used"));
  EXPECT_THAT(summary, ::testing::Not(HasSubstr("failed: job")));
}

// torchrun copies the root cause into the agent's own error file for the
// scheduler; ddprun writes the same format: @record's message and
// py_callstack, and the exit code as message.errorCode (-signal if killed).
TEST(FailureSummaryTest, RootCauseGoesToTheAgentsErrorFile) {
  testing::TempDir dir;
  v1::JobEnded ended;
  v1::WorkerFailure* root = ended.add_failures();
  root->set_rank(3);
  root->set_host("node-b");
  root->set_exit_code(1);
  root->set_message("RuntimeError: boom\ntraceback:\nTraceback ...");
  ended.add_failures()->set_message("later");
  WriteAgentErrorFile(dir.File("agent.json"), ended);
  EXPECT_EQ(ReadWorkerErrorMessage(dir.File("agent.json")),
            "RuntimeError: boom\ntraceback:\nTraceback ...");
  google::protobuf::Struct message = ErrorFileMessage(dir.File("agent.json"));
  EXPECT_EQ(message.fields().at("message").string_value(),
            "RuntimeError: boom");
  EXPECT_EQ(message.fields().at("errorCode").number_value(), 1);
  const auto& extra = message.fields().at("extraInfo").struct_value().fields();
  EXPECT_EQ(extra.at("py_callstack").string_value(), "Traceback ...");
  EXPECT_EQ(extra.at("rank").string_value(), "3");

  root->set_exit_code(-1);
  root->set_signal(9);
  root->set_message("the worker was killed by SIGKILL");
  WriteAgentErrorFile(dir.File("agent.json"), ended);
  message = ErrorFileMessage(dir.File("agent.json"));
  EXPECT_EQ(message.fields().at("errorCode").number_value(), -9);
  EXPECT_EQ(message.fields()
                .at("extraInfo")
                .struct_value()
                .fields()
                .count("py_callstack"),
            0u);
  WriteAgentErrorFile("", ended);  // no file asked for: nothing to do
}

// A signal that stops the agent: torchrun's @record writes its
// SignalException into the agent's error file; ddprun writes its words.
TEST(FailureSummaryTest, AStopSignalGoesToTheAgentsErrorFile) {
  testing::TempDir dir;
  WriteAgentSignalErrorFile(dir.File("agent.json"), 4242, 15,
                            absl::FromUnixSeconds(1700000000));
  const google::protobuf::Struct file =
      ErrorFileMessage(dir.File("agent.json"));
  const auto& message = file.fields();
  EXPECT_EQ(message.at("message").string_value(),
            "SignalException: Process 4242 got signal: 15");
  EXPECT_EQ(message.at("extraInfo")
                .struct_value()
                .fields()
                .at("timestamp")
                .string_value(),
            "1700000000");
  WriteAgentSignalErrorFile("", 4242, 15, absl::Now());  // none asked for
}

TEST(WorkerEnvTest, SetsTheContractOverTheAgentsEnvironment) {
  WorkerEnvSpec spec;
  spec.run_id = "r";
  spec.local_rank = 1;
  spec.local_world_size = 2;
  spec.rank = 5;
  spec.world_size = 6;
  spec.group_rank = 2;
  spec.group_world_size = 3;
  spec.master_addr = "10.0.0.1";
  spec.master_port = 4242;
  spec.restart_count = 1;
  spec.max_restarts = 3;
  spec.round = 7;
  spec.error_file = "/tmp/e.json";
  spec.store_endpoint = "10.0.0.9:1";
  spec.local_addr = "10.0.0.3";
  spec.progress_fd = 9;
  std::vector<std::string> env =
      BuildWorkerEnv(spec, {"PATH=/bin", "RANK=99", "DDPRUN_TOKEN_FILE=x"});
  std::set<std::string> set(env.begin(), env.end());
  for (const char* expected : {"PATH=/bin",
                               "RANK=5",
                               "LOCAL_RANK=1",
                               "GROUP_RANK=2",
                               "ROLE_RANK=5",
                               "LOCAL_WORLD_SIZE=2",
                               "WORLD_SIZE=6",
                               "GROUP_WORLD_SIZE=3",
                               "ROLE_WORLD_SIZE=6",
                               "ROLE_NAME=default",
                               "MASTER_ADDR=10.0.0.1",
                               "MASTER_PORT=4242",
                               "TORCHELASTIC_RESTART_COUNT=1",
                               "TORCHELASTIC_MAX_RESTARTS=3",
                               "TORCHELASTIC_RUN_ID=r",
                               "TORCHELASTIC_ERROR_FILE=/tmp/e.json",
                               "TORCHELASTIC_USE_AGENT_STORE=False",
                               "OMP_NUM_THREADS=1",
                               "DDPRUN_STORE_ENDPOINT=10.0.0.9:1",
                               "DDPRUN_STORE_RUN_ID=r",
                               "DDPRUN_ROUND=7",
                               "DDPRUN_LOCAL_ADDR=10.0.0.3",
                               "DDPRUN_PROGRESS_FD=9",
                               "NCCL_ASYNC_ERROR_HANDLING=1",
                               "TORCH_NCCL_ASYNC_ERROR_HANDLING=1",
                               "USE_LIBUV=0"}) {
    EXPECT_TRUE(set.count(expected)) << expected;
  }
  // Not ours to pass on when not given.
  for (const std::string& e : env)
    EXPECT_NE(e.rfind("DDPRUN_TOKEN_FILE", 0), 0u);
  // The user's own OMP_NUM_THREADS and USE_LIBUV win.
  env = BuildWorkerEnv(spec, {"OMP_NUM_THREADS=4", "USE_LIBUV=1"});
  EXPECT_TRUE(
      std::set<std::string>(env.begin(), env.end()).count("OMP_NUM_THREADS=4"));
  EXPECT_TRUE(
      std::set<std::string>(env.begin(), env.end()).count("USE_LIBUV=1"));
  // A single worker keeps all threads, as torchrun leaves it.
  spec.local_world_size = 1;
  env = BuildWorkerEnv(spec, {"PATH=/bin"});
  for (const std::string& e : env) EXPECT_NE(e.rfind("OMP_NUM_THREADS", 0), 0u);
}

// The variables where torchrun 1.13 and 2.x differ follow the workers'
// torch; an unknown torch (a LibTorch program) gets both generations'.
TEST(WorkerEnvTest, FollowsTheTorchrunOfTheWorkersTorch) {
  auto has = [](const std::vector<std::string>& env, const std::string& e) {
    return std::set<std::string>(env.begin(), env.end()).count(e) > 0;
  };
  auto names = [](const std::vector<std::string>& env) {
    std::set<std::string> out;
    for (const std::string& e : env) out.insert(e.substr(0, e.find('=')));
    return out;
  };
  WorkerEnvSpec spec;
  spec.torch = ParseWorkerTorch("1.13.0a0+gitunknown\n0\n");  // Debian 12
  ASSERT_TRUE(spec.torch.known());
  std::vector<std::string> env = BuildWorkerEnv(spec, {});
  EXPECT_TRUE(has(env, "NCCL_ASYNC_ERROR_HANDLING=1"));
  EXPECT_EQ(names(env).count("TORCH_NCCL_ASYNC_ERROR_HANDLING"), 0u);
  EXPECT_EQ(names(env).count("USE_LIBUV"), 0u);
  spec.torch = ParseWorkerTorch("2.6.0+cu124\n1\n");  // a wheel
  env = BuildWorkerEnv(spec, {});
  EXPECT_TRUE(has(env, "TORCH_NCCL_ASYNC_ERROR_HANDLING=1"));
  EXPECT_EQ(names(env).count("NCCL_ASYNC_ERROR_HANDLING"), 0u);
  EXPECT_EQ(names(env).count("USE_LIBUV"), 0u);
  spec.torch = ParseWorkerTorch("2.6.0\n0\n");  // Debian 13: no libuv
  env = BuildWorkerEnv(spec, {});
  EXPECT_TRUE(has(env, "USE_LIBUV=0"));
  EXPECT_EQ(names(env).count("NCCL_ASYNC_ERROR_HANDLING"), 0u);
  spec.torch = ParseWorkerTorch("none\n");
  EXPECT_FALSE(spec.torch.known());
  env = BuildWorkerEnv(spec, {});
  EXPECT_TRUE(has(env, "NCCL_ASYNC_ERROR_HANDLING=1"));
  EXPECT_TRUE(has(env, "TORCH_NCCL_ASYNC_ERROR_HANDLING=1"));
}

TEST(WorkerEnvTest, TheTokenIsNeverInAWorkersEnvironment) {
  WorkerEnvSpec spec;
  spec.credentials.token_file = "/run/x/token";
  std::vector<std::string> env =
      BuildWorkerEnv(spec, {"DDPRUN_TOKEN=secret", "PATH=/bin"});
  for (const std::string& e : env) EXPECT_NE(e.rfind("DDPRUN_TOKEN=", 0), 0u);
  EXPECT_THAT(env, ::testing::Contains("DDPRUN_TOKEN_FILE=/run/x/token"));
  for (const std::string& e :
       BuildStandbyEnv({"DDPRUN_TOKEN=secret", "PATH=/bin"}, "")) {
    EXPECT_NE(e.rfind("DDPRUN_TOKEN=", 0), 0u);
  }
}

// torchrun 2.x's --virtual-local-rank: LOCAL_RANK=0 and one GPU each, the
// local rank's entry of the agent's list (or the local rank itself).
TEST(WorkerEnvTest, VirtualLocalRankGivesEachWorkerOneGpu) {
  WorkerEnvSpec spec;
  spec.virtual_local_rank = true;
  spec.local_rank = 1;
  std::vector<std::string> env = BuildWorkerEnv(spec, {});
  EXPECT_THAT(env, ::testing::Contains("LOCAL_RANK=0"));
  EXPECT_THAT(env, ::testing::Contains("CUDA_VISIBLE_DEVICES=1"));
  env = BuildWorkerEnv(spec, {"CUDA_VISIBLE_DEVICES=4, 6"});
  EXPECT_THAT(env, ::testing::Contains("CUDA_VISIBLE_DEVICES=6"));
  spec.virtual_local_rank = false;
  env = BuildWorkerEnv(spec, {"CUDA_VISIBLE_DEVICES=4,6"});
  EXPECT_THAT(env, ::testing::Contains("LOCAL_RANK=1"));
  EXPECT_THAT(env, ::testing::Contains("CUDA_VISIBLE_DEVICES=4,6"));
}

TEST(ProgramCommandTest, PythonProgramsAsTorchrunRunsThem) {
  LaunchOptions o;
  o.program = {"train.py", "--lr", "1"};
  EXPECT_THAT(BuildProgramArgv(o, ""),
              ElementsAre("python3", "-u", "train.py", "--lr", "1"));
  EXPECT_THAT(BuildProgramArgv(o, "/usr/bin/python3"),
              ElementsAre("/usr/bin/python3", "-u", "train.py", "--lr", "1"));
  o.run_module = true;
  o.program = {"pkg.train"};
  EXPECT_THAT(BuildProgramArgv(o, ""),
              ElementsAre("python3", "-u", "-m", "pkg.train"));
  o.run_module = false;
  o.no_python = true;
  o.program = {"train.py"};
  EXPECT_THAT(BuildProgramArgv(o, ""), ElementsAre("train.py"));
  o.no_python = false;
  o.program = {"./train"};
  EXPECT_THAT(BuildProgramArgv(o, ""), ElementsAre("./train"));
}

TEST(ProgramCommandTest, PythonBesideTheExecutableWins) {
  char folder[] = "/tmp/python_beside_XXXXXX";
  ASSERT_NE(mkdtemp(folder), nullptr);
  std::string bin = std::string(folder) + "/bin";
  ASSERT_EQ(mkdir(bin.c_str(), 0755), 0);
  // No python3 there: python3 from PATH.
  EXPECT_EQ(PythonBeside(bin + "/ddprun"), "");
  std::string python = bin + "/python3";
  ASSERT_EQ(symlink("/bin/true", python.c_str()), 0);
  EXPECT_EQ(PythonBeside(bin + "/ddprun"), python);
  EXPECT_EQ(PythonBeside("ddprun"), "");
  unlink(python.c_str());
  rmdir(bin.c_str());
  rmdir(folder);
}

}  // namespace
}  // namespace ddprun::launcher
