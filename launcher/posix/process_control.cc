#include "launcher/posix/process_control.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>

#include "absl/strings/match.h"
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
                            const int* inherit_fds, size_t num_inherit) {
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
              request.inherit_fds.size());
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
  // The state follows the command name, which may hold spaces and ')'.
  std::ifstream stat(absl::StrFormat("/proc/%d/stat", pid));
  std::string text((std::istreambuf_iterator<char>(stat)),
                   std::istreambuf_iterator<char>());
  size_t close = text.rfind(')');
  if (close == std::string::npos || close + 2 >= text.size()) return false;
  const char state = text[close + 2];
  return state == 'T' || state == 't';
}

void PosixProcessControl::AwaitChildEvent(absl::Duration max) {
  // SIGCHLD is taken by the signal thread; a short bounded sleep keeps this
  // simple and the stop latency within a few milliseconds.
  absl::SleepFor(std::min(max, absl::Milliseconds(5)));
}

absl::Status BecomeSubreaper() {
  if (prctl(PR_SET_CHILD_SUBREAPER, 1) != 0) {
    return absl::InternalError(absl::StrFormat(
        "prctl(PR_SET_CHILD_SUBREAPER) failed: %s", strerror(errno)));
  }
  return absl::OkStatus();
}

}  // namespace ddprun::launcher
