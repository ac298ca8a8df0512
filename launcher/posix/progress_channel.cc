#include "launcher/posix/progress_channel.h"

#include <errno.h>
#include <unistd.h>

namespace ddprun::launcher {

ProgressChannel::ProgressChannel() {
  if (pipe_.agent_fd() < 0) return;
  common::SetNonBlocking(pipe_.agent_fd());
  // The worker's writes never block either (the flag belongs to the open
  // pipe, so it crosses fork and exec): an agent that is behind, or
  // stopped, costs records, never a worker's step.
  common::SetNonBlocking(pipe_.worker_fd());
}

std::vector<common::ProgressRecord> ProgressChannel::Drain() {
  std::vector<common::ProgressRecord> records;
  if (pipe_.agent_fd() < 0) return records;
  // A worker writes short lines; one longer than this is not ours, and is
  // cut rather than kept growing.
  constexpr size_t kMaxLine = 4096;
  char buffer[4096];
  while (true) {
    ssize_t n = read(pipe_.agent_fd(), buffer, sizeof(buffer));
    if (n > 0) {
      partial_.append(buffer, static_cast<size_t>(n));
      size_t begin = 0;
      for (size_t end; (end = partial_.find('\n', begin)) != std::string::npos;
           begin = end + 1) {
        records.push_back(common::ParseProgressRecord(
            absl::string_view(partial_).substr(begin, end - begin)));
        if (records.back().kind == common::ProgressRecord::Kind::kInPlace) {
          in_place_ = true;
        }
      }
      partial_.erase(0, begin);
      if (partial_.size() > kMaxLine) {
        records.push_back({});  // a sign of life all the same
        partial_.clear();
      }
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    break;  // empty (EAGAIN) or closed (0)
  }
  return records;
}

}  // namespace ddprun::launcher
