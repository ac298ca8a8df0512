#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ddprun/v1/rendezvous.pb.h"
#include "launcher/agent/rendezvous_client.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/temp_dir.h"

namespace ddprun::testing {

// ddprun-rendezvous as a process of its own, for the tests that kill it
// (SIGKILL) and start it again on the port the kernel chose the first time;
// with a client to read a job's status from it. Its logs go to
// rdzv<N>.{out,err} in `dir`, one pair per start. Not thread-safe.
class RendezvousProcess {
 public:
  explicit RendezvousProcess(const TempDir& dir) : dir_(dir) {}

  // Starts the server on `port` (0: the kernel's choice) and waits for its
  // "listening on" line. The port of a killed server may take a moment to
  // be free again: retried for a bounded time. Returns false (and log()
  // says why) when it did not come up on `port`.
  // `flags`: more of the server's flags.
  bool Start(int port, const std::vector<std::string>& flags = {});
  // kill -9, and the process reaped (bounded).
  bool KillNine();

  // The job's status, or nullopt when the server does not know it (yet).
  std::optional<v1::JobStatus> Job(const std::string& run_id);

  // Waits (up to `timeout`) until job `run_id` runs `round` with
  // `restart_count` and `nodes` members, each running. Nodes that are no
  // member of the round (node rank -1: an agent that died, not yet
  // forgotten) do not count.
  bool WaitForRunning(const std::string& run_id, int64_t round,
                      int restart_count, int nodes,
                      absl::Duration timeout = absl::Seconds(60));

  std::string endpoint() const;
  int port() const { return port_; }
  // The current server's stderr and the last status a wait saw.
  std::string log() const;

 private:
  const TempDir& dir_;
  int starts_ = 0;
  int port_ = 0;
  std::string err_;
  std::string last_seen_;
  std::unique_ptr<Subprocess> process_;
  std::unique_ptr<launcher::RendezvousClient> client_;
};

}  // namespace ddprun::testing
