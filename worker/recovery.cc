#include "worker/recovery.h"

#include <ATen/ATen.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <string.h>
#include <unistd.h>

#include <map>
#include <utility>

#include "absl/strings/str_format.h"
#include "common/progress_record.h"
#include "common/worker_env.h"
#include "spdlog/spdlog.h"
#include "worker/abortable.h"
#include "worker/collective_abort.h"
#include "worker/error_file.h"
#include "worker/exception_text.h"
#include "worker/phase.h"
#include "worker/standby.h"

namespace ddprun::worker {
namespace env = ::ddprun::common::env;
namespace {

// Tells the agent (common/progress_record.h's kInPlaceLine) that this
// program recovers in place.
void WriteDeclaration(int progress_fd) {
  if (progress_fd < 0) return;
  ssize_t n;
  do {
    n = write(progress_fd, common::kInPlaceLine,
              sizeof(common::kInPlaceLine) - 1);
  } while (n < 0 && errno == EINTR);
  if (n < 0) {
    spdlog::warn(
        "cannot tell ddprun that this worker recovers in place ({}): "
        "a failure restarts every worker",
        strerror(errno));
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<Membership>> Membership::Start(
    const WorkerEnv& env, const MembershipOptions& options) {
  std::unique_ptr<Membership> m(new Membership(env.control_fd, options));
  if (!m->enabled()) return m;
  if (pipe2(m->wake_, O_CLOEXEC) != 0) {
    return absl::InternalError(absl::StrFormat(
        "in-place recovery: cannot make a pipe: %s", strerror(errno)));
  }
  m->watcher_ = std::thread([p = m.get()] { p->Watch(); });
  WriteDeclaration(env.progress_fd);
  return m;
}

Membership::Membership(int control_fd, MembershipOptions options)
    : control_fd_(control_fd), options_(options) {}

Membership::~Membership() {
  if (watcher_.joinable()) {
    char byte = 0;
    (void)!write(wake_[1], &byte, 1);
    watcher_.join();
  }
  for (int fd : wake_) {
    if (fd >= 0) close(fd);
  }
}

void Membership::Watch() {
  std::string buffer;
  char chunk[16384];
  while (true) {
    struct pollfd fds[2] = {{control_fd_, POLLIN, 0}, {wake_[0], POLLIN, 0}};
    int ready = poll(fds, 2, -1);
    if (ready < 0 && errno == EINTR) continue;
    if (ready < 0 || (fds[1].revents & POLLIN) != 0) return;
    ssize_t n = read(control_fd_, chunk, sizeof(chunk));
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n <= 0) {
      absl::MutexLock lock(&mu_);
      closed_ = true;
      if (n < 0) channel_error_ = strerror(errno);
      return;
    }
    buffer.append(chunk, static_cast<size_t>(n));
    size_t newline;
    while ((newline = buffer.find('\n')) != std::string::npos) {
      std::string line = buffer.substr(0, newline);
      buffer.erase(0, newline + 1);
      if (line.empty()) continue;
      // The abort and the flag first, the round last: NextRound may take
      // the round the moment it is queued, and then clears both. Set after
      // it, they would abort the new group's first collective and leave
      // the worker waiting for a round that never comes (a hang).
      pending_.store(true);
      RequestCollectiveAbort();
      {
        absl::MutexLock lock(&mu_);
        rounds_.push_back(std::move(line));
      }
    }
  }
}

absl::StatusOr<WorkerEnv> Membership::NextRound(const absl::Status& cause) {
  auto failed = [&](const std::string& why) {
    if (!cause.ok()) {
      return absl::Status(cause.code(),
                          absl::StrFormat("%s (and %s)", cause.message(), why));
    }
    return absl::UnavailableError(why);
  };
  if (!enabled()) return failed("no in-place recovery without ddprun");
  std::string json;
  {
    absl::MutexLock lock(&mu_);
    auto arrived = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
      return !rounds_.empty() || closed_;
    };
    mu_.AwaitWithTimeout(absl::Condition(&arrived),
                         absl::FromChrono(options_.round_timeout));
    if (rounds_.empty()) {
      return failed(
          closed_ ? absl::StrFormat(
                        "ddprun closed %s%s%s: no next round", env::kControlFd,
                        channel_error_.empty() ? "" : ": ", channel_error_)
                  : absl::StrFormat("no next round from ddprun within %d ms",
                                    options_.round_timeout.count()));
    }
    // Only the newest round counts: rounds that formed while this worker
    // was busy are already over.
    json = std::move(rounds_.back());
    rounds_.clear();
    pending_.store(false);
    ClearCollectiveAbort();
  }
  absl::StatusOr<std::vector<std::pair<std::string, std::string>>> vars =
      ParseEnvJson(json);
  if (!vars.ok()) return vars.status();
  std::map<std::string, std::string> lookup_map(vars->begin(), vars->end());
  absl::StatusOr<WorkerEnv> next = ReadWorkerEnvFrom(
      [&lookup_map](const char* name) -> std::optional<std::string> {
        auto it = lookup_map.find(name);
        if (it == lookup_map.end()) return std::nullopt;
        return it->second;
      });
  if (!next.ok()) return next.status();
  if (!next->error_file.empty()) InstallErrorFileHandlers(next->error_file);
  return next;
}

namespace {

// `join`'s outcome, exceptions (Gloo's and c10d's errors: a peer's
// connection reset) as UNAVAILABLE.
absl::Status TryJoin(
    const WorkerEnv& env,
    const std::function<absl::Status(const WorkerEnv&)>& join) {
  try {
    return join(env);
  } catch (const std::exception& e) {
    return absl::UnavailableError(ExceptionText(e));
  }
}

// Whether a failed join means its round ended while it formed, so that the
// next round may follow (JoinNextRound).
bool RoundEndedWhileForming(const absl::Status& joined) {
  switch (joined.code()) {
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kAborted:
    case absl::StatusCode::kDeadlineExceeded:
    case absl::StatusCode::kCancelled:
      return true;
    default:
      return false;
  }
}

absl::Status EndedWhileForming(const WorkerEnv& env,
                               const absl::Status& joined) {
  spdlog::warn("round {} ended while it formed ({}); waiting for the next",
               env.round, std::string(joined.message()));
  // Its agent ends the round if nobody else does.
  ReportRoundFailed(env.progress_fd);
  return absl::Status(joined.code(),
                      absl::StrFormat("joining round %d failed: %s", env.round,
                                      joined.message()));
}

}  // namespace

absl::StatusOr<WorkerEnv> Membership::JoinNextRound(
    absl::Status cause,
    const std::function<absl::Status(const WorkerEnv&)>& join) {
  while (true) {
    absl::StatusOr<WorkerEnv> env = NextRound(cause);
    if (!env.ok()) return env.status();
    const absl::Status joined = TryJoin(*env, join);
    if (joined.ok()) return env;
    if (!RoundEndedWhileForming(joined)) return joined;
    cause = EndedWhileForming(*env, joined);
  }
}

absl::StatusOr<WorkerEnv> Membership::JoinFirstRound(
    const WorkerEnv& first,
    const std::function<absl::Status(const WorkerEnv&)>& join) {
  const absl::Status joined = TryJoin(first, join);
  if (joined.ok()) return first;
  if (!enabled() || !RoundEndedWhileForming(joined)) return joined;
  return JoinNextRound(EndedWhileForming(first, joined), join);
}

namespace {

// Waits for one collective of the state sync, telling the agent that this
// rank entered it (its work is started) and that it completed: a rank
// outside the sync's collectives that a local peer got ahead of, asleep,
// is deadlocked in the sync (worker/phase.h).
void AwaitSyncCollective(const ProcessGroup& group,
                         const c10::intrusive_ptr<::c10d::Work>& work) {
  ReportCollective(group.progress_fd);
  WaitOrAbandon(group.collectives, work);
  ReportCollectiveDone(group.progress_fd);
}

}  // namespace

absl::StatusOr<int> SyncFromSurvivor(const ProcessGroup& group, bool has_state,
                                     int64_t version,
                                     std::vector<int64_t>& record,
                                     const std::vector<at::Tensor>& tensors,
                                     const StateSyncOptions& options) {
  ReportPhase(group.progress_fd, common::Phase::kSync);
  if (!group.collectives) return has_state ? group.rank : -1;
  const int64_t world = group.world_size;
  // One allreduce(max) of a key that orders (has state, version, -rank).
  const int64_t key = has_state ? std::max<int64_t>(version, 0) * world +
                                      (world - 1 - group.rank)
                                : -1;
  std::vector<at::Tensor> keys = {
      at::tensor({key}, at::kLong).to(group.device)};
  ::c10d::AllreduceOptions max;
  max.reduceOp = ::c10d::ReduceOp::MAX;
  AwaitSyncCollective(group, group.collectives->allreduce(keys, max));
  const int64_t best = keys[0].cpu().item<int64_t>();
  if (best < 0) return -1;
  const int source = static_cast<int>(world - 1 - best % world);

  ::c10d::BroadcastOptions from_source;
  from_source.rootRank = source;
  std::vector<at::Tensor> size = {
      at::tensor({static_cast<int64_t>(record.size())}, at::kLong)
          .to(group.device)};
  AwaitSyncCollective(group, group.collectives->broadcast(size, from_source));
  const int64_t n = size[0].cpu().item<int64_t>();
  std::vector<int64_t> received;
  if (n > 0) {
    std::vector<int64_t> padded = record;
    padded.resize(n, 0);
    std::vector<at::Tensor> values = {
        at::tensor(padded, at::kLong).to(group.device)};
    AwaitSyncCollective(group,
                        group.collectives->broadcast(values, from_source));
    at::Tensor on_host = values[0].cpu();
    const int64_t* v = on_host.data_ptr<int64_t>();
    received.assign(v, v + n);
  }
  if (options.before_tensors) options.before_tensors(source);
  // One broadcast per dtype, not one per tensor: each is a round trip
  // while every rank waits (bench/launcher/inplace_recovery.py
  // --breakdown, "state synced"). Received into copies: nothing changes
  // before every broadcast completed.
  at::NoGradGuard no_grad;
  std::map<at::ScalarType, std::vector<at::Tensor>> by_type;
  for (const at::Tensor& t : tensors) {
    by_type[t.scalar_type()].push_back(t.detach());
  }
  std::vector<std::pair<std::vector<at::Tensor>*, at::Tensor>> flats;
  for (auto& [type, same_type] : by_type) {
    std::vector<at::Tensor> flat_parts;
    for (const at::Tensor& t : same_type) flat_parts.push_back(t.reshape({-1}));
    std::vector<at::Tensor> flat = {at::cat(flat_parts)};
    AwaitSyncCollective(group, group.collectives->broadcast(flat, from_source));
    flats.emplace_back(&same_type, flat[0]);
  }
  for (auto& [same_type, flat] : flats) {
    int64_t offset = 0;
    for (at::Tensor& t : *same_type) {
      t.copy_(flat.narrow(0, offset, t.numel()).view_as(t));
      offset += t.numel();
    }
  }
  record = std::move(received);
  return source;
}

}  // namespace ddprun::worker
