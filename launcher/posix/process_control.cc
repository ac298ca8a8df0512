#include "launcher/posix/process_control.h"

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"

namespace ddprun::launcher {
namespace {

bool IsExecutableFile(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) &&
         access(path.c_str(), X_OK) == 0;
}

// The child side of Spawn: only async-signal-safe calls. Never returns.
[[noreturn]] void ExecChild(pid_t parent, int error_fd, const char* path,
                            char* const argv[], char* const envp[],
                            int stdout_fd, int stderr_fd,
                            const int* inherit_fds, size_t num_inherit,
                            bool idle_priority) {
  // The agent blocks the signals it handles on a thread; workers start clean.
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
  struct sigaction dfl;
  memset(&dfl, 0, sizeof(dfl));
  dfl.sa_handler = SIG_DFL;
  sigaction(SIGPIPE, &dfl, nullptr);
  setpgid(0, 0);
  // Dies with the agent; the re-check covers an agent that died before
  // prctl took effect.
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent) _exit(126);
  if (stdout_fd >= 0) dup2(stdout_fd, STDOUT_FILENO);
  if (stderr_fd >= 0) dup2(stderr_fd, STDERR_FILENO);
  for (size_t i = 0; i < num_inherit; ++i) fcntl(inherit_fds[i], F_SETFD, 0);
  if (idle_priority) {
    // Before exec, so that the program's whole start-up (the dynamic
    // loader, LibTorch's initialisers) runs idle. Best effort: lowering
    // one's own priority is always allowed.
    struct sched_param param;
    memset(&param, 0, sizeof(param));
    sched_setscheduler(0, SCHED_IDLE, &param);
  }
  execve(path, argv, envp);
  int err = errno;
  ssize_t ignored = write(error_fd, &err, sizeof(err));
  (void)ignored;
  _exit(127);
}

}  // namespace

absl::StatusOr<std::string> ResolveProgram(
    const std::string& program, const std::vector<std::string>& env) {
  if (program.empty()) {
    return absl::InvalidArgumentError("the program name is empty");
  }
  if (program.find('/') != std::string::npos) return program;
  std::string path_var;
  bool found_path = false;
  for (const std::string& entry : env) {
    if (absl::StartsWith(entry, "PATH=")) {
      path_var = entry.substr(5);
      found_path = true;
    }
  }
  if (!found_path) {
    const char* p = std::getenv("PATH");
    path_var = p != nullptr ? p : "/usr/local/bin:/usr/bin:/bin";
  }
  for (absl::string_view dir : absl::StrSplit(path_var, ':')) {
    std::string candidate =
        absl::StrFormat("%s/%s", dir.empty() ? "." : dir, program);
    if (IsExecutableFile(candidate)) return candidate;
  }
  return absl::NotFoundError(absl::StrFormat(
      "cannot run '%s': no such program in PATH (%s); check the name or give "
      "its path",
      program, path_var));
}

absl::StatusOr<pid_t> PosixProcessControl::Spawn(const SpawnRequest& request) {
  if (request.argv.empty()) {
    return absl::InvalidArgumentError("cannot run a worker: empty command");
  }
  absl::StatusOr<std::string> path =
      ResolveProgram(request.argv[0], request.env);
  if (!path.ok()) return path.status();
  // Everything the child touches is built here, before fork.
  std::vector<char*> argv;
  for (const std::string& a : request.argv)
    argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  std::vector<char*> envp;
  for (const std::string& e : request.env)
    envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  int error_pipe[2];
  if (pipe2(error_pipe, O_CLOEXEC) != 0) {
    return absl::InternalError(absl::StrFormat(
        "cannot run '%s': pipe failed: %s", request.argv[0], strerror(errno)));
  }
  pid_t parent = getpid();
  pid_t pid = fork();
  if (pid < 0) {
    int err = errno;
    close(error_pipe[0]);
    close(error_pipe[1]);
    return absl::ResourceExhaustedError(absl::StrFormat(
        "cannot run '%s': fork failed: %s; check the process limit (ulimit "
        "-u) and memory",
        request.argv[0], strerror(err)));
  }
  if (pid == 0) {
    close(error_pipe[0]);
    ExecChild(parent, error_pipe[1], path->c_str(), argv.data(), envp.data(),
              request.stdout_fd, request.stderr_fd, request.inherit_fds.data(),
              request.inherit_fds.size(), request.idle_priority);
  }
  // Also from the parent, so that a signal to the group right after Spawn
  // cannot miss the child.
  setpgid(pid, pid);
  close(error_pipe[1]);
  int child_errno = 0;
  ssize_t n;
  do {
    n = read(error_pipe[0], &child_errno, sizeof(child_errno));
  } while (n < 0 && errno == EINTR);
  close(error_pipe[0]);
  if (n == static_cast<ssize_t>(sizeof(child_errno))) {
    int status = 0;
    waitpid(pid, &status, 0);
    return absl::FailedPreconditionError(absl::StrFormat(
        "cannot run '%s': %s; check the path and that it is executable", *path,
        strerror(child_errno)));
  }
  if (guard_ != nullptr) guard_->WatchGroup(pid);
  return pid;
}

void PosixProcessControl::SignalGroup(pid_t pgid, int sig) {
  if (pgid > 0) kill(-pgid, sig);
}

std::optional<std::pair<pid_t, ExitStatus>> PosixProcessControl::ReapAny() {
  int status = 0;
  pid_t pid;
  do {
    pid = waitpid(-1, &status, WNOHANG);
  } while (pid < 0 && errno == EINTR);
  if (pid <= 0) return std::nullopt;
  return std::make_pair(pid, ExitStatus::FromWaitStatus(status));
}

bool PosixProcessControl::IsStopped(pid_t pid) {
  // 't' (held by a debugger) is left alone: a person is looking at it.
  std::optional<ProcessState> state = ReadProcessState(pid);
  return state.has_value() && state->stopped();
}

std::optional<ProcessState> PosixProcessControl::State(pid_t pid) {
  return ReadProcessActivity(pid);
}

bool MayLeaveIdlePolicy(uint64_t cap_eff, uint64_t nice_limit, int nice) {
  constexpr int kCapSysNice = 23;  // linux/capability.h
  if ((cap_eff >> kCapSysNice) & 1) return true;
  return static_cast<uint64_t>(20 - nice) <= nice_limit;
}

bool PosixProcessControl::CanRestoreNormalPriority() {
  std::ifstream status("/proc/self/status");
  uint64_t cap_eff = 0;
  for (std::string line; std::getline(status, line);) {
    if (absl::StartsWith(line, "CapEff:")) {
      std::string hex(absl::StripAsciiWhitespace(line.substr(7)));
      if (!absl::SimpleHexAtoi(hex, &cap_eff)) cap_eff = 0;
    }
  }
  struct rlimit limit;
  uint64_t nice_limit = 0;
  if (getrlimit(RLIMIT_NICE, &limit) == 0) nice_limit = limit.rlim_cur;
  errno = 0;
  int nice = getpriority(PRIO_PROCESS, 0);
  if (errno != 0) nice = 0;
  return MayLeaveIdlePolicy(cap_eff, nice_limit, nice);
}

absl::Status PosixProcessControl::RestoreNormalPriority(pid_t pid) {
  // Threads inherit their creator's policy, so each thread the process
  // started while idle is moved too. A standby waiting on its pipe starts
  // none meanwhile; one still starting may, so the list is read again until
  // it holds no new thread (bounded).
  struct sched_param param;
  memset(&param, 0, sizeof(param));
  std::set<pid_t> moved;
  for (int pass = 0; pass < 8; ++pass) {
    std::error_code ec;
    std::filesystem::directory_iterator tasks(
        absl::StrFormat("/proc/%d/task", pid), ec);
    if (ec) {
      return absl::NotFoundError(absl::StrFormat(
          "cannot list the threads of pid %d: %s", pid, ec.message()));
    }
    bool found_new = false;
    for (const std::filesystem::directory_entry& task : tasks) {
      pid_t tid = 0;
      if (!absl::SimpleAtoi(task.path().filename().string(), &tid) ||
          !moved.insert(tid).second) {
        continue;
      }
      found_new = true;
      if (sched_setscheduler(tid, SCHED_OTHER, &param) != 0 && errno != ESRCH) {
        return absl::PermissionDeniedError(absl::StrFormat(
            "cannot move thread %d of pid %d off SCHED_IDLE: %s; ddprun "
            "needs CAP_SYS_NICE or an RLIMIT_NICE of 20 (ulimit -e) for that",
            tid, pid, strerror(errno)));
      }
    }
    if (!found_new) break;
  }
  return absl::OkStatus();
}

void PosixProcessControl::AwaitChildEvent(absl::Duration max) {
  // SIGCHLD is taken by the signal thread; a short bounded sleep keeps this
  // simple and the stop latency within a few milliseconds.
  absl::SleepFor(std::min(max, absl::Milliseconds(5)));
}

bool PosixProcessControl::AdoptsOrphans() {
  int subreaper = 0;
  return prctl(PR_GET_CHILD_SUBREAPER, &subreaper) == 0 && subreaper != 0;
}

absl::Status BecomeSubreaper() {
  if (prctl(PR_SET_CHILD_SUBREAPER, 1) != 0) {
    return absl::InternalError(absl::StrFormat(
        "prctl(PR_SET_CHILD_SUBREAPER) failed: %s", strerror(errno)));
  }
  return absl::OkStatus();
}

}  // namespace ddprun::launcher
