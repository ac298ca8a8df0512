#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace ddprun::worker {

// --dataset: both have the same IDX files and shapes.
enum class DatasetKind { kMnist, kFashionMnist };
absl::StatusOr<DatasetKind> ParseDataset(const std::string& name);

// One split held in memory once, decoded and normalized (once per node,
// with MnistOptions::cache_dir).
struct MnistSplit {
  at::Tensor images;  // [N, 1, 28, 28] float32, (x/255 - mean) / std
  at::Tensor labels;  // [N] int64
  int64_t size() const { return labels.defined() ? labels.size(0) : 0; }
};

struct MnistData {
  MnistSplit train;
  MnistSplit test;
};

// Where each set is unless --data-dir says otherwise: data/mnist (what
// scripts/setup.sh fills) and Debian's dataset-fashion-mnist folder.
std::string DefaultDataDir(DatasetKind kind);

struct MnistOptions {
  std::string data_dir;  // empty: DefaultDataDir(dataset)
  DatasetKind dataset = DatasetKind::kMnist;
  int64_t train_limit = 0;  // > 0: keep the first N training samples
  int64_t test_limit = 0;   // > 0: keep the first N test samples
  // Non-empty: a shared-memory folder (DDPRUN_SHM_DIR) through which the
  // node's workers decode the images once and hold them once (MapOrBuild);
  // the images tensors are then read-only.
  std::string cache_dir;
};

// Validates the four IDX files (or their .gz) (magic numbers 2051/2049, image
// and label counts that agree, 28x28, file sizes) and loads them normalized
// like torchvision (mean 0.1307, std 0.3081 for MNIST). A missing, truncated or
// corrupt file is one error line that names the file and the fix.
absl::StatusOr<MnistData> LoadMnist(const MnistOptions& options);

// The quick part of LoadMnist's checks: the folder, each file's header, and
// the sizes of uncompressed files; reads no payload. For an error before
// anything slow starts (LoadMnist still checks everything).
absl::Status CheckMnistFiles(const MnistOptions& options);

}  // namespace ddprun::worker
