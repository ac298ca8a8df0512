#include "rendezvous/core/limits.h"

#include "absl/strings/str_format.h"

namespace ddprun::rendezvous {

absl::Status CheckStoreSizes(const Limits& limits, const v1::StoreScope& scope,
                             const std::string& key, size_t value_bytes) {
  if (static_cast<int64_t>(scope.run_id().size()) > limits.max_id_bytes) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "store scope run_id is %d bytes; the limit max_id_bytes is %d",
        scope.run_id().size(), limits.max_id_bytes));
  }
  if (static_cast<int64_t>(key.size()) > limits.max_key_bytes) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "store key is %d bytes; the limit max_key_bytes is %d; use shorter "
        "keys",
        key.size(), limits.max_key_bytes));
  }
  if (static_cast<int64_t>(value_bytes) > limits.max_value_bytes) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "store value is %d bytes; the limit max_value_bytes is %d; the store "
        "is for small coordination values, not data",
        value_bytes, limits.max_value_bytes));
  }
  return absl::OkStatus();
}

absl::Status ValidateLimits(const Limits& limits) {
  struct Bound {
    const char* flag;
    int64_t value;
  };
  const Bound positive[] = {
      {"--max-value-bytes", limits.max_value_bytes},
      {"--max-keys-per-scope", limits.max_keys_per_scope},
      {"--max-store-bytes", limits.max_store_bytes},
      {"--max-job-store-bytes", limits.max_job_store_bytes},
      {"--max-job-store-keys", limits.max_job_store_keys},
      {"--max-nodes-per-job", limits.max_nodes_per_job},
      {"--max-jobs", limits.max_jobs},
      {"--job-store-write-burst-bytes", limits.job_store_write_burst_bytes},
      {"--max-job-parked-write-bytes", limits.max_job_parked_write_bytes},
  };
  for (const Bound& b : positive) {
    if (b.value < 1) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s %d: must be at least 1, or the server could serve no job; "
          "leave the flag out for its default",
          b.flag, b.value));
    }
  }
  const Bound non_negative[] = {
      {"--max-memory-bytes", limits.max_memory_bytes},
      {"--max-job-store-write-bytes-per-s",
       limits.max_job_store_write_bytes_per_s},
      {"--max-held-store-refusals", limits.max_held_store_refusals},
  };
  for (const Bound& b : non_negative) {
    if (b.value < 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s %d: must be 0 (off) or more; leave the flag out for its "
          "default",
          b.flag, b.value));
    }
  }
  if (limits.max_value_bytes > limits.max_message_bytes) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--max-value-bytes %d is larger than a request may be (%d bytes); "
        "give at most %d",
        limits.max_value_bytes, limits.max_message_bytes,
        limits.max_message_bytes));
  }
  if (limits.max_memory_bytes != 0 &&
      limits.max_memory_bytes < kMinMemoryBytes) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--max-memory-bytes %d: the server alone takes more than that, so "
        "every store write would be refused; give at least %d (64 MiB), or "
        "0 for no bound",
        limits.max_memory_bytes, kMinMemoryBytes));
  }
  return absl::OkStatus();
}

}  // namespace ddprun::rendezvous
