#include "worker/mnist_data.h"

#include <sys/stat.h>
#include <zlib.h>

#include <array>
#include <fstream>
#include <vector>

#include <ATen/ATen.h>

#include "absl/strings/str_format.h"

namespace ddprun::worker {
namespace {

constexpr uint32_t kImagesMagic = 2051;
constexpr uint32_t kLabelsMagic = 2049;
constexpr int64_t kRows = 28;
constexpr int64_t kCols = 28;
constexpr size_t kImagesHeader = 16;  // magic, count, rows, columns
constexpr size_t kLabelsHeader = 8;   // magic, count

struct Normalization {
  float mean;
  float std;
};

Normalization NormalizationOf(DatasetKind kind) {
  // torchvision's customary values for each set.
  if (kind == DatasetKind::kFashionMnist) return {0.2860f, 0.3530f};
  return {0.1307f, 0.3081f};
}

uint32_t BigEndian(const unsigned char* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) |
         (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

std::string Fix(const MnistOptions& options) {
  if (options.dataset == DatasetKind::kFashionMnist) {
    return "install Debian's dataset-fashion-mnist (apt-get install "
           "dataset-fashion-mnist), or point --data-dir at a folder with the "
           "four Fashion-MNIST IDX files";
  }
  return "run scripts/setup.sh to fetch the data, or point --data-dir at a "
         "folder with the four MNIST IDX files";
}

bool Exists(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0;
}

// The file's bytes; `path` or, when only that exists, `path`.gz (as Debian's
// dataset packages ship them) decompressed.
absl::StatusOr<std::vector<unsigned char>> ReadMaybeGzipped(
    std::string& path, const MnistOptions& options) {
  if (!Exists(path) && Exists(path + ".gz")) {
    path += ".gz";
    gzFile gz = gzopen(path.c_str(), "rb");
    if (gz == nullptr) {
      return absl::NotFoundError(absl::StrFormat(
          "MNIST file %s is unreadable; %s", path, Fix(options)));
    }
    std::vector<unsigned char> bytes;
    unsigned char buffer[1 << 16];
    int n;
    while ((n = gzread(gz, buffer, sizeof(buffer))) > 0) {
      bytes.insert(bytes.end(), buffer, buffer + n);
    }
    gzclose(gz);
    if (n < 0) {
      return absl::DataLossError(absl::StrFormat(
          "MNIST file %s is not a valid gzip file; %s", path, Fix(options)));
    }
    return bytes;
  }
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) {
    return absl::NotFoundError(absl::StrFormat(
        "MNIST file %s is missing or unreadable; %s", path, Fix(options)));
  }
  std::vector<unsigned char> bytes(static_cast<size_t>(in.tellg()));
  in.seekg(0);
  if (!in.read(reinterpret_cast<char*>(bytes.data()), bytes.size())) {
    return absl::DataLossError(absl::StrFormat(
        "MNIST file %s could not be read whole; %s", path, Fix(options)));
  }
  return bytes;
}

// Reads a whole IDX file and checks its header; returns the whole file (the
// payload starts after the header).
absl::StatusOr<std::vector<unsigned char>> ReadIdx(
    std::string path, uint32_t magic, int dims, const MnistOptions& options,
    int64_t* count) {
  absl::StatusOr<std::vector<unsigned char>> read =
      ReadMaybeGzipped(path, options);
  if (!read.ok()) return read.status();
  std::vector<unsigned char>& bytes = *read;
  const size_t header = 4 + 4 * static_cast<size_t>(dims);
  if (bytes.size() < header) {
    return absl::DataLossError(absl::StrFormat(
        "MNIST file %s is truncated (%d bytes, less than its %d-byte "
        "header); %s",
        path, bytes.size(), header, Fix(options)));
  }
  uint32_t found = BigEndian(bytes.data());
  if (found != magic) {
    return absl::DataLossError(absl::StrFormat(
        "MNIST file %s is corrupt: magic number %d, expected %d (is it "
        "gzipped, or the wrong file?); %s",
        path, found, magic, Fix(options)));
  }
  *count = BigEndian(bytes.data() + 4);
  size_t expected = header + static_cast<size_t>(*count);
  if (dims == 3) {
    uint32_t rows = BigEndian(bytes.data() + 8);
    uint32_t cols = BigEndian(bytes.data() + 12);
    if (rows != kRows || cols != kCols) {
      return absl::DataLossError(absl::StrFormat(
          "MNIST file %s is corrupt: images are %dx%d, expected 28x28; %s",
          path, rows, cols, Fix(options)));
    }
    expected = header + static_cast<size_t>(*count) * kRows * kCols;
  }
  if (bytes.size() != expected) {
    return absl::DataLossError(absl::StrFormat(
        "MNIST file %s is %s: %d bytes, expected %d for %d items; %s", path,
        bytes.size() < expected ? "truncated" : "corrupt (too long)",
        bytes.size(), expected, *count, Fix(options)));
  }
  return std::move(bytes);
}

absl::StatusOr<MnistSplit> LoadSplit(const MnistOptions& options,
                                     const std::string& prefix,
                                     int64_t limit) {
  const std::string images_path =
      absl::StrFormat("%s/%s-images-idx3-ubyte", options.data_dir, prefix);
  const std::string labels_path =
      absl::StrFormat("%s/%s-labels-idx1-ubyte", options.data_dir, prefix);
  int64_t num_images = 0;
  int64_t num_labels = 0;
  auto images = ReadIdx(images_path, kImagesMagic, 3, options, &num_images);
  if (!images.ok()) return images.status();
  auto labels = ReadIdx(labels_path, kLabelsMagic, 1, options, &num_labels);
  if (!labels.ok()) return labels.status();
  if (num_images != num_labels) {
    return absl::DataLossError(absl::StrFormat(
        "MNIST files %s (%d images) and %s (%d labels) do not match; %s",
        images_path, num_images, labels_path, num_labels, Fix(options)));
  }
  for (size_t i = kLabelsHeader; i < labels->size(); ++i) {
    const unsigned char label = (*labels)[i];
    if (label > 9) {
      return absl::DataLossError(absl::StrFormat(
          "MNIST file %s is corrupt: label %d is not a digit 0-9; %s",
          labels_path, label, Fix(options)));
    }
  }
  int64_t n = num_images;
  if (limit > 0 && limit < n) n = limit;
  const unsigned char* pixels = images->data() + kImagesHeader;
  const unsigned char* digits = labels->data() + kLabelsHeader;
  // A byte has 256 values: normalize those once with torchvision's ops (so
  // the floats are exactly Python's), then map every pixel through the table
  // in one pass.
  Normalization norm = NormalizationOf(options.dataset);
  at::Tensor table = at::arange(256, at::kFloat).div_(255.0f).sub_(norm.mean).div_(norm.std);
  const float* lookup = table.data_ptr<float>();
  MnistSplit split;
  split.images = at::empty({n, 1, kRows, kCols}, at::kFloat);
  float* out = split.images.data_ptr<float>();
  for (int64_t i = 0, total = n * kRows * kCols; i < total; ++i) {
    out[i] = lookup[pixels[i]];
  }
  split.labels = at::empty({n}, at::kLong);
  int64_t* label_out = split.labels.data_ptr<int64_t>();
  for (int64_t i = 0; i < n; ++i) label_out[i] = digits[i];
  return split;
}

}  // namespace

absl::StatusOr<DatasetKind> ParseDataset(const std::string& name) {
  if (name == "mnist") return DatasetKind::kMnist;
  if (name == "fashion-mnist") return DatasetKind::kFashionMnist;
  return absl::InvalidArgumentError(absl::StrFormat(
      "unknown dataset '%s'; use mnist or fashion-mnist", name));
}

std::string DefaultDataDir(DatasetKind kind) {
  return kind == DatasetKind::kFashionMnist ? "/usr/share/datasets/fashion-mnist"
                                            : "data/mnist";
}

absl::StatusOr<MnistData> LoadMnist(const MnistOptions& given) {
  MnistOptions options = given;
  if (options.data_dir.empty()) options.data_dir = DefaultDataDir(options.dataset);
  struct stat st;
  if (stat(options.data_dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return absl::NotFoundError(absl::StrFormat(
        "data folder %s does not exist; %s", options.data_dir, Fix(options)));
  }
  MnistData data;
  auto train = LoadSplit(options, "train", options.train_limit);
  if (!train.ok()) return train.status();
  auto test = LoadSplit(options, "t10k", options.test_limit);
  if (!test.ok()) return test.status();
  data.train = std::move(*train);
  data.test = std::move(*test);
  return data;
}

}  // namespace ddprun::worker
