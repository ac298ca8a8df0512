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
// r, r + W, r + 2W, ...  Not thread-safe.
class DistributedSampler {
 public:
  explicit DistributedSampler(const DistributedSamplerOptions& options);

  // Reshuffles for `epoch`; rank 0 and the others agree because they share
  // seed and epoch. `consumed` resumes inside the epoch: that many samples
  // of the epoch's (padded) order, counted over all ranks, were trained
  // already and are left out; the rest is split rank::world as usual. With
  // the world size of the interrupted run this continues at exactly the next
  // sample of every rank; with another world size, no remaining sample is
  // lost or repeated (beyond padding).
  void SetEpoch(int64_t epoch, int64_t consumed = 0);
  // This rank's indices for the current epoch, in order.
  const std::vector<int64_t>& indices() const { return indices_; }
  // Samples per rank in a whole epoch.
  int64_t num_samples() const { return num_samples_; }

 private:
  DistributedSamplerOptions options_;
  int64_t num_samples_ = 0;
  std::vector<int64_t> indices_;
};

}  // namespace ddprun::worker
