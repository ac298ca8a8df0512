#include "worker/distributed_sampler.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/util/Exception.h>

#include <algorithm>

namespace ddprun::worker {

DistributedSampler::DistributedSampler(const DistributedSamplerOptions& options)
    : options_(options) {
  TORCH_CHECK(options_.world_size >= 1 && options_.rank >= 0 &&
                  options_.rank < options_.world_size,
              "DistributedSampler: rank ", options_.rank,
              " is outside a world of ", options_.world_size);
  TORCH_CHECK(options_.dataset_size >= 0, "DistributedSampler: dataset size ",
              options_.dataset_size);
  const int64_t n = options_.dataset_size;
  const int64_t w = options_.world_size;
  num_samples_ = options_.drop_last ? n / w : (n + w - 1) / w;
  SetEpoch(0);
}

void DistributedSampler::SetEpoch(int64_t epoch, int64_t consumed) {
  const int64_t n = options_.dataset_size;
  const int64_t w = options_.world_size;
  std::vector<int64_t> order(n);
  if (options_.shuffle && n > 0) {
    // Same generator and call as Python's DistributedSampler, so the order
    // matches torch's for the same seed and epoch.
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(
        options_.seed + static_cast<uint64_t>(epoch));
    at::Tensor perm = at::randperm(n, gen, at::TensorOptions(at::kLong));
    const int64_t* data = perm.data_ptr<int64_t>();
    order.assign(data, data + n);
  } else {
    for (int64_t i = 0; i < n; ++i) order[i] = i;
  }
  consumed_ = std::max<int64_t>(consumed, 0);
  if (consumed_ == 0) {
    const int64_t total = num_samples_ * w;
    if (total > n && n > 0) {
      // Pad by repeating the head, as torch does (possibly several times).
      for (int64_t i = n; i < total; ++i) order.push_back(order[(i - n) % n]);
    } else {
      order.resize(total);
    }
  } else {
    // A resumed epoch: the data set's samples after `consumed`, each once.
    // Padding, if the interrupted run had any, lies past n.
    order.erase(order.begin(), order.begin() + std::min(consumed_, n));
  }
  handed_out_ = static_cast<int64_t>(order.size());
  max_indices_ = (handed_out_ + w - 1) / w;
  indices_.clear();
  indices_.reserve(max_indices_);
  for (int64_t i = options_.rank; i < handed_out_; i += w) {
    indices_.push_back(order[i]);
  }
}

int64_t DistributedSampler::position(int64_t local_end) const {
  return consumed_ + std::min(handed_out_, std::max<int64_t>(local_end, 0) *
                                               options_.world_size);
}

int64_t DistributedSampler::samples_between(int64_t local_begin,
                                            int64_t local_end) const {
  // Positions past the data set's size are padding (repeats).
  const int64_t n = options_.dataset_size;
  return std::min(position(local_end), n) - std::min(position(local_begin), n);
}

}  // namespace ddprun::worker
