#include "worker/progress.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "worker/broken_pipes.h"

namespace ddprun::worker {
namespace {

std::string FormatDuration(double seconds) {
  if (seconds < 0) seconds = 0;
  int64_t s = static_cast<int64_t>(seconds + 0.5);
  if (s >= 3600) return absl::StrFormat("%dh%02dm", s / 3600, (s / 60) % 60);
  if (s >= 60) return absl::StrFormat("%dm%02ds", s / 60, s % 60);
  return absl::StrFormat("%ds", s);
}

}  // namespace

ProgressReporter::ProgressReporter(const ProgressOptions& options)
    : options_(options) {
  if (options_.fd >= 0) {
    int flags = fcntl(options_.fd, F_GETFL);
    if (flags < 0 || fcntl(options_.fd, F_SETFL, flags | O_NONBLOCK) < 0) {
      options_.fd = -1;  // not a descriptor we can use; no heartbeat
    }
    IgnoreBrokenPipes();  // the agent may be gone
  }
  tty_ = options_.out != nullptr && isatty(fileno(options_.out));
}

ProgressReporter::~ProgressReporter() { EndLine(); }

std::string ProgressReporter::Record(const StepProgress& p) {
  return absl::StrFormat("step %d epoch %d\n", p.step, p.epoch);
}

std::string ProgressReporter::Line(const StepProgress& p) {
  std::string line = absl::StrFormat(
      "epoch %d/%d step %d/%d loss %.4f %.0f samples/s", p.epoch + 1, p.epochs,
      p.step_in_epoch, p.steps_per_epoch, p.loss, p.samples_per_sec);
  if (p.samples_per_sec > 0 && p.samples_per_step > 0) {
    double steps_left =
        static_cast<double>(p.steps_per_epoch - p.step_in_epoch) +
        static_cast<double>(p.epochs - p.epoch - 1) * p.steps_per_epoch;
    absl::StrAppend(
        &line, " ETA ",
        FormatDuration(steps_left * p.samples_per_step / p.samples_per_sec));
  }
  return line;
}

void ProgressReporter::OnStep(const StepProgress& progress) {
  if (options_.fd >= 0) {
    std::string record = Record(progress);
    ssize_t n;
    do {
      n = write(options_.fd, record.data(), record.size());
    } while (n < 0 && errno == EINTR);
    // EAGAIN: the agent has not drained yet; one record more or less does
    // not matter. EPIPE: the agent is gone; it will stop us.
  }
  if (!options_.display || options_.out == nullptr) return;
  auto now = std::chrono::steady_clock::now();
  auto interval = tty_ ? options_.tty_interval : options_.plain_interval;
  bool last = progress.step_in_epoch == progress.steps_per_epoch;
  if (now - last_display_ < interval && !(tty_ && last)) return;
  last_display_ = now;
  std::string line = Line(progress);
  if (tty_) {
    std::fprintf(options_.out, "\r\033[K%s", line.c_str());
    line_open_ = true;
  } else {
    std::fprintf(options_.out, "%s\n", line.c_str());
  }
  std::fflush(options_.out);
}

void ProgressReporter::EndLine() {
  if (line_open_) {
    std::fputc('\n', options_.out);
    std::fflush(options_.out);
    line_open_ = false;
  }
}

}  // namespace ddprun::worker
