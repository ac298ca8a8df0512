#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"

namespace ddprun::worker {

// Read-only bytes mapped from a file; unmapped when the last owner goes.
class MappedBytes {
 public:
  MappedBytes(const void* data, size_t size) : data_(data), size_(size) {}
  ~MappedBytes();
  MappedBytes(const MappedBytes&) = delete;
  MappedBytes& operator=(const MappedBytes&) = delete;

  const void* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  const void* data_;
  size_t size_;
};

// What a node's workers build once and share: `dir` is a folder in shared
// memory (DDPRUN_SHM_DIR, which ddprun creates per agent), `name` names the
// entry and everything it depends on (callers put the source file's
// identity in it). The first caller builds the entry's `size` bytes with
// `build`, writing into the file mapped at `out`, and publishes it by
// renaming; callers that come while it builds wait for it (a lock per entry,
// released by the kernel if the builder dies), and later ones only map it.
// N local ranks then hold the bytes once, and all but one skip the work.
//
// Errors: `build`'s own error, unchanged, when it fails (nothing is
// published); UNAVAILABLE when the folder cannot hold the entry (missing,
// unwritable, or full: space is reserved before writing, so a full tmpfs is
// an error here, never a SIGBUS later). The caller then builds privately.
absl::StatusOr<std::shared_ptr<const MappedBytes>> MapOrBuild(
    const std::string& dir, const std::string& name, size_t size,
    absl::FunctionRef<absl::Status(void* out)> build);

}  // namespace ddprun::worker
