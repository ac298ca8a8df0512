#include "worker/standby.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/proc_stat.h"
#include "common/worker_env.h"
#include "common/worker_protocol.h"
#include "common/zygote_protocol.h"
#include "spdlog/spdlog.h"
#include "worker/error_file.h"
#include "worker/process_start.h"
#include "worker/worker_env.h"

namespace ddprun::worker {
namespace env = ::ddprun::common::env;
namespace {

// --- The zygote (DDPRUN_ZYGOTE_FD) -----------------------------------------
//
// Why fork by hand here rather than a library: what matters is the order of
// a handful of system calls around fork (a double fork so that the agent,
// a subreaper, adopts the standby; PR_SET_PDEATHSIG only once it has), which
// no process library offers for a process that keeps its memory.

// Set in a standby forked by the zygote: the zygote's pid (for the log).
pid_t forked_by_zygote = 0;
// This program's own name; a standby takes it back once activated.
char program_name[16] = {};

// ps and top (and tests, which tell them from workers so) show the zygote
// as "ddprun-zygote" and a standby as "ddprun-standby" until it is
// activated, from the very start: a static initialiser, since what the
// program does before AwaitActivation (load LibTorch's libraries, its data)
// takes seconds. Trivially destructible; nothing depends on its order.
[[maybe_unused]] const bool named_at_start = [] {
  prctl(PR_GET_NAME, program_name);
  if (getenv(env::kZygoteFd) != nullptr) {
    prctl(PR_SET_NAME, "ddprun-zygote");
  } else if (getenv(env::kStandbyFd) != nullptr) {
    prctl(PR_SET_NAME, "ddprun-standby");
  }
  return true;
}();

// This process's threads as "TID (name)"; empty when /proc cannot say.
std::vector<std::string> Threads() {
  std::vector<std::string> threads;
  DIR* dir = opendir("/proc/self/task");
  if (dir == nullptr) return threads;
  while (const dirent* entry = readdir(dir)) {
    if (entry->d_name[0] == '.') continue;
    std::ifstream comm(
        absl::StrCat("/proc/self/task/", entry->d_name, "/comm"));
    std::string name;
    std::getline(comm, name);
    threads.push_back(absl::StrCat(entry->d_name, " (", name, ")"));
  }
  closedir(dir);
  return threads;
}

// Why this process may not fork standbys, or "" when it may: it must run
// no thread but this one (a thread holding a lock at the fork would hold
// it forever in the copy; an OpenMP pool, gRPC or CUDA all run threads).
// A thread that is ending (a loader whose result is in) gets a moment.
std::string WhyNotFork(int patience_ms = 1000) {
  std::vector<std::string> threads;
  for (int i = 0; i < std::max(1, patience_ms / 10); ++i) {
    threads = Threads();
    if (threads.size() == 1) return "";
    struct timespec pause = {0, 10 * 1000 * 1000};
    nanosleep(&pause, nullptr);
  }
  if (threads.empty()) return "/proc/self/task cannot be read";
  return absl::StrFormat(
      "it runs %d threads (%s) where it waits for its round; a process may "
      "fork only while it runs one (start threads, OpenMP, gRPC or CUDA "
      "after AwaitActivation)",
      threads.size(), absl::StrJoin(threads, ", "));
}

bool SendMessage(int socket, const std::string& message) {
  ssize_t n;
  do {
    n = send(socket, message.data(), message.size(), MSG_NOSIGNAL);
  } while (n < 0 && errno == EINTR);
  return n == static_cast<ssize_t>(message.size());
}

// One message on `socket` (recvmsg `flags`) as text, and the descriptors
// it carried (SCM_RIGHTS, close-on-exec here); nullopt at end of file or
// on an error.
std::optional<std::string> ReceiveWithFds(int socket, int flags,
                                          std::vector<int>& received) {
  char data[common::zygote::kMaxMessage];
  alignas(struct cmsghdr) char control[CMSG_SPACE(3 * sizeof(int))];
  struct iovec iov = {data, sizeof(data)};
  struct msghdr msg;
  memset(&msg, 0, sizeof(msg));
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  ssize_t n;
  do {
    n = recvmsg(socket, &msg, flags | MSG_CMSG_CLOEXEC);
  } while (n < 0 && errno == EINTR);
  if (n <= 0) return std::nullopt;
  for (struct cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr;
       c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < count; ++i) {
      int fd;
      memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
      received.push_back(fd);
    }
  }
  return std::string(data, static_cast<size_t>(n));
}

// One fork request: the descriptors it carried (standby, progress, control;
// -1 where absent). False at end of file or on an error.
bool ReceiveRequest(int socket, int fds[3]) {
  std::vector<int> received;
  std::optional<std::string> data = ReceiveWithFds(socket, 0, received);
  if (!data.has_value()) return false;
  std::vector<std::string> words = absl::StrSplit(*data, ' ');
  fds[0] = fds[1] = fds[2] = -1;
  size_t next = 0;
  auto take = [&]() { return next < received.size() ? received[next++] : -1; };
  if (words.empty() || words[0] != common::zygote::kFork) {
    for (int fd : received) close(fd);
    return true;  // not a request: nothing to do (fds stay -1)
  }
  fds[0] = take();
  for (size_t i = 1; i < words.size(); ++i) {
    if (words[i] == common::zygote::kWithProgress) fds[1] = take();
    if (words[i] == common::zygote::kWithControl) fds[2] = take();
  }
  while (next < received.size()) close(received[next++]);
  return true;
}

// In the grandchild of a double fork, once its parent (the intermediate
// process) has exited: waits until the agent adopted it, leading a process
// group of its own (the agent signals groups), and dies with the agent from
// then on. "" on success, or why it cannot.
std::string SettleAdopted(pid_t intermediate, pid_t agent) {
  if (setpgid(0, 0) != 0) return absl::StrCat("setpgid: ", strerror(errno));
  // Adoption is the kernel's, right after the intermediate exits.
  for (int i = 0; i < 100000 && getppid() == intermediate; ++i) {
    struct timespec pause = {0, 50 * 1000};
    nanosleep(&pause, nullptr);
  }
  if (getppid() != agent) {
    return absl::StrFormat(
        "adopted by pid %d, not by the agent (pid %d): the agent must be a "
        "child subreaper (PR_SET_CHILD_SUBREAPER)",
        getppid(), agent);
  }
  // Only now: the adoption itself would have sent the signal. The re-check
  // covers an agent that died in between.
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != agent) return "the agent ended";
  return "";
}

// In the grandchild of the zygote: adopted by the agent, it becomes a
// standby of its own. "" on success, or why it cannot.
std::string SettleForkedStandby(pid_t intermediate, pid_t agent,
                                const int fds[3]) {
  prctl(PR_SET_NAME, "ddprun-standby");  // until activated
  if (std::string why = SettleAdopted(intermediate, agent); !why.empty()) {
    return why;
  }
  // Kept across exec, as an exec'd standby's inherited descriptors are.
  for (int i = 0; i < 3; ++i) {
    if (fds[i] >= 0) fcntl(fds[i], F_SETFD, 0);
  }
  setenv(env::kStandbyFd, std::to_string(fds[0]).c_str(), /*overwrite=*/1);
  return "";
}

// Forks one standby for the request's descriptors. Returns in the zygote
// with the reply for the agent, and in the new standby with nullopt.
std::optional<std::string> ForkStandby(int socket, const int fds[3],
                                       pid_t agent) {
  auto close_fds = [&] {
    for (int i = 0; i < 3; ++i) {
      if (fds[i] >= 0) close(fds[i]);
    }
  };
  if (fds[0] < 0) {
    close_fds();
    return absl::StrCat(common::zygote::kFailed,
                        " the request carried no standby descriptor");
  }
  int report[2];
  if (pipe2(report, O_CLOEXEC) != 0) {
    close_fds();
    return absl::StrCat(common::zygote::kFailed, " pipe: ", strerror(errno));
  }
  const pid_t intermediate = fork();
  if (intermediate == 0) {
    const pid_t self = getpid();
    const pid_t standby = fork();
    if (standby != 0) {
      if (standby < 0) {
        dprintf(report[1], "%s fork: %s", common::zygote::kFailed,
                strerror(errno));
      }
      _exit(0);  // the standby is orphaned, and the agent adopts it
    }
    close(report[0]);
    close(socket);
    const std::string why = SettleForkedStandby(self, agent, fds);
    if (!why.empty()) {
      dprintf(report[1], "%s %s", common::zygote::kFailed, why.c_str());
      _exit(1);
    }
    dprintf(report[1], "%s %d %d %d %d", common::zygote::kForked, getpid(),
            fds[0], fds[1], fds[2]);
    close(report[1]);
    return std::nullopt;
  }
  close(report[1]);
  close_fds();
  if (intermediate < 0) {
    close(report[0]);
    return absl::StrCat(common::zygote::kFailed, " fork: ", strerror(errno));
  }
  int status = 0;
  while (waitpid(intermediate, &status, 0) < 0 && errno == EINTR) {
  }
  // Until the standby wrote its line and closed (or exited).
  std::string reply;
  char buffer[512];
  while (true) {
    ssize_t n = read(report[0], buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    reply.append(buffer, static_cast<size_t>(n));
  }
  close(report[0]);
  if (reply.empty()) {
    return absl::StrCat(common::zygote::kFailed,
                        " the forked standby ended before it was ready");
  }
  return reply;
}

// The zygote's loop: serves the agent's fork requests on `socket` until the
// agent closes it (then exits 0). Returns OK only in each forked standby,
// with its own DDPRUN_STANDBY_FD set.
absl::Status ServeForks(int socket, pid_t agent) {
  prctl(PR_SET_NAME, "ddprun-zygote");  // as from the start (above)
  if (!SendMessage(socket,
                   absl::StrCat(common::zygote::kReady, " ", getpid()))) {
    fflush(nullptr);
    _exit(0);
  }
  while (true) {
    int fds[3];
    if (!ReceiveRequest(socket, fds)) {
      // The agent is done with this zygote.
      fflush(nullptr);
      _exit(0);
    }
    if (fds[0] < 0 && fds[1] < 0 && fds[2] < 0) continue;
    if (std::string why = WhyNotFork(); !why.empty()) {
      (void)SendMessage(socket,
                        absl::StrCat(common::zygote::kRefused, " ", why));
      fflush(nullptr);
      _exit(0);
    }
    const pid_t zygote = getpid();
    std::optional<std::string> reply = ForkStandby(socket, fds, agent);
    if (!reply.has_value()) {
      forked_by_zygote = zygote;
      return absl::OkStatus();
    }
    if (!SendMessage(socket, *reply)) {
      fflush(nullptr);
      _exit(0);
    }
  }
}

// The descriptor that variable `name` holds as `text`; an error naming it.
absl::StatusOr<int> ParseSocket(const char* name, const std::string& text) {
  int socket = -1;
  if (!absl::SimpleAtoi(text, &socket) || socket < 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s='%s' is not a file descriptor; unset it (ddprun sets it where "
        "it prewarms this program's workers)",
        name, text));
  }
  return socket;
}

// AwaitActivation in a zygote that ddprun started (DDPRUN_ZYGOTE_FD): serves
// forks (ServeForks). A process that may not fork says why and exits 0: the
// agent then starts its standbys by exec.
absl::Status ServeAsZygote(const std::string& fd_text) {
  absl::StatusOr<int> socket = ParseSocket(env::kZygoteFd, fd_text);
  if (!socket.ok()) return socket.status();
  unsetenv(env::kZygoteFd);  // the standbys' environment has it not
  const pid_t agent = getppid();
  if (std::string why = WhyNotFork(); !why.empty()) {
    (void)SendMessage(*socket,
                      absl::StrCat(common::zygote::kRefused, " ", why));
    fflush(nullptr);
    _exit(0);
  }
  return ServeForks(*socket, agent);
}

// The agent's standard output and error, which it sent ahead of the seed
// (common/zygote_protocol.h: "stdio"): they become the zygote's, not the
// worker's, whose output is its rank's. Read by the worker before anything
// else (a socket closed with a message unread resets its peer's end);
// -1 where missing.
void ReceiveAgentsOutput(int socket, int out[2]) {
  out[0] = out[1] = -1;
  std::vector<int> received;
  std::optional<std::string> data =
      ReceiveWithFds(socket, MSG_DONTWAIT, received);
  if (data.has_value() && *data == common::zygote::kStdio &&
      received.size() == 2) {
    out[0] = received[0];
    out[1] = received[1];
    return;
  }
  for (int fd : received) close(fd);
}

// /proc/<pid>/environ (ps e) shows the environment a process started with,
// read from its own memory: a zygote that a worker forked, and each
// standby it forks, would show that worker's RANK and the rest of its
// round's variables until they end. The zygote moves its environment to
// the heap (setenv copies) and blanks the original, so that /proc shows
// none; a standby's round is then only in its log line, as with a zygote
// of its own. The bounds are /proc/self/stat's env_start and env_end
// (fields 50 and 51).
void ForgetStartingEnvironment() {
  std::vector<std::string> fields = common::ReadProcStatFields(getpid());
  uintptr_t start = 0;
  uintptr_t end = 0;
  if (fields.size() < 49 || !absl::SimpleAtoi(fields[50 - 3], &start) ||
      !absl::SimpleAtoi(fields[51 - 3], &end) || end <= start) {
    return;
  }
  std::vector<std::pair<std::string, std::string>> vars;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    std::vector<std::string> parts =
        absl::StrSplit(*e, absl::MaxSplits('=', 1));
    if (parts.size() == 2 && !parts[0].empty()) {
      vars.emplace_back(parts[0], parts[1]);
    }
  }
  clearenv();
  for (const auto& [name, value] : vars) {
    setenv(name.c_str(), value.c_str(), /*overwrite=*/1);
  }
  memset(reinterpret_cast<void*>(start), 0, end - start);
}

// In the zygote a worker forked (SeedZygote): it is no rank's worker. Its
// copies of the worker's channels are closed (the agent learns a worker's
// end from their end of file), and so is its output; then it serves.
// Returns OK only in each standby it forks.
absl::Status BecomeSeededZygote(int socket, const int output[2],
                                pid_t intermediate, pid_t agent) {
  prctl(PR_SET_NAME, "ddprun-zygote");
  for (const char* channel : {env::kProgressFd, env::kControlFd}) {
    int fd = -1;
    std::optional<std::string> text = common::ProcessEnv(channel);
    if (text.has_value() && absl::SimpleAtoi(*text, &fd) && fd >= 0 &&
        fd != socket) {
      close(fd);
    }
    unsetenv(channel);
  }
  ForgetStartingEnvironment();
  const int null = open("/dev/null", O_WRONLY | O_CLOEXEC);
  for (int i = 0; i < 2; ++i) {
    const int from = output[i] >= 0 ? output[i] : null;
    if (from >= 0) dup2(from, STDOUT_FILENO + i);
    if (output[i] >= 0) close(output[i]);
  }
  if (null >= 0) close(null);
  if (std::string why = SettleAdopted(intermediate, agent); !why.empty()) {
    (void)SendMessage(socket, absl::StrCat(common::zygote::kRefused, " ", why));
    _exit(0);
  }
  return ServeForks(socket, agent);
}

// A worker started without a zygote on its node, handed the seed
// (DDPRUN_ZYGOTE_SEED_FD): at this point of the program, which every
// standby starts from, it forks the node's zygote (a double fork: the
// agent adopts it) and goes on as the worker. That costs the worker a fork
// (ms) where a zygote of its own would cost a program start beside the
// training. Returns false in the worker (whether or not it could seed),
// and true in each standby the zygote forks later.
bool SeedZygote(const std::string& fd_text) {
  unsetenv(env::kZygoteSeedFd);
  absl::StatusOr<int> socket = ParseSocket(env::kZygoteSeedFd, fd_text);
  if (!socket.ok()) {
    spdlog::warn("{}", std::string(socket.status().message()));
    return false;
  }
  int output[2];
  ReceiveAgentsOutput(*socket, output);
  auto close_output = [&] {
    for (int fd : output) {
      if (fd >= 0) close(fd);
    }
  };
  // The worker must not wait on its own threads for long: a thread that is
  // ending gets a moment, not the zygote's second.
  if (std::string why = WhyNotFork(/*patience_ms=*/100); !why.empty()) {
    (void)SendMessage(*socket,
                      absl::StrCat(common::zygote::kRefused, " ", why));
    close(*socket);
    close_output();
    return false;
  }
  const pid_t agent = getppid();
  fflush(nullptr);  // what stdio holds is the worker's to write, once
  const pid_t intermediate = fork();
  if (intermediate == 0) {
    const pid_t self = getpid();
    const pid_t zygote = fork();
    if (zygote != 0) _exit(0);  // orphans the zygote: the agent adopts it
    if (!BecomeSeededZygote(*socket, output, self, agent).ok()) _exit(0);
    return true;  // a standby the zygote forked
  }
  if (intermediate < 0) {
    (void)SendMessage(*socket, absl::StrCat(common::zygote::kRefused,
                                            " fork: ", strerror(errno)));
  } else {
    while (waitpid(intermediate, nullptr, 0) < 0 && errno == EINTR) {
    }
  }
  close(*socket);
  close_output();
  return false;
}

}  // namespace

absl::StatusOr<std::vector<std::pair<std::string, std::string>>> ParseEnvJson(
    const std::string& text) {
  return common::DecodeWorkerEnv(text);
}

bool ServesStandbys() {
  return common::ProcessEnv(env::kZygoteFd).has_value() ||
         common::ProcessEnv(env::kZygoteSeedFd).has_value();
}

bool ForkedByZygote() { return forked_by_zygote != 0; }

absl::Status AwaitActivation() {
  if (std::optional<std::string> zygote = common::ProcessEnv(env::kZygoteFd)) {
    // Returns only in a standby it forked.
    if (absl::Status served = ServeAsZygote(*zygote); !served.ok()) {
      return served;
    }
  } else if (std::optional<std::string> seed =
                 common::ProcessEnv(env::kZygoteSeedFd)) {
    // Returns in the worker, and in each standby the zygote forks.
    (void)SeedZygote(*seed);
  }
  std::optional<std::string> fd_text = ReadStandbyFd();
  if (!fd_text.has_value()) return absl::OkStatus();  // not prewarmed
  int fd = -1;
  if (!absl::SimpleAtoi(*fd_text, &fd) || fd < 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s='%s' is not a file descriptor; unset it, or start this program "
        "with ddprun --prewarm, which sets it",
        env::kStandbyFd, *fd_text));
  }
  auto waiting_since = std::chrono::steady_clock::now();
  std::string data;
  char buffer[16384];
  while (true) {
    ssize_t n = read(fd, buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      int err = errno;
      close(fd);
      return absl::UnavailableError(
          absl::StrFormat("cannot read the round's environment from %s=%d: %s",
                          env::kStandbyFd, fd, strerror(err)));
    }
    if (n == 0) break;
    data.append(buffer, static_cast<size_t>(n));
  }
  close(fd);
  if (data.empty()) {
    // Not needed (the job ended, or the agent let this standby go): leave
    // without running what exit() would, which may block on threads that
    // libraries started.
    fflush(nullptr);
    _exit(0);
  }
  absl::StatusOr<std::vector<std::pair<std::string, std::string>>> vars =
      common::DecodeWorkerEnv(data);
  if (!vars.ok()) return vars.status();
  clearenv();
  for (const auto& [name, value] : *vars) {
    if (name.empty() || name.find('=') != std::string::npos) continue;
    setenv(name.c_str(), value.c_str(), /*overwrite=*/1);
  }
  prctl(PR_SET_NAME, program_name);  // a worker now
  if (std::string error_file = ReadErrorFilePath(); !error_file.empty()) {
    InstallErrorFileHandlers(error_file);
  }
  double waited = std::chrono::duration<double>(
                      std::chrono::steady_clock::now() - waiting_since)
                      .count();
  // Only for the log line: RANK as given, whatever the rest holds.
  spdlog::info(
      "prewarmed process {} activated as rank {} after {:.1f} s in "
      "standby{}",
      getpid(), common::ProcessEnv(env::kRank).value_or("?"), waited,
      forked_by_zygote != 0
          ? absl::StrFormat(" (forked by the zygote, pid %d)", forked_by_zygote)
          : std::string());
  return absl::OkStatus();
}

}  // namespace ddprun::worker
