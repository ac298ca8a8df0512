#pragma once

#include <cstdint>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/time/time.h"

namespace ddprun::rendezvous {

struct StoreWriteRateOptions {
  // Request bytes per second one job's store writes may arrive at before
  // they are answered late (Limits::max_job_store_write_bytes_per_s);
  // 0: no rate.
  int64_t bytes_per_s = 0;
  // What a job that wrote nothing for a while may write at once.
  int64_t burst_bytes = 0;
  // Bytes of one job's writes parked at once; a write that would pass it is
  // refused instead of parked.
  int64_t max_parked_bytes = 0;
  // The same for all jobs' parked writes together: what the server's
  // memory bound leaves them (StoreWriteRate::TotalParkedShare).
  int64_t max_total_parked_bytes = 0;
  // Refusals past those caps held at once, all jobs together: a held
  // refusal is answered when the job's rate has paid for its bytes, as a
  // parked write would be, so that a client with more calls in flight than
  // the parked caps allow still slows down to the rate instead of resending
  // as fast as the refusals come (a hog on 32 connections took the server's
  // CPU that way). It holds its call but not the request's payload (the
  // caller drops it). Past this count a refusal is answered at once and
  // charges nothing. 0: every refusal at once.
  int64_t max_held_refusals = 0;
};

// The decision for one store write.
struct WriteDecision {
  // InfinitePast: answer now. Otherwise park the write (or hold its
  // refusal) until then.
  absl::Time release_at = absl::InfinitePast();
  // Not OK: refuse the write (RESOURCE_EXHAUSTED, naming the limit), now or
  // at release_at; a held refusal is given back with Unhold.
  absl::Status refused;
};

// Back-pressure on store writes, per job (run_id): a rate of request bytes
// kept as a virtual-time token bucket (GCRA). Each job has the time its
// bucket has paid for everything it was charged; a write of b bytes
// advances that time by b / rate from max(then, now). A write is answered at
// once while that time is at most burst / rate ahead of now, and otherwise
// when it is: its delay is exactly what the bucket needs, writes leave in
// the order they came, and a job that stops writing regains its burst at
// the rate. Every write is charged, stored or refused later alike: the
// server received its bytes either way.
//
// A parked write holds its request, so a job's parked bytes are capped:
// past max_parked_bytes a write is refused instead; so is one that would
// take all jobs' parked writes past max_total_parked_bytes. The refusal is
// charged and held until the rate has paid for it while fewer than
// max_held_refusals are held, and is otherwise answered at once, charging
// nothing. Pure: no clock, no lock (the caller holds one).
class StoreWriteRate {
 public:
  explicit StoreWriteRate(const StoreWriteRateOptions& options);

  // Charges `bytes` to `run_id` at `now`; a parked write's bytes count as
  // parked until Unparked.
  WriteDecision Admit(const std::string& run_id, int64_t bytes, absl::Time now);
  // A parked write was answered or cancelled.
  void Unpark(const std::string& run_id, int64_t bytes);
  // A held refusal was answered or cancelled.
  void Unhold(const std::string& run_id);
  // Forgets jobs whose bucket is full again and that park nothing (their
  // state equals a new job's).
  void ForgetIdle(absl::Time now);

  // All jobs' parked writes may hold a twentieth of the server's memory
  // bound (max_memory_bytes; the hostile-load goal is the bound + 10 %),
  // or a quarter of the store's cap when there is no bound.
  static int64_t TotalParkedShare(int64_t max_memory_bytes,
                                  int64_t max_store_bytes);

  int64_t parked_bytes(const std::string& run_id) const;
  int64_t total_parked_bytes() const { return total_parked_bytes_; }
  int64_t held_refusals() const { return held_refusals_; }
  size_t num_jobs() const { return jobs_.size(); }
  bool enabled() const { return options_.bytes_per_s > 0; }

 private:
  struct Job {
    absl::Time paid_until = absl::InfinitePast();
    int64_t parked_bytes = 0;
    int64_t held_refusals = 0;
  };
  absl::Duration Cost(int64_t bytes) const;
  // `refusal` held until `release_at`, its bytes charged, while fewer than
  // max_held_refusals are held; else as it is (at once, charging nothing).
  WriteDecision HoldOrRefuseNow(const std::string& run_id,
                                absl::Time paid_until, absl::Time release_at,
                                WriteDecision refusal);

  const StoreWriteRateOptions options_;
  absl::flat_hash_map<std::string, Job> jobs_;
  int64_t total_parked_bytes_ = 0;
  int64_t held_refusals_ = 0;
};

}  // namespace ddprun::rendezvous
