#include "rendezvous/core/store_write_rate.h"

#include <algorithm>

#include "absl/strings/str_format.h"

namespace ddprun::rendezvous {

StoreWriteRate::StoreWriteRate(const StoreWriteRateOptions& options)
    : options_(options) {}

absl::Duration StoreWriteRate::Cost(int64_t bytes) const {
  return absl::Seconds(static_cast<double>(bytes) /
                       static_cast<double>(options_.bytes_per_s));
}

WriteDecision StoreWriteRate::Admit(const std::string& run_id, int64_t bytes,
                                    absl::Time now) {
  WriteDecision decision;
  if (!enabled()) return decision;
  auto found = jobs_.find(run_id);
  const absl::Time paid_until =
      std::max(found == jobs_.end() ? now : found->second.paid_until, now) +
      Cost(bytes);
  const absl::Time release_at = paid_until - Cost(options_.burst_bytes);
  if (release_at > now) {
    const int64_t parked =
        found == jobs_.end() ? 0 : found->second.parked_bytes;
    if (parked + bytes > options_.max_parked_bytes) {
      decision.refused = absl::ResourceExhaustedError(absl::StrFormat(
          "job '%s' writes to the store faster than "
          "--max-job-store-write-bytes-per-s %d and already has %d bytes of "
          "writes waiting; %d more would pass --max-job-parked-write-bytes "
          "%d: wait for a write's answer before sending the next (or raise "
          "the limits)",
          run_id, options_.bytes_per_s, parked, bytes,
          options_.max_parked_bytes));
      return HoldOrRefuseNow(run_id, paid_until, release_at, decision);
    }
    if (total_parked_bytes_ + bytes > options_.max_total_parked_bytes) {
      decision.refused = absl::ResourceExhaustedError(absl::StrFormat(
          "job '%s' writes to the store faster than "
          "--max-job-store-write-bytes-per-s %d, and the server already holds "
          "%d bytes of writes waiting for their jobs' rates; %d more would "
          "pass the %d they may hold (a twentieth of --max-memory-bytes): "
          "wait for a write's answer before sending the next (or raise the "
          "limits)",
          run_id, options_.bytes_per_s, total_parked_bytes_, bytes,
          options_.max_total_parked_bytes));
      return HoldOrRefuseNow(run_id, paid_until, release_at, decision);
    }
    decision.release_at = release_at;
  }
  Job& job = jobs_[run_id];
  job.paid_until = paid_until;
  if (release_at > now) {
    job.parked_bytes += bytes;
    total_parked_bytes_ += bytes;
  }
  return decision;
}

WriteDecision StoreWriteRate::HoldOrRefuseNow(const std::string& run_id,
                                              absl::Time paid_until,
                                              absl::Time release_at,
                                              WriteDecision refusal) {
  if (held_refusals_ >= options_.max_held_refusals) return refusal;
  Job& job = jobs_[run_id];
  job.paid_until = paid_until;
  ++job.held_refusals;
  ++held_refusals_;
  refusal.release_at = release_at;
  return refusal;
}

int64_t StoreWriteRate::TotalParkedShare(int64_t max_memory_bytes,
                                         int64_t max_store_bytes) {
  return max_memory_bytes > 0 ? max_memory_bytes / 20 : max_store_bytes / 4;
}

void StoreWriteRate::Unpark(const std::string& run_id, int64_t bytes) {
  auto found = jobs_.find(run_id);
  if (found == jobs_.end()) return;
  const int64_t released = std::min(found->second.parked_bytes, bytes);
  found->second.parked_bytes -= released;
  total_parked_bytes_ -= released;
}

void StoreWriteRate::Unhold(const std::string& run_id) {
  auto found = jobs_.find(run_id);
  if (found == jobs_.end() || found->second.held_refusals == 0) return;
  --found->second.held_refusals;
  --held_refusals_;
}

void StoreWriteRate::ForgetIdle(absl::Time now) {
  absl::erase_if(jobs_, [now](const auto& entry) {
    return entry.second.paid_until <= now && entry.second.parked_bytes == 0 &&
           entry.second.held_refusals == 0;
  });
}

int64_t StoreWriteRate::parked_bytes(const std::string& run_id) const {
  auto found = jobs_.find(run_id);
  return found == jobs_.end() ? 0 : found->second.parked_bytes;
}

}  // namespace ddprun::rendezvous
