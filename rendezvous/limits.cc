#include "rendezvous/limits.h"

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

}  // namespace ddprun::rendezvous
