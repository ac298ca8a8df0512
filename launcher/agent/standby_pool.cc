#include "launcher/agent/standby_pool.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/json_string.h"
#include "common/worker_env.h"
#include "common/worker_protocol.h"
#include "common/zygote_protocol.h"
#include "launcher/agent/python_standby.h"
#include "spdlog/spdlog.h"

namespace ddprun::launcher {
namespace {

bool WriteAll(int fd, const std::string& data) {
  size_t done = 0;
  while (done < data.size()) {
    ssize_t n = write(fd, data.data() + done, data.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    done += static_cast<size_t>(n);
  }
  return true;
}

// Sends `message` with `fds` (SCM_RIGHTS) on a SOCK_SEQPACKET socket.
bool SendWithFds(int socket, const std::string& message,
                 const std::vector<int>& fds) {
  struct iovec iov = {const_cast<char*>(message.data()), message.size()};
  struct msghdr msg;
  memset(&msg, 0, sizeof(msg));
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(struct cmsghdr) char control[CMSG_SPACE(3 * sizeof(int))];
  if (!fds.empty()) {
    msg.msg_control = control;
    msg.msg_controllen = CMSG_SPACE(fds.size() * sizeof(int));
    struct cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(fds.size() * sizeof(int));
    memcpy(CMSG_DATA(c), fds.data(), fds.size() * sizeof(int));
  }
  ssize_t n;
  do {
    n = sendmsg(socket, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
  } while (n < 0 && errno == EINTR);
  return n == static_cast<ssize_t>(message.size());
}

}  // namespace

StandbyPool::StandbyPool(ProcessControl& control, const common::Clock& clock,
                         std::vector<std::string> argv,
                         std::vector<std::string> env,
                         StandbyPoolOptions options)
    : control_(control),
      clock_(clock),
      options_(options),
      argv_(std::move(argv)),
      env_(std::move(env)),
      idle_start_(control.CanRestoreNormalPriority()),
      // Python standbys import torch in the shim, which never forks.
      use_zygote_(options.zygote && !IsPythonStandbyCommand(argv_) &&
                  control.AdoptsOrphans()) {}

StandbyPool::~StandbyPool() {
  Clear();
  // Pending standbys read end of file on their pipe and exit; the zygote
  // ends with its socket (and is killed, should it not).
  pending_.clear();  // closes their pipes
  if (zygote_) {
    if (zygote_->pid > 0) control_.SignalGroup(zygote_->pid, SIGKILL);
    zygote_.reset();  // closes its socket
  }
}

void StandbyPool::Fill(int count) {
  wanted_ = count;
  Collect();
  TopUp();
}

void StandbyPool::TopUp() {
  if (use_zygote_ && !zygote_ && !options_.seed) {
    if (!StartZygote()) {
      use_zygote_ = false;
    }
  }
  if (!zygote_ && !options_.exec) return;
  while (size() + static_cast<int>(pending_.size()) < wanted_) {
    if (zygote_) {
      // Only once it serves, and after it left SCHED_IDLE: a standby
      // inherits the policy it was forked under.
      if (!zygote_->ready) return;
      if (RequestFork()) continue;
      DropZygote("it cannot be asked for a standby");
      continue;
    }
    if (!Spawn()) return;
  }
}

bool StandbyPool::StartZygote() {
  int sockets[2];
  if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sockets) != 0) {
    spdlog::warn(
        "cannot start the standbys' zygote: socketpair failed: {}; "
        "starting each standby by exec",
        strerror(errno));
    return false;
  }
  SpawnRequest request;
  request.argv = argv_;
  request.env = env_;
  request.idle_priority = idle_start_;
  request.env.push_back(absl::StrCat(common::env::kZygoteFd, "=", sockets[1]));
  request.inherit_fds = {sockets[1]};
  absl::StatusOr<pid_t> pid = control_.Spawn(request);
  close(sockets[1]);
  common::UniqueFd agent_end(sockets[0]);
  if (!pid.ok()) {
    spdlog::warn(
        "cannot start the standbys' zygote: {}; starting each "
        "standby by exec",
        std::string(pid.status().message()));
    return false;
  }
  Zygote zygote;
  zygote.pid = *pid;
  zygote.socket = std::move(agent_end);
  zygote.idle = idle_start_;
  zygote.started = clock_.Now();
  zygote_ = std::move(zygote);
  spdlog::debug("started the standbys' zygote, pid {}", *pid);
  return true;
}

int StandbyPool::PlantSeed() {
  if (!options_.seed || !use_zygote_ || zygote_) return -1;
  int sockets[2];
  if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sockets) != 0) {
    spdlog::warn("cannot prewarm workers: socketpair failed: {}",
                 strerror(errno));
    return -1;
  }
  common::UniqueFd agent_end(sockets[0]);
  common::UniqueFd worker_end(sockets[1]);
  // Waits in the socket until the zygote takes it, before anything else.
  if (!SendWithFds(agent_end.get(), common::zygote::kStdio,
                   {STDOUT_FILENO, STDERR_FILENO})) {
    spdlog::warn("cannot prewarm workers: {}", strerror(errno));
    return -1;
  }
  Zygote zygote;
  zygote.socket = std::move(agent_end);
  zygote.started = clock_.Now();
  zygote_ = std::move(zygote);
  seed_ = std::move(worker_end);
  return seed_.get();
}

bool StandbyPool::RequestFork() {
  absl::StatusOr<common::PipeEnds> pipe = common::MakePipe(O_CLOEXEC);
  if (!pipe.ok()) return false;
  Standby standby;
  standby.control_fd = std::move(pipe->write);
  std::string message = common::zygote::kFork;
  std::vector<int> passed = {pipe->read.get()};
  if (standby.progress.write_fd() >= 0) {
    message += absl::StrCat(" ", common::zygote::kWithProgress);
    passed.push_back(standby.progress.write_fd());
  }
  if (standby.control.child_fd() >= 0) {
    message += absl::StrCat(" ", common::zygote::kWithControl);
    passed.push_back(standby.control.child_fd());
  }
  const bool sent = SendWithFds(zygote_->socket.get(), message, passed);
  pipe->read.Reset();
  standby.progress.CloseWriteEnd();
  standby.control.CloseReadEnd();
  if (!sent) return false;
  standby.started = clock_.Now();
  pending_.push_back(std::move(standby));
  return true;
}

bool StandbyPool::Spawn() {
  absl::StatusOr<common::PipeEnds> pipe = common::MakePipe(O_CLOEXEC);
  if (!pipe.ok()) {
    spdlog::warn("cannot prewarm a worker: {}",
                 std::string(pipe.status().message()));
    return false;
  }
  const int standby_fd = pipe->read.get();
  Standby standby;
  standby.control_fd = std::move(pipe->write);
  SpawnRequest request;
  request.argv = argv_;
  request.env = env_;
  request.idle_priority = idle_start_;
  request.env.push_back(absl::StrCat(common::env::kStandbyFd, "=", standby_fd));
  request.inherit_fds = {standby_fd};
  if (standby.progress.write_fd() >= 0) {
    request.inherit_fds.push_back(standby.progress.write_fd());
  }
  if (standby.control.child_fd() >= 0) {
    request.inherit_fds.push_back(standby.control.child_fd());
  }
  absl::StatusOr<pid_t> pid = control_.Spawn(request);
  pipe->read.Reset();
  standby.progress.CloseWriteEnd();
  standby.control.CloseReadEnd();
  if (!pid.ok()) {
    spdlog::warn("cannot prewarm a worker: {}",
                 std::string(pid.status().message()));
    return false;
  }
  standby.pid = *pid;
  standby.started = clock_.Now();
  standby.idle = idle_start_;
  standbys_.push_back(std::move(standby));
  ++execed_;
  return true;
}

void StandbyPool::Collect() {
  while (zygote_) {
    char buffer[common::zygote::kMaxMessage];
    ssize_t n;
    do {
      n = recv(zygote_->socket.get(), buffer, sizeof(buffer), MSG_DONTWAIT);
    } while (n < 0 && errno == EINTR);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    if (n <= 0) {
      // A peer that closed with messages unread (a seed's worker that never
      // read "stdio") resets the connection instead.
      const bool ended = n == 0 || errno == ECONNRESET;
      // A seed whose worker ended before it forked the zygote.
      const bool seed_lost = ended && zygote_->pid < 0 && seed_.get() < 0;
      DropZygote(ended ? std::string("it ended")
                       : absl::StrCat("its socket failed: ", strerror(errno)),
                 /*for_good=*/!seed_lost);
      return;
    }
    OnZygoteMessage(std::string(buffer, static_cast<size_t>(n)));
  }
}

void StandbyPool::OnZygoteMessage(const std::string& message) {
  std::vector<std::string> words =
      absl::StrSplit(message, absl::MaxSplits(' ', 5));
  const std::string& kind = words[0];
  if (kind == common::zygote::kReady) {
    if (zygote_->pid < 0 &&
        (words.size() < 2 || !absl::SimpleAtoi(words[1], &zygote_->pid) ||
         zygote_->pid <= 0)) {
      zygote_->pid = -1;
      DropZygote(
          absl::StrCat("it said it is ready without its pid: ", message));
      return;
    }
    zygote_->ready = true;
    // Forks should not wait for idle CPU, and its standbys inherit the
    // policy (Activate restores theirs when this fails).
    if (zygote_->idle) {
      absl::Status restored = control_.RestoreNormalPriority(zygote_->pid);
      if (restored.ok()) {
        zygote_->idle = false;
      } else {
        spdlog::warn("{}", std::string(restored.message()));
      }
    }
    TopUp();
    const std::string after = absl::FormatDuration(
        absl::Trunc(clock_.Now() - zygote_->started, absl::Milliseconds(1)));
    if (options_.seed) {
      spdlog::info(
          "prewarmed workers fork from a zygote (pid {}) that a worker forked "
          "where it waits for its round, {} after it started: a few ms each "
          "instead of a process start",
          zygote_->pid, after);
    } else {
      spdlog::info(
          "prewarmed workers fork from a zygote (pid {}), ready after {}: a "
          "few ms each instead of a process start",
          zygote_->pid, after);
    }
    return;
  }
  if (kind == common::zygote::kRefused) {
    const std::string prefix = absl::StrCat(kind, " ");
    DropZygote(
        absl::StrCat("it refused: ", absl::StripPrefix(message, prefix)));
    return;
  }
  if (pending_.empty()) {
    DropZygote(absl::StrCat("it answered a request not made: ", message));
    return;
  }
  Standby standby = std::move(pending_.front());
  pending_.erase(pending_.begin());
  int fds[4] = {-1, -1, -1, -1};
  bool parsed = kind == common::zygote::kForked && words.size() == 5;
  for (int i = 0; parsed && i < 4; ++i) {
    parsed = absl::SimpleAtoi(words[i + 1], &fds[i]);
  }
  if (!parsed) {
    standby.control_fd.Reset();
    DropZygote(absl::StrCat("a fork failed: ", message));
    return;
  }
  standby.pid = fds[0];
  // The worker knows its pipes by these numbers; every later round's
  // environment must name them (DDPRUN_PROGRESS_FD: a wrong number made a
  // survivor write its phase records into one of its sockets).
  standby.progress.set_child_fd(fds[2]);
  standby.control.set_child_fd(fds[3]);
  standby.idle = zygote_->idle;
  spdlog::debug("prewarmed worker pid {} forked by the zygote in {}",
                standby.pid,
                absl::FormatDuration(absl::Trunc(clock_.Now() - standby.started,
                                                 absl::Microseconds(100))));
  standby.started = clock_.Now();
  standbys_.push_back(std::move(standby));
  ++forked_;
}

void StandbyPool::DropZygote(const std::string& why, bool for_good) {
  if (!zygote_) return;
  const std::string who =
      zygote_->pid > 0 ? absl::StrFormat("the zygote (pid %d)", zygote_->pid)
                       : std::string("the worker that was to fork the zygote");
  if (!for_good) {
    spdlog::debug(
        "the worker that was to fork the standbys' zygote ended first; the "
        "next worker started here forks it");
  } else if (options_.exec) {
    spdlog::warn(
        "prewarmed workers start by exec from now on: {} cannot fork them: {}",
        who, why);
  } else {
    spdlog::info(
        "no workers are prewarmed from now on: {} cannot fork them: {} "
        "(--prewarm starts them by exec instead)",
        who, why);
  }
  if (zygote_->pid > 0) control_.SignalGroup(zygote_->pid, SIGKILL);
  zygote_.reset();  // closes its socket
  use_zygote_ = !for_good;
  pending_.clear();  // closes their pipes
  TopUp();
}

int StandbyPool::progress_fd(int i) const {
  return standbys_[i].progress.child_fd();
}

int StandbyPool::control_fd(int i) const {
  return standbys_[i].control.child_fd();
}

absl::StatusOr<std::vector<WorkerSlot>> StandbyPool::Activate(
    const std::vector<std::vector<std::string>>& envs) {
  if (envs.size() > standbys_.size()) {
    return absl::FailedPreconditionError(
        absl::StrFormat("%d prewarmed workers wait, %d are needed",
                        standbys_.size(), envs.size()));
  }
  for (size_t i = 0; i < envs.size(); ++i) {
    const Standby& s = standbys_[i];
    const pid_t pid = s.pid;
    // Back under the normal policy before it runs as a worker.
    absl::Status restored =
        s.idle ? control_.RestoreNormalPriority(pid) : absl::OkStatus();
    bool told = restored.ok() &&
                WriteAll(s.control_fd.get(), common::EncodeWorkerEnv(envs[i]));
    int err = errno;
    standbys_[i].control_fd.Reset();
    if (!told) {
      // Those told already run as workers of a group that cannot be
      // completed: end them too.
      for (size_t j = 0; j <= i; ++j) {
        control_.SignalGroup(standbys_[j].pid, SIGKILL);
      }
      standbys_.erase(standbys_.begin(), standbys_.begin() + i + 1);
      Clear();
      if (!restored.ok()) return restored;
      return absl::UnavailableError(absl::StrFormat(
          "prewarmed worker %d (pid %d) is gone (%s)", i, pid, strerror(err)));
    }
  }
  std::vector<WorkerSlot> workers;
  for (size_t i = 0; i < envs.size(); ++i) {
    // Their own pipes: a slot made from moved channels makes none.
    workers.push_back({.pid = standbys_[i].pid,
                       .progress = std::move(standbys_[i].progress),
                       .control = std::move(standbys_[i].control)});
  }
  standbys_.erase(standbys_.begin(), standbys_.begin() + envs.size());
  return workers;
}

void StandbyPool::PromoteLate() {
  if (zygote_) {
    Collect();
    TopUp();
  }
  const absl::Time now = clock_.Now();
  if (zygote_ && zygote_->idle && !zygote_->ready &&
      now - zygote_->started >= options_.idle_grace) {
    // A machine with no idle CPU would never let it get ready.
    zygote_->idle = !control_.RestoreNormalPriority(zygote_->pid).ok();
  }
  for (Standby& s : standbys_) {
    if (!s.idle || now - s.started < options_.idle_grace) continue;
    s.idle = false;
    absl::Status restored = control_.RestoreNormalPriority(s.pid);
    if (restored.ok()) {
      spdlog::debug(
          "prewarmed worker pid {} started idle {} ago: now at "
          "normal priority",
          s.pid, absl::FormatDuration(now - s.started));
    } else {
      // Activate tries again and, failing, starts a worker afresh.
      s.idle = true;
      s.started = now;
      spdlog::warn("{}", std::string(restored.message()));
    }
  }
}

void StandbyPool::Clear() {
  for (Standby& s : standbys_) {
    control_.SignalGroup(s.pid, SIGKILL);
  }
  standbys_.clear();  // closes their pipes
}

}  // namespace ddprun::launcher
