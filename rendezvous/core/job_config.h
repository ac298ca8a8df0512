#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "ddprun/v1/rendezvous.pb.h"

namespace ddprun::rendezvous {

// Defaults for JobConfig fields a Join leaves at 0 (proto3 cannot tell 0 from
// unset). They follow torchrun where torchrun has a value, and are shorter
// where ddprun's server-side waits make a shorter value safe.
inline constexpr int kDefaultMinNodes = 1;  // max defaults to min
inline constexpr int64_t kDefaultLastCallTimeoutMs = 1000;  // after MIN joined
inline constexpr int64_t kDefaultJoinTimeoutMs = 600000;    // torchrun: 600 s
inline constexpr int64_t kDefaultHeartbeatIntervalMs = 1000;
inline constexpr int64_t kDefaultHeartbeatTimeoutMs = 5000;

// Fills the defaults above into `config` and checks it is coherent
// (1 <= min <= max, no negative durations, heartbeat timeout longer than the
// interval). INVALID_ARGUMENT names the field and the value.
absl::StatusOr<v1::JobConfig> NormalizeJobConfig(v1::JobConfig config);

// Empty when the two normalized configs agree; otherwise a sentence naming
// the first field that differs and both values.
std::string DescribeConfigDifference(const v1::JobConfig& job,
                                     const v1::JobConfig& request);

}  // namespace ddprun::rendezvous
