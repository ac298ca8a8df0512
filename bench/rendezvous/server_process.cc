#include "bench/rendezvous/server_process.h"

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <iterator>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"

extern char** environ;

namespace ddprun::bench {

absl::StatusOr<ServerProcess> ServerProcess::Start(
    const std::string& binary, const std::vector<std::string>& extra_args,
    const std::string& program, int more_lines) {
  std::vector<std::string> args = {binary, "--port", "0", "--log-level",
                                   "warn"};
  args.insert(args.end(), extra_args.begin(), extra_args.end());
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  int out[2];
  if (pipe(out) != 0) return absl::InternalError("pipe failed");
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, out[1], STDOUT_FILENO);
  posix_spawn_file_actions_addclose(&actions, out[0]);
  pid_t pid = -1;
  int rc = posix_spawn(&pid, binary.c_str(), &actions, nullptr, argv.data(),
                       environ);
  posix_spawn_file_actions_destroy(&actions);
  close(out[1]);
  if (rc != 0) {
    close(out[0]);
    return absl::NotFoundError(absl::StrFormat(
        "cannot start '%s' (error %d); build %s or give its path", binary, rc,
        program));
  }
  ServerProcess process(pid, "");
  FILE* stream = fdopen(out[0], "r");
  char line[256] = {0};
  bool got = stream != nullptr && fgets(line, sizeof(line), stream) != nullptr;
  for (int i = 0; got && i < more_lines; ++i) {
    char more[256] = {0};
    if (fgets(more, sizeof(more), stream) == nullptr) break;
    std::string text(more);
    while (!text.empty() && text.back() == '\n') text.pop_back();
    process.more_lines_.push_back(text);
  }
  if (stream != nullptr) fclose(stream);
  const std::string prefix = program + " listening on ";
  std::string text(line);
  if (!got || !absl::StartsWith(text, prefix)) {
    return absl::UnavailableError(absl::StrFormat(
        "the server '%s' did not print its endpoint (got '%s')", binary, text));
  }
  text = text.substr(prefix.size());
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) {
    text.pop_back();
  }
  process.endpoint_ = text;
  return process;
}

ServerProcess::ServerProcess(ServerProcess&& other) noexcept
    : pid_(other.pid_),
      endpoint_(std::move(other.endpoint_)),
      more_lines_(std::move(other.more_lines_)) {
  other.pid_ = -1;
}

ServerProcess::~ServerProcess() {
  if (pid_ <= 0) return;
  kill(pid_, SIGTERM);
  absl::Time deadline = absl::Now() + absl::Seconds(5);
  int status = 0;
  while (waitpid(pid_, &status, WNOHANG) == 0) {
    if (absl::Now() > deadline) {
      kill(pid_, SIGKILL);
      waitpid(pid_, &status, 0);
      break;
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
}

long ServerProcess::StatusField(const char* name) const {
  std::ifstream in(absl::StrFormat("/proc/%d/status", pid_));
  std::string line;
  while (std::getline(in, line)) {
    if (absl::StartsWith(line, name)) {
      std::istringstream fields(line.substr(std::string(name).size()));
      long kib = -1;
      fields >> kib;
      return kib;
    }
  }
  return -1;
}

double ServerProcess::CpuSeconds() const {
  std::ifstream in(absl::StrFormat("/proc/%d/stat", pid_));
  std::string stat((std::istreambuf_iterator<char>(in)),
                   std::istreambuf_iterator<char>());
  // Fields after the command name (which may hold spaces): state is the
  // 3rd field, utime and stime the 14th and 15th.
  size_t end = stat.rfind(')');
  if (end == std::string::npos) return -1;
  std::istringstream fields(stat.substr(end + 2));
  std::string field;
  long utime = -1;
  long stime = -1;
  for (int i = 3; i <= 15 && fields >> field; ++i) {
    if (i == 14) utime = std::stol(field);
    if (i == 15) stime = std::stol(field);
  }
  if (utime < 0 || stime < 0) return -1;
  return static_cast<double>(utime + stime) / sysconf(_SC_CLK_TCK);
}

long ServerProcess::RssKib() const { return StatusField("VmRSS:"); }
long ServerProcess::PeakRssKib() const { return StatusField("VmHWM:"); }

}  // namespace ddprun::bench
