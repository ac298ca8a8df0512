#pragma once

#include <c10/util/Exception.h>

#include <exception>
#include <string>

namespace ddprun::worker {

// An exception's text for a libddp error (an absl::Status) that quotes it.
// LibTorch's c10::Error (TORCH_CHECK: the store client's errors, c10d's,
// torch::load's) carries a backtrace of a dozen frames in what(), which
// filled every warning of a round that ended while it formed; its message
// alone says what happened.
inline std::string ExceptionText(const std::exception& e) {
  if (const auto* error = dynamic_cast<const c10::Error*>(&e)) {
    return error->what_without_backtrace();
  }
  return e.what();
}

}  // namespace ddprun::worker
