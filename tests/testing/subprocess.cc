#include "tests/testing/subprocess.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "common/proc_stat.h"
#include "tests/testing/temp_dir.h"

extern char** environ;

namespace ddprun::testing {
namespace {

ExitInfo Decode(int status) {
  ExitInfo info;
  if (WIFEXITED(status)) {
    info.exit_code = WEXITSTATUS(status);
  } else if (WIFSIGNALED(status)) {
    info.signal = WTERMSIG(status);
  }
  return info;
}

}  // namespace

std::string ExitInfo::ToString() const {
  if (signal != 0) return absl::StrCat("killed by signal ", signal);
  return absl::StrCat("exit code ", exit_code);
}

absl::StatusOr<Subprocess> Subprocess::Start(const SubprocessOptions& options) {
  if (options.argv.empty()) return absl::InvalidArgumentError("empty argv");
  // Everything the child needs is built before fork.
  std::map<std::string, std::string> env_map;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string entry(*e);
    size_t eq = entry.find('=');
    if (eq == std::string::npos) continue;
    env_map[entry.substr(0, eq)] = entry.substr(eq + 1);
  }
  for (const auto& name : options.unset_env) env_map.erase(name);
  for (const auto& [k, v] : options.env) env_map[k] = v;
  std::vector<std::string> env_strings;
  for (const auto& [k, v] : env_map) env_strings.push_back(k + "=" + v);
  std::vector<char*> envp;
  for (auto& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::vector<std::string> argv_copy = options.argv;
  std::vector<char*> argv;
  for (auto& s : argv_copy) argv.push_back(s.data());
  argv.push_back(nullptr);

  auto open_out = [](const std::string& path) {
    if (path.empty()) return open("/dev/null", O_WRONLY | O_CLOEXEC);
    return open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  };
  int out_fd = open_out(options.stdout_path);
  int err_fd = open_out(options.stderr_path);
  int null_in = open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (out_fd < 0 || err_fd < 0 || null_in < 0) {
    return absl::InternalError("cannot open the child's output files");
  }
  pid_t pid = fork();
  if (pid < 0) return absl::InternalError("fork failed");
  if (pid == 0) {
    setpgid(0, 0);
    dup2(null_in, 0);
    dup2(out_fd, 1);
    dup2(err_fd, 2);
    execvpe(argv[0], argv.data(), envp.data());
    _exit(127);
  }
  setpgid(pid, pid);  // also from the parent, so no race on signals
  close(out_fd);
  close(err_fd);
  close(null_in);
  return Subprocess(pid);
}

Subprocess::Subprocess(Subprocess&& other) noexcept
    : pid_(other.pid_), exit_(other.exit_) {
  other.pid_ = -1;
}

Subprocess& Subprocess::operator=(Subprocess&& other) noexcept {
  if (this != &other) {
    KillAndReap();
    pid_ = other.pid_;
    exit_ = other.exit_;
    other.pid_ = -1;
  }
  return *this;
}

Subprocess::~Subprocess() { KillAndReap(); }

void Subprocess::KillAndReap() {
  if (pid_ <= 0) return;
  // The group may outlive the leader (workers of a killed agent): kill it
  // whether or not the leader has ended.
  kill(-pid_, SIGKILL);
  if (!exit_) {
    int status = 0;
    waitpid(pid_, &status, 0);
  }
  pid_ = -1;
}

std::optional<ExitInfo> Subprocess::Poll() {
  if (exit_ || pid_ <= 0) return exit_;
  int status = 0;
  pid_t r = waitpid(pid_, &status, WNOHANG);
  if (r == pid_) exit_ = Decode(status);
  return exit_;
}

std::optional<ExitInfo> Subprocess::Wait(absl::Duration timeout) {
  absl::Time deadline = absl::Now() + timeout;
  while (!Poll()) {
    if (absl::Now() >= deadline) return std::nullopt;
    absl::SleepFor(absl::Milliseconds(5));
  }
  return exit_;
}

void Subprocess::SignalGroup(int sig) {
  if (pid_ > 0) kill(-pid_, sig);
}

void Subprocess::Signal(int sig) {
  if (pid_ > 0 && !exit_) kill(pid_, sig);
}

RunResult RunCommand(const std::vector<std::string>& argv,
                     absl::Duration timeout,
                     const std::map<std::string, std::string>& env) {
  TempDir dir;
  RunResult result;
  SubprocessOptions options;
  options.argv = argv;
  options.env = env;
  options.stdout_path = dir.File("out");
  options.stderr_path = dir.File("err");
  auto process = Subprocess::Start(options);
  if (!process.ok()) {
    result.err = std::string(process.status().message());
    return result;
  }
  auto exit = process->Wait(timeout);
  if (!exit) {
    result.timed_out = true;
    process->SignalGroup(SIGKILL);
    exit = process->Wait(absl::Seconds(10));
  }
  if (exit) result.exit = *exit;
  result.out = ReadFileOrEmpty(dir.File("out"));
  result.err = ReadFileOrEmpty(dir.File("err"));
  return result;
}

bool ProcessGone(pid_t pid) {
  if (kill(pid, 0) != 0) return true;
  // A zombie still answers kill(0); read its state (field 3).
  const std::vector<std::string> fields = common::ReadProcStatFields(pid);
  return !fields.empty() && fields[0] == "Z";
}

std::vector<pid_t> Children(pid_t pid) {
  std::vector<pid_t> out;
  std::error_code ec;
  for (const auto& task : std::filesystem::directory_iterator(
           absl::StrCat("/proc/", pid, "/task"), ec)) {
    std::ifstream in(task.path() / "children");
    pid_t child;
    while (in >> child) out.push_back(child);
  }
  std::sort(out.begin(), out.end());
  return out;
}

int RankOf(pid_t pid, const std::string& log) {
  if (int rank = RankOf(pid); rank >= 0) return rank;
  const std::string prefix =
      absl::StrCat("prewarmed process ", pid, " activated as rank ");
  int rank = -1;
  for (size_t at = log.find(prefix); at != std::string::npos;
       at = log.find(prefix, at + 1)) {
    absl::string_view rest = absl::string_view(log).substr(at + prefix.size());
    rest = rest.substr(0, rest.find_first_not_of("0123456789"));
    if (!absl::SimpleAtoi(rest, &rank)) rank = -1;
  }
  return rank;
}

std::vector<pid_t> Workers(pid_t pid) {
  std::vector<pid_t> out;
  for (pid_t child : Children(pid)) {
    std::ifstream in(absl::StrCat("/proc/", child, "/comm"));
    std::string name;
    std::getline(in, name);
    if (name != "ddprun-zygote" && name != "ddprun-standby") {
      out.push_back(child);
    }
  }
  return out;
}

int RankOf(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/environ"));
  std::string entry;
  while (std::getline(in, entry, '\0')) {
    absl::string_view value = entry;
    if (absl::ConsumePrefix(&value, "RANK=")) {
      int rank = -1;
      if (absl::SimpleAtoi(value, &rank)) return rank;
    }
  }
  return -1;
}

int CountLinesWith(const std::string& text, const std::string& needle) {
  int n = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    n += absl::StrContains(line, needle);
  }
  return n;
}

}  // namespace ddprun::testing
