#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "launcher/cli/launch_options.h"

namespace ddprun::launcher {

// Parses torchrun's --rdzv-conf "key=value,..." (durations in seconds,
// fractions allowed) over the defaults in `conf`. Unknown keys are an error,
// so that a typo does not silently keep a default.
absl::Status ParseRdzvConf(absl::string_view text, RdzvConf& conf);

// Parses "N" or "MIN:MAX" for --nnodes.
absl::Status ParseNnodes(absl::string_view text, int& min_nodes,
                         int& max_nodes);

// Parses "3" (every local rank) or "0:1,1:2" (per local rank) for --redirects
// and --tee; each value is 0..3.
absl::StatusOr<PerRankStreams> ParsePerRankStreams(absl::string_view flag,
                                                   absl::string_view text);

// Parses a duration in seconds ("0.1", "5").
absl::StatusOr<absl::Duration> ParseSeconds(absl::string_view flag,
                                            absl::string_view text);

// Parses "0,2,3".
absl::StatusOr<std::vector<int>> ParseIntList(absl::string_view flag,
                                              absl::string_view text);

}  // namespace ddprun::launcher
