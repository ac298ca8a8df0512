#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace ddprun::bench {

// A ddprun-rendezvous process started for one measurement, so that its
// memory is the server's alone. The destructor stops it (SIGTERM, then
// SIGKILL) and reaps it.
class ServerProcess {
 public:
  // Runs `binary --port 0 --log-level warn extra_args...` and reads the
  // endpoint from its first stdout line ("<program> listening on ..."),
  // and `more_lines` lines after it (e.g. "... metrics on URL").
  static absl::StatusOr<ServerProcess> Start(
      const std::string& binary, const std::vector<std::string>& extra_args,
      const std::string& program = "ddprun-rendezvous", int more_lines = 0);
  ServerProcess(ServerProcess&& other) noexcept;
  ServerProcess& operator=(ServerProcess&&) = delete;
  ~ServerProcess();

  const std::string& endpoint() const { return endpoint_; }
  // The lines read after the first (Start's more_lines).
  const std::vector<std::string>& more_lines() const { return more_lines_; }
  // Resident and peak resident memory, in KiB, from /proc.
  long RssKib() const;
  long PeakRssKib() const;
  // CPU time the process used so far (user + system), seconds.
  double CpuSeconds() const;

 private:
  ServerProcess(pid_t pid, std::string endpoint)
      : pid_(pid), endpoint_(std::move(endpoint)) {}
  long StatusField(const char* name) const;

  pid_t pid_ = -1;
  std::string endpoint_;
  std::vector<std::string> more_lines_;
};

}  // namespace ddprun::bench
