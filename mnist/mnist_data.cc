#include "mnist/mnist_data.h"

#include <ATen/ATen.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_format.h"
#include "spdlog/spdlog.h"
#include "worker/node_cache.h"

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

// An IDX file's bytes: mapped (an uncompressed file, straight from the page
// cache) or decompressed.
class IdxBytes {
 public:
  explicit IdxBytes(std::vector<unsigned char> owned)
      : owned_(std::move(owned)) {}
  explicit IdxBytes(std::shared_ptr<const MappedBytes> mapped)
      : mapped_(std::move(mapped)) {}
  const unsigned char* data() const {
    return mapped_ ? static_cast<const unsigned char*>(mapped_->data())
                   : owned_.data();
  }
  size_t size() const { return mapped_ ? mapped_->size() : owned_.size(); }

 private:
  std::vector<unsigned char> owned_;
  std::shared_ptr<const MappedBytes> mapped_;
};

// The file's bytes, at most `limit` of them; `path` or, when only that
// exists, `path`.gz (as Debian's dataset packages ship them) decompressed.
// `*size` is the whole file's size, or -1 when a partly read .gz hides it.
absl::StatusOr<IdxBytes> ReadMaybeGzipped(std::string& path,
                                          const MnistOptions& options,
                                          size_t limit, int64_t* size) {
  if (!Exists(path) && Exists(path + ".gz")) {
    path += ".gz";
    gzFile gz = gzopen(path.c_str(), "rb");
    if (gz == nullptr) {
      return absl::NotFoundError(absl::StrFormat(
          "MNIST file %s is unreadable; %s", path, Fix(options)));
    }
    std::vector<unsigned char> bytes;
    unsigned char buffer[1 << 16];
    int n = 0;
    while (bytes.size() < limit &&
           (n = gzread(gz, buffer,
                       std::min(sizeof(buffer), limit - bytes.size()))) > 0) {
      bytes.insert(bytes.end(), buffer, buffer + n);
    }
    gzclose(gz);
    if (n < 0) {
      return absl::DataLossError(absl::StrFormat(
          "MNIST file %s is not a valid gzip file; %s", path, Fix(options)));
    }
    *size = bytes.size() < limit ? static_cast<int64_t>(bytes.size()) : -1;
    return IdxBytes(std::move(bytes));
  }
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  struct stat st;
  if (fd < 0 || fstat(fd, &st) != 0) {
    if (fd >= 0) close(fd);
    return absl::NotFoundError(absl::StrFormat(
        "MNIST file %s is missing or unreadable; %s", path, Fix(options)));
  }
  absl::Cleanup close_fd = [fd] { close(fd); };
  *size = st.st_size;
  const size_t wanted = std::min(static_cast<size_t>(st.st_size), limit);
  if (wanted < static_cast<size_t>(st.st_size) || wanted == 0) {
    // Only the header: one small read is cheaper than a mapping.
    std::vector<unsigned char> bytes(wanted);
    if (pread(fd, bytes.data(), wanted, 0) != static_cast<ssize_t>(wanted)) {
      return absl::DataLossError(absl::StrFormat(
          "MNIST file %s could not be read; %s", path, Fix(options)));
    }
    return IdxBytes(std::move(bytes));
  }
  void* p = mmap(nullptr, wanted, PROT_READ, MAP_PRIVATE | MAP_POPULATE, fd, 0);
  if (p == MAP_FAILED) {
    return absl::DataLossError(
        absl::StrFormat("MNIST file %s could not be read whole (%s); %s", path,
                        std::strerror(errno), Fix(options)));
  }
  return IdxBytes(std::make_shared<const MappedBytes>(p, wanted));
}

// Reads an IDX file and checks its header and size; returns the whole file
// (the payload starts after the header), or only its header.
absl::StatusOr<IdxBytes> ReadIdx(std::string path, uint32_t magic, int dims,
                                 const MnistOptions& options, int64_t* count,
                                 bool header_only = false) {
  const size_t header = 4 + 4 * static_cast<size_t>(dims);
  int64_t size = -1;
  absl::StatusOr<IdxBytes> read =
      ReadMaybeGzipped(path, options, header_only ? header : SIZE_MAX, &size);
  if (!read.ok()) return read.status();
  const IdxBytes& bytes = *read;
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
  if (size >= 0 && static_cast<size_t>(size) != expected) {
    return absl::DataLossError(absl::StrFormat(
        "MNIST file %s is %s: %d bytes, expected %d for %d items; %s", path,
        static_cast<size_t>(size) < expected ? "truncated"
                                             : "corrupt (too long)",
        size, expected, *count, Fix(options)));
  }
  return read;
}

absl::Status CountMismatch(const MnistOptions& options,
                           const std::string& images_path, int64_t num_images,
                           const std::string& labels_path, int64_t num_labels) {
  return absl::DataLossError(absl::StrFormat(
      "MNIST files %s (%d images) and %s (%d labels) do not match; %s",
      images_path, num_images, labels_path, num_labels, Fix(options)));
}

MnistOptions WithDataDir(MnistOptions options) {
  if (options.data_dir.empty())
    options.data_dir = DefaultDataDir(options.dataset);
  return options;
}

absl::Status CheckFolder(const MnistOptions& options) {
  struct stat st;
  if (stat(options.data_dir.c_str(), &st) != 0) {
    return absl::NotFoundError(absl::StrFormat(
        "data folder %s does not exist; %s", options.data_dir, Fix(options)));
  }
  if (!S_ISDIR(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--data-dir %s is a file, not a folder; give the folder that holds "
        "the MNIST files; %s",
        options.data_dir, Fix(options)));
  }
  return absl::OkStatus();
}

// Every pixel of `count` images through one table: a byte has 256 values,
// normalized once with torchvision's ops (so that the floats are exactly
// Python's). On several threads: it runs once per node at start-up (the
// other local ranks wait for it, idle), where it is on the critical path.
void DecodeImages(const unsigned char* pixels, int64_t count,
                  Normalization norm, float* out) {
  at::Tensor table =
      at::arange(256, at::kFloat).div_(255.0f).sub_(norm.mean).div_(norm.std);
  const float* lookup = table.data_ptr<float>();
  auto decode = [&](int64_t begin, int64_t end) {
    for (int64_t i = begin * kRows * kCols; i < end * kRows * kCols; ++i) {
      out[i] = lookup[pixels[i]];
    }
  };
  constexpr int64_t kImagesPerThread = 5000;
  const int64_t threads = std::clamp<int64_t>(
      std::min<int64_t>(std::thread::hardware_concurrency(), 8), 1,
      std::max<int64_t>(1, count / kImagesPerThread));
  std::vector<std::thread> helpers;
  const int64_t share = (count + threads - 1) / threads;
  for (int64_t t = 1; t < threads; ++t) {
    helpers.emplace_back(decode, std::min(count, t * share),
                         std::min(count, (t + 1) * share));
  }
  decode(0, std::min(count, share));
  for (std::thread& helper : helpers) helper.join();
}

// The first `n` images of a split into `out`, read, validated (their count
// must be the labels') and decoded.
absl::Status ReadImages(const MnistOptions& options, const std::string& path,
                        int64_t num_labels, const std::string& labels_path,
                        int64_t n, float* out) {
  int64_t num_images = 0;
  auto images = ReadIdx(path, kImagesMagic, 3, options, &num_images);
  if (!images.ok()) return images.status();
  if (num_images != num_labels) {
    return CountMismatch(options, path, num_images, labels_path, num_labels);
  }
  DecodeImages(images->data() + kImagesHeader, n,
               NormalizationOf(options.dataset), out);
  return absl::OkStatus();
}

// The name of a split's decoded images in the node cache: everything they
// depend on, so that a changed file or option is another entry.
std::string CacheName(const MnistOptions& options, std::string images_path,
                      const std::string& prefix, int64_t n) {
  struct stat st;
  if (stat(images_path.c_str(), &st) != 0) {
    images_path += ".gz";
    if (stat(images_path.c_str(), &st) != 0) return "";
  }
  return absl::StrFormat(
      "%s-%s-%d-dev%d-ino%d-size%d-mtime%d.%09d.f32",
      options.dataset == DatasetKind::kFashionMnist ? "fashion-mnist" : "mnist",
      prefix, n, st.st_dev, st.st_ino, st.st_size, st.st_mtim.tv_sec,
      st.st_mtim.tv_nsec);
}

absl::StatusOr<MnistSplit> LoadSplit(const MnistOptions& options,
                                     const std::string& prefix, int64_t limit) {
  const std::string images_path =
      absl::StrFormat("%s/%s-images-idx3-ubyte", options.data_dir, prefix);
  const std::string labels_path =
      absl::StrFormat("%s/%s-labels-idx1-ubyte", options.data_dir, prefix);
  int64_t num_labels = 0;
  auto labels = ReadIdx(labels_path, kLabelsMagic, 1, options, &num_labels);
  if (!labels.ok()) return labels.status();
  for (size_t i = kLabelsHeader; i < labels->size(); ++i) {
    const unsigned char label = labels->data()[i];
    if (label > 9) {
      return absl::DataLossError(absl::StrFormat(
          "MNIST file %s is corrupt: label %d is not a digit 0-9; %s",
          labels_path, label, Fix(options)));
    }
  }
  int64_t n = num_labels;
  if (limit > 0 && limit < n) n = limit;
  MnistSplit split;
  split.labels = at::empty({n}, at::kLong);
  int64_t* label_out = split.labels.data_ptr<int64_t>();
  const unsigned char* digits = labels->data() + kLabelsHeader;
  for (int64_t i = 0; i < n; ++i) label_out[i] = digits[i];

  auto read_images = [&](void* out) {
    return ReadImages(options, images_path, num_labels, labels_path, n,
                      static_cast<float*>(out));
  };
  const std::string cache_name =
      options.cache_dir.empty() ? ""
                                : CacheName(options, images_path, prefix, n);
  if (!cache_name.empty()) {
    absl::StatusOr<std::shared_ptr<const MappedBytes>> shared =
        MapOrBuild(options.cache_dir, cache_name,
                   n * kRows * kCols * sizeof(float), read_images);
    if (shared.ok()) {
      // The tensor keeps the mapping; it is read-only (as training uses it).
      split.images = at::from_blob(
          const_cast<void*>((*shared)->data()), {n, 1, kRows, kCols},
          [keep = *shared](void*) {}, at::kFloat);
      return split;
    }
    if (!absl::IsUnavailable(shared.status())) return shared.status();
    spdlog::debug("{}; decoding the images in this process",
                  std::string(shared.status().message()));
  }
  split.images = at::empty({n, 1, kRows, kCols}, at::kFloat);
  if (absl::Status read = read_images(split.images.data_ptr<float>());
      !read.ok()) {
    return read;
  }
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
  return kind == DatasetKind::kFashionMnist
             ? "/usr/share/datasets/fashion-mnist"
             : "data/mnist";
}

absl::Status CheckMnistFiles(const MnistOptions& given) {
  MnistOptions options = WithDataDir(given);
  if (absl::Status folder = CheckFolder(options); !folder.ok()) return folder;
  for (const char* prefix : {"train", "t10k"}) {
    const std::string images_path =
        absl::StrFormat("%s/%s-images-idx3-ubyte", options.data_dir, prefix);
    const std::string labels_path =
        absl::StrFormat("%s/%s-labels-idx1-ubyte", options.data_dir, prefix);
    int64_t num_images = 0;
    int64_t num_labels = 0;
    auto images = ReadIdx(images_path, kImagesMagic, 3, options, &num_images,
                          /*header_only=*/true);
    if (!images.ok()) return images.status();
    auto labels = ReadIdx(labels_path, kLabelsMagic, 1, options, &num_labels,
                          /*header_only=*/true);
    if (!labels.ok()) return labels.status();
    if (num_images != num_labels) {
      return CountMismatch(options, images_path, num_images, labels_path,
                           num_labels);
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<MnistData> LoadMnist(const MnistOptions& given) {
  MnistOptions options = WithDataDir(given);
  if (absl::Status folder = CheckFolder(options); !folder.ok()) return folder;
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
