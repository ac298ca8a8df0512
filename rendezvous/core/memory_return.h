#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>

#include "absl/time/time.h"

namespace ddprun::rendezvous {

struct MemoryReturnOptions {
  // A fan-out of at least this many parked calls is large enough to give
  // its memory back after. 0: never.
  size_t large_fan_out = 10000;
  // The Join traffic has calmed when fewer than large_fan_out / 10 Join
  // calls came in one window of this length.
  absl::Duration quiet_window = absl::Seconds(1);
  // The first trim waits for the fan-out's end at most this long.
  absl::Duration max_wait = absl::Seconds(30);
};

// What the server sees on one tick.
struct FanOutState {
  size_t parked = 0;       // calls parked now
  size_t peak_parked = 0;  // the most parked at once since the last tick
  int64_t join_calls = 0;  // every Join call received so far
  // Decisions waiting for their polling node's next poll (JobTable's).
  int64_t answers_for_poll = 0;
};

// When to give back to the system the memory a large fan-out of parked
// calls held (glibc keeps freed memory for reuse, so the server would stay
// at its peak). Decides only; Server trims (malloc_trim). Not thread-safe:
// the ticker thread calls it.
//
// Why it waits for the fan-out's end: a large job's fan-out is its parked
// calls' answers and then its polling nodes' collecting polls, seconds of
// calls. Trimming in their midst (1 s and 5 s after the close, before)
// returned pages the next calls faulted in again and held glibc's arena
// locks while it walked them: the server spent ~0.8 of its ~4.3 CPU-s of a
// 100,000-node fan-out more than with no trim (bench/rendezvous/README.md).
// So the first trim comes once no decision waits for a poll and fewer than
// large_fan_out / 10 Joins came in a quiet_window (or max_wait after the
// fan-out), then two more 4 s and 19 s later for the memory gRPC frees late
// (answers still being sent).
class MemoryReturn {
 public:
  explicit MemoryReturn(MemoryReturnOptions options = {}) : options_(options) {}

  // Called on every tick. True: trim now.
  bool Tick(absl::Time now, const FanOutState& state);
  // Whether the next Tick looks at answers_for_poll (the caller may skip
  // counting them otherwise).
  bool wants_answers_for_poll() const {
    return fan_out_at_.has_value() && !first_trim_at_.has_value();
  }

 private:
  const MemoryReturnOptions options_;
  size_t peak_ = 0;
  // Set from the fan-out until its last trim.
  std::optional<absl::Time> fan_out_at_;
  std::optional<absl::Time> first_trim_at_;
  int trims_ = 0;  // of this fan-out
  // The current window of Join calls: when it began, the count then.
  absl::Time window_start_ = absl::InfinitePast();
  int64_t window_calls_ = 0;
};

}  // namespace ddprun::rendezvous
