#pragma once

#include <array>
#include <atomic>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/unique_fd.h"

namespace ddprun::launcher {

// Which of a worker's streams go to files (torchrun's Std: 0 none, 1 stdout,
// 2 stderr, 3 both), for every local rank or per local rank ("0:1,1:2").
struct PerRankStreams {
  int all = 0;
  std::map<int, int> by_local_rank;
  int For(int local_rank) const {
    auto it = by_local_rank.find(local_rank);
    return it == by_local_rank.end() ? all : it->second;
  }
};

struct WorkerOutputOptions {
  // Where the attempt's files go (<run log folder>/attempt_<n>): each
  // worker's in <local_rank>/, created when needed.
  std::string attempt_dir;
  int num_workers = 1;
  int rank_offset = 0;                  // files and prefixes name global ranks
  PerRankStreams redirects;             // streams to files only
  PerRankStreams tee;                   // streams to files and the console
  std::vector<int> local_ranks_filter;  // console shows only these; empty: all
  // Console lines of teed streams start with torchrun's prefix,
  // "[<role><local rank>]:", or this template's (torchrun's
  // TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE: ${role_name}, ${rank},
  // ${local_rank}) when it is set.
  std::string role = "default";
  std::string prefix_template;
};

// The console prefix of one worker's teed lines (see WorkerOutputOptions).
std::string LinePrefix(const WorkerOutputOptions& options, int local_rank);

// Where the workers' stdout and stderr go for one attempt, as torchrun's
// --redirects/--tee/--local-ranks-filter say: inherited from the agent
// (console), a file <local_rank>/stdout.log|stderr.log (torchrun's names),
// both (the agent copies a pipe to the file and to the console, each line
// prefixed "[default0]:"), or nowhere (filtered out of the console). Owned by
// the agent's thread; the copying runs on a thread of its own.
class WorkerOutput {
 public:
  static absl::StatusOr<std::unique_ptr<WorkerOutput>> Open(
      const WorkerOutputOptions& options);
  ~WorkerOutput();
  WorkerOutput(const WorkerOutput&) = delete;
  WorkerOutput& operator=(const WorkerOutput&) = delete;

  // The descriptors to give the worker as stdout/stderr; -1: inherit.
  int stdout_fd(int local_rank) const {
    return streams_[local_rank][0].child_fd;
  }
  int stderr_fd(int local_rank) const {
    return streams_[local_rank][1].child_fd;
  }

  // After the workers are spawned: drops the agent's copies of the child
  // ends and starts copying tee'd pipes.
  void StartCopying();
  // After the workers ended: copies what is left (at most `max_wait`, as a
  // worker's own children may keep a pipe open) and closes everything.
  void Finish(absl::Duration max_wait);

 private:
  struct Stream {
    int child_fd = -1;    // what the worker writes to
    int pipe_fd = -1;     // tee: the agent's read end
    int file_fd = -1;     // tee: the log file the agent copies to
    int console_fd = -1;  // tee: 1 or 2, or -1 when filtered out
    std::string prefix;
    std::string partial;  // console bytes not yet ended by a newline
    bool owns_child_fd = false;
  };

  explicit WorkerOutput(int num_workers) : streams_(num_workers) {}
  void Copy();
  void CloseAll();

  std::vector<std::array<Stream, 2>> streams_;
  std::thread copier_;
  common::PipeEnds stop_pipe_;  // wakes the copier to finish
  // Set by Finish before it wakes the copier.
  std::atomic<int64_t> finish_deadline_unix_ns_{0};
};

}  // namespace ddprun::launcher
