#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <utility>

#include "absl/status/statusor.h"

namespace ddprun::common {

// Owns one file descriptor and closes it when it goes: move-only, like
// std::unique_ptr. -1 is "none". Not thread-safe; one owner at a time.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  ~UniqueFd() { Reset(); }
  UniqueFd(UniqueFd&& other) noexcept : fd_(other.Release()) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept {
    if (this != &other) Reset(other.Release());
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  // Gives up ownership: the caller closes the returned descriptor.
  int Release() { return std::exchange(fd_, -1); }
  // Closes the descriptor held (if any) and holds `fd` instead. close()'s
  // result is not looked at: on Linux the descriptor is gone either way,
  // and retrying could close one that another thread opened since.
  void Reset(int fd = -1) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = fd;
  }

 private:
  int fd_ = -1;
};

// The two ends of a pipe(2).
struct PipeEnds {
  UniqueFd read;
  UniqueFd write;
};

// pipe2(2) with `flags` (O_CLOEXEC, O_NONBLOCK, O_DIRECT), its ends owned.
// The error is errno's, as an absl::Status naming the call.
absl::StatusOr<PipeEnds> MakePipe(int flags = O_CLOEXEC);

// Adds O_NONBLOCK to an open descriptor's status flags (which belong to the
// open file, so they cross fork and exec).
void SetNonBlocking(int fd);

}  // namespace ddprun::common
