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

}  // namespace

void ReportPhase(int progress_fd, common::Phase phase) {
  // A phase may come before the process group, which ignores SIGPIPE for
  // the steps' records; a pipe the agent closed must not kill the worker.
  if (progress_fd >= 0) IgnoreBrokenPipes();
  const std::string line = common::PhaseLine(phase);
  WriteRecord(progress_fd, line.data(), line.size());
}

void DeclareReportsBetweenSteps(int progress_fd) {
  if (progress_fd >= 0) IgnoreBrokenPipes();  // as ReportPhase
  WriteRecord(progress_fd, common::kReportsBetweenStepsLine,
              sizeof(common::kReportsBetweenStepsLine) - 1);
}

void ReportRoundFailed(int progress_fd) {
  if (progress_fd >= 0) IgnoreBrokenPipes();  // as ReportPhase
  WriteRecord(progress_fd, common::kRoundFailedLine,
              sizeof(common::kRoundFailedLine) - 1);
}

void ReportStep(int progress_fd, double compute_seconds) {
  if (progress_fd < 0) return;
  const std::string line = common::StepLine(compute_seconds);
  WriteRecord(progress_fd, line.data(), line.size());
}

}  // namespace ddprun::worker
