#include "worker/worker_env.h"

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "common/worker_env.h"

namespace ddprun::worker {
namespace env = ::ddprun::common::env;
namespace {

class Reader {
 public:
  explicit Reader(const EnvLookup& lookup) : lookup_(lookup) {}

  std::optional<std::string> String(const char* name) {
    std::optional<std::string> value = lookup_(name);
    if (value.has_value() && value->empty()) return std::nullopt;
    return value;
  }

  // An integer variable in [min, max]; `fallback` when unset.
  absl::StatusOr<int64_t> Int(const char* name, int64_t fallback, int64_t min,
                              int64_t max) {
    std::optional<std::string> text = String(name);
    if (!text.has_value()) return fallback;
    int64_t value = 0;
    if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(*text), &value) ||
        value < min || value > max) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "environment variable %s='%s' is not an integer in [%d, %d]; "
          "unset it or launch the program with ddprun or torchrun, which "
          "set it",
          name, *text, min, max));
    }
    return value;
  }

 private:
  const EnvLookup& lookup_;
};

}  // namespace

std::string WorkerEnv::Describe() const {
  return absl::StrFormat("rank %d of %d (local %d of %d)", rank, world_size,
                         local_rank, local_world_size);
}

absl::StatusOr<WorkerEnv> ReadWorkerEnv() {
  return ReadWorkerEnvFrom(&common::ProcessEnv);
}

absl::StatusOr<WorkerEnv> ReadWorkerEnvFrom(const EnvLookup& lookup) {
  Reader r(lookup);
  constexpr int64_t kMaxWorld = 1 << 20;
  WorkerEnv e;
  if (std::optional<std::string> standby = r.String(env::kStandbyFd)) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "%s=%s is set: this prewarmed process has no round yet; call "
        "ddprun::worker::AwaitActivation() (worker/standby.h) before reading "
        "the worker environment",
        env::kStandbyFd, *standby));
  }
  DDPRUN_ASSIGN_OR_RETURN(e.world_size,
                          r.Int(env::kWorldSize, 1, 1, kMaxWorld));
  DDPRUN_ASSIGN_OR_RETURN(e.rank, r.Int(env::kRank, 0, 0, e.world_size - 1));
  DDPRUN_ASSIGN_OR_RETURN(e.local_world_size,
                          r.Int(env::kLocalWorldSize, 1, 1, e.world_size));
  DDPRUN_ASSIGN_OR_RETURN(e.local_rank,
                          r.Int(env::kLocalRank, 0, 0, e.local_world_size - 1));
  DDPRUN_ASSIGN_OR_RETURN(e.master_port, r.Int(env::kMasterPort, 0, 0, 65535));
  DDPRUN_ASSIGN_OR_RETURN(e.restart_count,
                          r.Int(env::kRestartCount, 0, 0, 1 << 30));
  DDPRUN_ASSIGN_OR_RETURN(e.round, r.Int(env::kRound, 0, 0, INT64_MAX));
  DDPRUN_ASSIGN_OR_RETURN(e.progress_fd,
                          r.Int(env::kProgressFd, -1, 0, 1 << 20));
  DDPRUN_ASSIGN_OR_RETURN(e.control_fd, r.Int(env::kControlFd, -1, 0, 1 << 20));
  e.master_addr = r.String(env::kMasterAddr).value_or("");
  e.error_file = r.String(env::kErrorFile).value_or("");
  e.store_endpoint = r.String(env::kStoreEndpoint).value_or("");
  e.store_run_id = r.String(env::kStoreRunId).value_or("");
  e.local_addr = r.String(env::kLocalAddr).value_or("");
  DDPRUN_ASSIGN_OR_RETURN(e.credentials, common::Credentials::FromEnv(lookup));
  e.use_agent_store = r.String(env::kUseAgentStore).value_or("") == "True";
  e.gloo_socket_ifname = r.String(env::kGlooSocketIfname).value_or("");

  if (e.world_size > 1 && e.store_endpoint.empty() && e.master_addr.empty()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s=%d but neither %s nor %s is set, so the workers cannot meet; "
        "launch with ddprun (or torchrun), or set %s=1",
        env::kWorldSize, e.world_size, env::kStoreEndpoint, env::kMasterAddr,
        env::kWorldSize));
  }
  return e;
}

std::string ReadShmDir(const EnvLookup& lookup) {
  return lookup(env::kShmDir).value_or("");
}

std::optional<std::string> ReadStandbyFd(const EnvLookup& lookup) {
  return lookup(env::kStandbyFd);
}

std::string ReadErrorFilePath(const EnvLookup& lookup) {
  return lookup(env::kErrorFile).value_or("");
}

}  // namespace ddprun::worker
