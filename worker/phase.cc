#include "worker/phase.h"

#include <errno.h>
#include <unistd.h>

#include <string>

#include "worker/broken_pipes.h"

namespace ddprun::worker {
namespace {

void WriteRecord(int fd, const char* data, size_t size) {
  if (fd < 0) return;
  ssize_t n;
  do {
    n = write(fd, data, size);
  } while (n < 0 && errno == EINTR);
  // EAGAIN (the agent makes the pipe non-blocking): it has not drained yet,
  // the next record counts. EPIPE: the agent is gone, and so are we soon.
}

// A record that comes rarely, maybe before the process group ignores
// SIGPIPE for the steps' records: a pipe the agent closed must not kill the
// worker. (A step's record skips the sigaction, one per step.)
void WriteRareRecord(int fd, const std::string& line) {
  if (fd < 0) return;
  IgnoreBrokenPipes();
  WriteRecord(fd, line.data(), line.size());
}

}  // namespace

void ReportPhase(int progress_fd, common::Phase phase) {
  WriteRareRecord(progress_fd, common::PhaseLine(phase));
}

void DeclareReportsBetweenSteps(int progress_fd) {
  WriteRareRecord(progress_fd, common::kReportsBetweenStepsLine);
}

void ReportRoundFailed(int progress_fd) {
  WriteRareRecord(progress_fd, common::kRoundFailedLine);
}

void ReportCollective(int progress_fd) {
  WriteRareRecord(progress_fd, common::kCollectiveLine);
}

void ReportCollectiveDone(int progress_fd) {
  WriteRareRecord(progress_fd, common::kCollectiveDoneLine);
}

void ReportStep(int progress_fd, double compute_seconds) {
  if (progress_fd < 0) return;
  const std::string line = common::StepLine(compute_seconds);
  WriteRecord(progress_fd, line.data(), line.size());
}

}  // namespace ddprun::worker
