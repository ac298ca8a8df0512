#include "rendezvous/core/job_config.h"

#include "absl/strings/str_format.h"

namespace ddprun::rendezvous {

absl::StatusOr<v1::JobConfig> NormalizeJobConfig(v1::JobConfig config) {
  if (config.min_nodes() < 0 || config.max_nodes() < 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("bad --nnodes %d:%d: node counts must be positive",
                        config.min_nodes(), config.max_nodes()));
  }
  if (config.min_nodes() == 0) {
    config.set_min_nodes(config.max_nodes() > 0 ? config.max_nodes()
                                                : kDefaultMinNodes);
  }
  if (config.max_nodes() == 0) config.set_max_nodes(config.min_nodes());
  if (config.min_nodes() > config.max_nodes()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "bad --nnodes %d:%d: MIN is larger than MAX; write MIN:MAX with "
        "MIN <= MAX",
        config.min_nodes(), config.max_nodes()));
  }
  if (config.max_restarts() < 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "bad max_restarts %d: it must be 0 or more", config.max_restarts()));
  }
  struct Duration {
    const char* name;
    int64_t value;
    void (v1::JobConfig::*set)(int64_t);
    int64_t fallback;
  };
  const Duration durations[] = {
      {"last_call_timeout_ms", config.last_call_timeout_ms(),
       &v1::JobConfig::set_last_call_timeout_ms, kDefaultLastCallTimeoutMs},
      {"join_timeout_ms", config.join_timeout_ms(),
       &v1::JobConfig::set_join_timeout_ms, kDefaultJoinTimeoutMs},
      {"heartbeat_interval_ms", config.heartbeat_interval_ms(),
       &v1::JobConfig::set_heartbeat_interval_ms, kDefaultHeartbeatIntervalMs},
      {"heartbeat_timeout_ms", config.heartbeat_timeout_ms(),
       &v1::JobConfig::set_heartbeat_timeout_ms, kDefaultHeartbeatTimeoutMs},
  };
  for (const Duration& d : durations) {
    if (d.value < 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "bad %s %d: durations must be 0 (default) or positive", d.name,
          d.value));
    }
    if (d.value == 0) (config.*d.set)(d.fallback);
  }
  if (config.heartbeat_timeout_ms() <= config.heartbeat_interval_ms()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "bad heartbeat settings: heartbeat_timeout_ms %d must be larger than "
        "heartbeat_interval_ms %d, or every node is dropped between beats",
        config.heartbeat_timeout_ms(), config.heartbeat_interval_ms()));
  }
  return config;
}

std::string DescribeConfigDifference(const v1::JobConfig& job,
                                     const v1::JobConfig& request) {
  struct Field {
    const char* name;
    int64_t job_value;
    int64_t request_value;
  };
  const Field fields[] = {
      {"min_nodes", job.min_nodes(), request.min_nodes()},
      {"max_nodes", job.max_nodes(), request.max_nodes()},
      {"max_restarts", job.max_restarts(), request.max_restarts()},
      {"last_call_timeout_ms", job.last_call_timeout_ms(),
       request.last_call_timeout_ms()},
      {"join_timeout_ms", job.join_timeout_ms(), request.join_timeout_ms()},
      {"heartbeat_interval_ms", job.heartbeat_interval_ms(),
       request.heartbeat_interval_ms()},
      {"heartbeat_timeout_ms", job.heartbeat_timeout_ms(),
       request.heartbeat_timeout_ms()},
  };
  for (const Field& f : fields) {
    if (f.job_value != f.request_value) {
      return absl::StrFormat(
          "the job runs with %s=%d but this node asks for %s=%d; start every "
          "node with the same --nnodes, --max-restarts and --rdzv-conf",
          f.name, f.job_value, f.name, f.request_value);
    }
  }
  return "";
}

}  // namespace ddprun::rendezvous
