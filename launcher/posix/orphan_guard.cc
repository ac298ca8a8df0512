#include "launcher/posix/orphan_guard.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace ddprun::launcher {
namespace {

constexpr char kDone[] = "done";

// The process group and session of `pid` from /proc/PID/stat (fields 5 and
// 6, after the command name, which may hold spaces and ')').
bool GroupAndSession(pid_t pid, pid_t& pgrp, pid_t& session) {
  std::ifstream in(absl::StrFormat("/proc/%d/stat", pid));
  std::string text((std::istreambuf_iterator<char>(in)),
                   std::istreambuf_iterator<char>());
  const size_t close = text.rfind(')');
  if (close == std::string::npos) return false;
  std::vector<std::string> fields = absl::StrSplit(text.substr(close + 2), ' ');
  return fields.size() > 3 && absl::SimpleAtoi(fields[2], &pgrp) &&
         absl::SimpleAtoi(fields[3], &session);
}

void KillGroups(const std::set<pid_t>& groups, pid_t session) {
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/proc", ec)) {
    pid_t pid = 0, pgrp = 0, sid = 0;
    if (!absl::SimpleAtoi(entry.path().filename().string(), &pid)) continue;
    if (GroupAndSession(pid, pgrp, sid) && sid == session &&
        groups.count(pgrp) != 0) {
      kill(pid, SIGKILL);
    }
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<OrphanGuard>> OrphanGuard::Start(
    const std::string& executable) {
  // A socket pair rather than a pipe: the agent's sends use MSG_NOSIGNAL,
  // so a guard that is gone (or never started) costs no SIGPIPE.
  int fds[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) {
    return absl::InternalError(absl::StrFormat(
        "orphan guard: socketpair failed: %s", strerror(errno)));
  }
  const std::string fd_text = absl::StrCat(fds[0]);
  const std::string session_text = absl::StrCat(getsid(0));
  const char* argv[] = {"ddprun", "--orphan-guard", fd_text.c_str(),
                        session_text.c_str(), nullptr};
  pid_t child = fork();
  if (child < 0) {
    const int err = errno;
    close(fds[0]);
    close(fds[1]);
    return absl::ResourceExhaustedError(
        absl::StrFormat("orphan guard: fork failed: %s", strerror(err)));
  }
  if (child == 0) {
    // The middle process: only async-signal-safe calls until exec.
    if (fork() != 0) _exit(0);  // the guard is re-parented to init
    setsid();
    int null = open("/dev/null", O_RDWR);
    if (null >= 0) {
      dup2(null, 0);
      dup2(null, 1);
      dup2(null, 2);
    }
    if (chdir("/") != 0) {
      // Not fatal: it only keeps the agent's folder busy.
    }
    fcntl(fds[0], F_SETFD, 0);  // the read end crosses exec
    execv(executable.c_str(), const_cast<char* const*>(argv));
    _exit(127);
  }
  close(fds[0]);
  int status = 0;
  while (waitpid(child, &status, 0) < 0 && errno == EINTR) {
  }
  return std::unique_ptr<OrphanGuard>(new OrphanGuard(fds[1]));
}

OrphanGuard::~OrphanGuard() {
  Send(kDone);
  close(fd_);
}

void OrphanGuard::WatchGroup(pid_t pgid) { Send(absl::StrCat("group ", pgid)); }

void OrphanGuard::WatchPath(const std::string& path) {
  Send(absl::StrCat("path ", path));
}

void OrphanGuard::SetFarewell(const std::string& farewell) {
  // One line: the bytes escaped (the guard unescapes them).
  Send(absl::StrCat("farewell ", absl::CEscape(farewell)));
}

void OrphanGuard::Send(const std::string& line) {
  const std::string message = line + "\n";
  ssize_t n;
  do {
    n = send(fd_, message.data(), message.size(), MSG_NOSIGNAL);
  } while (n < 0 && errno == EINTR);
}

int RunOrphanGuard(int fd, pid_t session,
                   const std::function<void(const std::string&)>& farewell) {
  // Nothing stops the guard but the end of its socket.
  signal(SIGINT, SIG_IGN);
  signal(SIGTERM, SIG_IGN);
  signal(SIGHUP, SIG_IGN);
  signal(SIGPIPE, SIG_IGN);
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
  std::set<pid_t> groups;
  std::vector<std::string> paths;
  std::string last_farewell;
  bool has_farewell = false;
  bool done = false;
  std::string buffer;
  char chunk[4096];
  while (true) {
    ssize_t n = read(fd, chunk, sizeof(chunk));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    buffer.append(chunk, static_cast<size_t>(n));
    size_t end;
    while ((end = buffer.find('\n')) != std::string::npos) {
      absl::string_view line(buffer.data(), end);
      pid_t pgid = 0;
      if (line == kDone) {
        done = true;
      } else if (absl::ConsumePrefix(&line, "group ") &&
                 absl::SimpleAtoi(line, &pgid) && pgid > 1) {
        groups.insert(pgid);
      } else if (absl::ConsumePrefix(&line, "path ") && !line.empty()) {
        paths.emplace_back(line);
      } else if (absl::ConsumePrefix(&line, "farewell ")) {
        has_farewell = absl::CUnescape(line, &last_farewell);
      }
      buffer.erase(0, end + 1);
    }
  }
  if (done) return 0;
  KillGroups(groups, session);
  for (const std::string& path : paths) {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  // After the clean-up: by then no worker of the node runs on.
  if (has_farewell && farewell) farewell(last_farewell);
  return 0;
}

}  // namespace ddprun::launcher
