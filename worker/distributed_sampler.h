#pragma once

#include <cstdint>
#include <vector>

namespace ddprun::worker {

struct DistributedSamplerOptions {
  int64_t dataset_size = 0;
  int rank = 0;
  int world_size = 1;
  bool shuffle = true;
  uint64_t seed = 0;
  // Like torch's drop_last=False: pad with the first indices to a multiple
  // of world_size so every rank gets as many samples.
  bool drop_last = false;
};

// torch.utils.data.DistributedSampler, in C++ and with the same indices:
// epoch e shuffles with torch.randperm(n, generator seeded seed + e), pads
// (or drops) to a multiple of the world size, and gives rank r the indices
// r, r + W, r + 2W, ...  A resumed epoch (SetEpoch with `consumed` > 0)
// is never padded: its rest is split over the ranks unevenly (counts differ
// by one at most) so that no sample is seen twice. Not thread-safe.
class DistributedSampler {
 public:
  explicit DistributedSampler(const DistributedSamplerOptions& options);

  // Reshuffles for `epoch`; rank 0 and the others agree because they share
  // seed and epoch. `consumed` resumes inside the epoch: the first
  // `consumed` positions of the epoch's order (what every rank trained
  // before, in any world: see position()) are left out, and the rest of the
  // data set's samples is split rank::world without padding. With the world
  // size of the interrupted run this continues at exactly the next sample
  // of every rank; with another, no remaining sample is lost or repeated.
  void SetEpoch(int64_t epoch, int64_t consumed = 0);
  // This rank's indices for the current epoch, in order.
  const std::vector<int64_t>& indices() const { return indices_; }
  // Samples per rank in a whole (padded) epoch.
  int64_t num_samples() const { return num_samples_; }
  // The most indices any rank has this epoch (rank 0's): ranks with fewer
  // still take part in every step (ceil(max_indices / per step) steps), or
  // their peers would wait for them in a collective.
  int64_t max_indices() const { return max_indices_; }
  // Where the epoch's order stands once every rank trained its first
  // `local_end` indices (what SetEpoch takes as `consumed`).
  int64_t position(int64_t local_end) const;
  // Distinct samples of the data set (padding left out) that all ranks
  // together train in their indices [local_begin, local_end).
  int64_t samples_between(int64_t local_begin, int64_t local_end) const;

 private:
  DistributedSamplerOptions options_;
  int64_t num_samples_ = 0;
  int64_t consumed_ = 0;    // positions left out of this epoch
  int64_t handed_out_ = 0;  // positions split over the ranks this epoch
  int64_t max_indices_ = 0;
  std::vector<int64_t> indices_;
};

}  // namespace ddprun::worker
