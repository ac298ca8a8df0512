#include "worker/node_cache.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_format.h"
#include "spdlog/spdlog.h"

namespace ddprun::worker {
namespace {

absl::Status Unavailable(const std::string& what, const std::string& path,
                         int error) {
  return absl::UnavailableError(absl::StrFormat(
      "node cache: cannot %s %s: %s", what, path, std::strerror(error)));
}

// `size` bytes of `fd`, read-only, paged in now (they are in memory already:
// mapping them all at once is cheaper than a fault per page later).
absl::StatusOr<std::shared_ptr<const MappedBytes>> MapReadOnly(
    int fd, size_t size, const std::string& path) {
  void* p = mmap(nullptr, size, PROT_READ, MAP_SHARED | MAP_POPULATE, fd, 0);
  if (p == MAP_FAILED) return Unavailable("map", path, errno);
  return std::make_shared<const MappedBytes>(p, size);
}

}  // namespace

MappedBytes::~MappedBytes() { munmap(const_cast<void*>(data_), size_); }

absl::StatusOr<std::shared_ptr<const MappedBytes>> MapOrBuild(
    const std::string& dir, const std::string& name, size_t size,
    absl::FunctionRef<absl::Status(void* out)> build) {
  const std::string path = dir + "/" + name;
  if (size == 0) {
    return absl::UnavailableError(
        absl::StrFormat("node cache: %s would be empty", path));
  }
  const std::string lock_path = path + ".lock";
  int lock_fd = open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (lock_fd < 0) return Unavailable("create", lock_path, errno);
  absl::Cleanup close_lock = [lock_fd] { close(lock_fd); };
  while (flock(lock_fd, LOCK_EX) != 0) {
    if (errno != EINTR) return Unavailable("lock", lock_path, errno);
  }

  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    absl::Cleanup close_fd = [fd] { close(fd); };
    struct stat st;
    if (fstat(fd, &st) == 0 && static_cast<size_t>(st.st_size) == size) {
      return MapReadOnly(fd, size, path);
    }
    // Not what this caller expects (another program's entry of the same
    // name): replaced below.
    spdlog::warn("node cache: {} has {} bytes, expected {}; rebuilding it",
                 path, st.st_size, size);
    unlink(path.c_str());
  }

  // Under the lock: one builder at a time, so one temporary name will do.
  const std::string temp = path + ".building";
  fd = open(temp.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return Unavailable("create", temp, errno);
  absl::Cleanup close_fd = [fd] { close(fd); };
  bool published = false;
  absl::Cleanup remove_temp = [&] {
    if (!published) unlink(temp.c_str());
  };
  if (int error = posix_fallocate(fd, 0, static_cast<off_t>(size));
      error != 0) {
    return Unavailable(absl::StrFormat("reserve %d bytes for", size), temp,
                       error);
  }
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) return Unavailable("map", temp, errno);
  auto bytes = std::make_shared<const MappedBytes>(p, size);
  if (absl::Status built = build(p); !built.ok()) return built;
  // Read-only from here, as every other worker sees it.
  mprotect(p, size, PROT_READ);
  // Should the rename fail, the bytes still serve this worker; the others
  // build their own.
  published = rename(temp.c_str(), path.c_str()) == 0;
  return bytes;
}

}  // namespace ddprun::worker
