#include "launcher/posix/worker_output.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <string.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "absl/time/clock.h"

namespace ddprun::launcher {

std::string LinePrefix(const WorkerOutputOptions& options, int local_rank) {
  if (options.prefix_template.empty()) {
    return absl::StrFormat("[%s%d]:", options.role, local_rank);
  }
  // Python's string.Template names, braced or not; "$$" is a "$".
  std::string rank = absl::StrCat(options.rank_offset + local_rank);
  std::string local = absl::StrCat(local_rank);
  return absl::StrReplaceAll(options.prefix_template,
                             {{"$$", "$"},
                              {"${role_name}", options.role},
                              {"${rank}", rank},
                              {"${local_rank}", local},
                              {"$role_name", options.role},
                              {"$rank", rank},
                              {"$local_rank", local}});
}
namespace {

constexpr int kStdout = 1;  // torchrun's Std bits
constexpr int kStderr = 2;

void WriteAll(int fd, const char* data, size_t size) {
  while (size > 0) {
    ssize_t n = write(fd, data, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    data += n;
    size -= static_cast<size_t>(n);
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<WorkerOutput>> WorkerOutput::Open(
    const WorkerOutputOptions& options) {
  std::unique_ptr<WorkerOutput> out(new WorkerOutput(options.num_workers));
  for (int i = 0; i < options.num_workers; ++i) {
    int rank = options.rank_offset + i;
    bool shown = options.local_ranks_filter.empty() ||
                 std::find(options.local_ranks_filter.begin(),
                           options.local_ranks_filter.end(),
                           i) != options.local_ranks_filter.end();
    for (int s = 0; s < 2; ++s) {
      int bit = s == 0 ? kStdout : kStderr;
      Stream& stream = out->streams_[i][s];
      bool redirect = options.redirects.For(i) & bit;
      bool tee = options.tee.For(i) & bit;
      // torchrun's <attempt>/<local_rank>/stdout.log and stderr.log.
      std::string folder = absl::StrFormat("%s/%d", options.attempt_dir, i);
      std::string path =
          absl::StrFormat("%s/%s.log", folder, s == 0 ? "stdout" : "stderr");
      if (redirect || tee) {
        std::error_code ec;
        std::filesystem::create_directories(folder, ec);
        if (ec) {
          return absl::FailedPreconditionError(absl::StrFormat(
              "cannot create the log folder '%s': %s; check --log-dir", folder,
              ec.message()));
        }
        int file =
            open(path.c_str(),
                 O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0644);
        if (file < 0) {
          return absl::FailedPreconditionError(absl::StrFormat(
              "cannot create the log file '%s': %s; check --log-dir", path,
              strerror(errno)));
        }
        if (redirect && !tee) {
          stream.child_fd = file;
          stream.owns_child_fd = true;
          continue;
        }
        absl::StatusOr<common::PipeEnds> pipe = common::MakePipe(O_CLOEXEC);
        if (!pipe.ok()) {
          close(file);
          return absl::ResourceExhaustedError(absl::StrFormat(
              "for rank %d's output: %s", rank, pipe.status().message()));
        }
        // The streams own their descriptors from here (CloseAll).
        stream.pipe_fd = pipe->read.Release();
        stream.child_fd = pipe->write.Release();
        stream.owns_child_fd = true;
        stream.file_fd = file;
        stream.console_fd =
            shown ? (s == 0 ? STDOUT_FILENO : STDERR_FILENO) : -1;
        stream.prefix = LinePrefix(options, i);
      } else if (!shown) {
        stream.child_fd = open("/dev/null", O_WRONLY | O_CLOEXEC);
        stream.owns_child_fd = true;
      }
    }
  }
  return out;
}

WorkerOutput::~WorkerOutput() { Finish(absl::ZeroDuration()); }

void WorkerOutput::StartCopying() {
  bool any_pipe = false;
  for (auto& worker : streams_) {
    for (Stream& s : worker) {
      if (s.owns_child_fd && s.child_fd >= 0) close(s.child_fd);
      s.child_fd = -1;
      any_pipe |= s.pipe_fd >= 0;
    }
  }
  if (!any_pipe) return;
  absl::StatusOr<common::PipeEnds> stop = common::MakePipe(O_CLOEXEC);
  if (!stop.ok()) return;
  stop_pipe_ = std::move(*stop);
  copier_ = std::thread([this] { Copy(); });
}

void WorkerOutput::Finish(absl::Duration max_wait) {
  if (copier_.joinable()) {
    // The copier reads until every pipe is closed; after the stop byte it
    // gives the rest `max_wait`.
    finish_deadline_unix_ns_ = absl::ToUnixNanos(absl::Now() + max_wait);
    char byte = 0;
    WriteAll(stop_pipe_.write.get(), &byte, 1);
    copier_.join();
  }
  CloseAll();
}

void WorkerOutput::Copy() {
  char buffer[65536];
  bool stopping = false;
  absl::Time deadline = absl::InfiniteFuture();
  while (true) {
    std::vector<pollfd> fds;
    std::vector<Stream*> owners;
    for (auto& worker : streams_) {
      for (Stream& s : worker) {
        if (s.pipe_fd < 0) continue;
        fds.push_back({s.pipe_fd, POLLIN, 0});
        owners.push_back(&s);
      }
    }
    if (fds.empty()) break;
    if (!stopping) fds.push_back({stop_pipe_.read.get(), POLLIN, 0});
    int timeout_ms = -1;
    if (stopping) {
      timeout_ms = static_cast<int>(std::max<int64_t>(
          0, absl::ToInt64Milliseconds(deadline - absl::Now())));
    }
    int n = poll(fds.data(), fds.size(), timeout_ms);
    if (n < 0 && errno == EINTR) continue;
    if (n == 0 && stopping) break;  // a grandchild holds a pipe: give up
    for (size_t i = 0; i < owners.size(); ++i) {
      if (fds[i].revents == 0) continue;
      Stream& s = *owners[i];
      ssize_t got = read(s.pipe_fd, buffer, sizeof(buffer));
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0) {
        close(s.pipe_fd);
        s.pipe_fd = -1;
        continue;
      }
      WriteAll(s.file_fd, buffer, static_cast<size_t>(got));
      if (s.console_fd < 0) continue;
      s.partial.append(buffer, static_cast<size_t>(got));
      size_t start = 0;
      size_t newline;
      std::string lines;
      while ((newline = s.partial.find('\n', start)) != std::string::npos) {
        lines += s.prefix;
        lines.append(s.partial, start, newline - start + 1);
        start = newline + 1;
      }
      s.partial.erase(0, start);
      // Whole lines in one write, so that ranks do not interleave mid-line.
      if (!lines.empty()) WriteAll(s.console_fd, lines.data(), lines.size());
    }
    if (!stopping && fds.back().fd == stop_pipe_.read.get() &&
        fds.back().revents) {
      stopping = true;
      deadline = absl::FromUnixNanos(finish_deadline_unix_ns_.load());
    }
  }
  for (auto& worker : streams_) {
    for (Stream& s : worker) {
      if (s.console_fd >= 0 && !s.partial.empty()) {
        std::string line = s.prefix + s.partial + "\n";
        WriteAll(s.console_fd, line.data(), line.size());
        s.partial.clear();
      }
    }
  }
}

void WorkerOutput::CloseAll() {
  for (auto& worker : streams_) {
    for (Stream& s : worker) {
      if (s.owns_child_fd && s.child_fd >= 0) close(s.child_fd);
      if (s.pipe_fd >= 0) close(s.pipe_fd);
      if (s.file_fd >= 0) close(s.file_fd);
      s = Stream{};
    }
  }
  stop_pipe_ = {};
}

}  // namespace ddprun::launcher
