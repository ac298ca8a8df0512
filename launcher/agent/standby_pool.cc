#include "launcher/agent/standby_pool.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/json_string.h"
#include "common/worker_env.h"
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

}  // namespace

std::string EnvToJson(const std::vector<std::string>& env) {
  std::string out = "{";
  for (const std::string& entry : env) {
    size_t eq = entry.find('=');
    if (eq == std::string::npos) continue;
    if (out.size() > 1) out += ",";
    common::AppendJsonString(out, absl::string_view(entry).substr(0, eq));
    out += ":";
    common::AppendJsonString(out, absl::string_view(entry).substr(eq + 1));
  }
  return out + "}";
}

StandbyPool::StandbyPool(ProcessControl& control, const common::Clock& clock,
                         std::vector<std::string> argv,
                         std::vector<std::string> env,
                         StandbyPoolOptions options)
    : control_(control),
      clock_(clock),
      options_(options),
      argv_(std::move(argv)),
      env_(std::move(env)),
      idle_start_(control.CanRestoreNormalPriority()) {}

StandbyPool::~StandbyPool() { Clear(); }

void StandbyPool::Fill(int count) {
  while (size() < count) {
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0) {
      spdlog::warn("cannot prewarm a worker: pipe failed: {}", strerror(errno));
      return;
    }
    Standby standby;
    standby.control_fd = fds[1];
    SpawnRequest request;
    request.argv = argv_;
    request.env = env_;
    request.idle_priority = idle_start_;
    request.env.push_back(absl::StrCat(common::env::kStandbyFd, "=", fds[0]));
    request.inherit_fds = {fds[0]};
    if (standby.progress.write_fd() >= 0) {
      request.inherit_fds.push_back(standby.progress.write_fd());
    }
    if (standby.control.child_fd() >= 0) {
      request.inherit_fds.push_back(standby.control.child_fd());
    }
    absl::StatusOr<pid_t> pid = control_.Spawn(request);
    close(fds[0]);
    standby.progress.CloseWriteEnd();
    standby.control.CloseReadEnd();
    if (!pid.ok()) {
      close(fds[1]);
      spdlog::warn("cannot prewarm a worker: {}",
                   std::string(pid.status().message()));
      return;
    }
    standby.pid = *pid;
    standby.started = clock_.Now();
    standby.idle = idle_start_;
    standbys_.push_back(std::move(standby));
  }
}

int StandbyPool::progress_fd(int i) const {
  return standbys_[i].progress.child_fd();
}

int StandbyPool::control_fd(int i) const {
  return standbys_[i].control.child_fd();
}

absl::StatusOr<std::vector<pid_t>> StandbyPool::Activate(
    const std::vector<std::vector<std::string>>& envs,
    std::vector<ProgressChannel>& progress,
    std::vector<ControlChannel>* controls) {
  if (envs.size() > standbys_.size()) {
    return absl::FailedPreconditionError(
        absl::StrFormat("%d prewarmed workers wait, %d are needed",
                        standbys_.size(), envs.size()));
  }
  for (size_t i = 0; i < envs.size(); ++i) {
    const Standby& s = standbys_[i];
    const pid_t pid = s.pid;
    // Back under the normal policy before it runs as a worker.
    absl::Status restored = s.idle ? control_.RestoreNormalPriority(pid)
                                   : absl::OkStatus();
    bool told = restored.ok() && WriteAll(s.control_fd, EnvToJson(envs[i]));
    int err = errno;
    close(standbys_[i].control_fd);
    standbys_[i].control_fd = -1;
    if (!told) {
      // Those told already run as workers of a group that cannot be
      // completed: end them too.
      for (size_t j = 0; j <= i; ++j) {
        control_.SignalGroup(standbys_[j].pid, SIGKILL);
      }
      standbys_.erase(standbys_.begin(), standbys_.begin() + i + 1);
      Clear();
      if (!restored.ok()) return restored;
      return absl::UnavailableError(
          absl::StrFormat("prewarmed worker %d (pid %d) is gone (%s)", i, pid,
                          strerror(err)));
    }
  }
  std::vector<pid_t> pids;
  for (size_t i = 0; i < envs.size(); ++i) {
    pids.push_back(standbys_[i].pid);
    progress.push_back(std::move(standbys_[i].progress));
    if (controls != nullptr) {
      controls->push_back(std::move(standbys_[i].control));
    }
  }
  standbys_.erase(standbys_.begin(), standbys_.begin() + envs.size());
  return pids;
}

void StandbyPool::PromoteLate() {
  const absl::Time now = clock_.Now();
  for (Standby& s : standbys_) {
    if (!s.idle || now - s.started < options_.idle_grace) continue;
    s.idle = false;
    absl::Status restored = control_.RestoreNormalPriority(s.pid);
    if (restored.ok()) {
      spdlog::debug("prewarmed worker pid {} started idle {} ago: now at "
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
    if (s.control_fd >= 0) close(s.control_fd);
  }
  standbys_.clear();
}

}  // namespace ddprun::launcher
