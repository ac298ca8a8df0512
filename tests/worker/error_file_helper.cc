// A worker that fails on command, to test the error file: "throw" (an
// uncaught std::runtime_error), "segv" (SIGSEGV), "status" (main returns an
// error status), "next-round PATH" (takes an in-place round whose error
// file is PATH, as from ddprun's control pipe, then returns an error
// status), "ok".
#include <fcntl.h>
#include <unistd.h>

#include <csignal>
#include <stdexcept>
#include <string>

#include "absl/status/status.h"
#include "worker/error_file.h"
#include "worker/recovery.h"

namespace {

// The round ddprun would write on DDPRUN_CONTROL_FD, naming `error_file`.
absl::Status FailAfterANewRound(const std::string& error_file) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return absl::InternalError("pipe");
  ddprun::worker::WorkerEnv env;
  env.control_fd = fds[0];
  auto membership = ddprun::worker::Membership::Start(env);
  if (!membership.ok()) return membership.status();
  const std::string round =
      "{\"DDPRUN_ROUND\":\"2\",\"TORCHELASTIC_ERROR_FILE\":\"" + error_file +
      "\"}\n";
  if (write(fds[1], round.data(), round.size()) !=
      static_cast<ssize_t>(round.size())) {
    return absl::InternalError("write");
  }
  auto next = (*membership)->NextRound(absl::OkStatus());
  if (!next.ok()) return next.status();
  return absl::DataLossError("failed in round 2");
}

}  // namespace

int main(int argc, char** argv) {
  std::string mode = argc > 1 ? argv[1] : "ok";
  return ddprun::worker::RunWorkerMain(
      "error_file_helper", [&]() -> absl::Status {
        if (mode == "throw") throw std::runtime_error("the \"model\" exploded");
        if (mode == "segv") std::raise(SIGSEGV);
        if (mode == "status") return absl::NotFoundError("no data here");
        if (mode == "next-round")
          return FailAfterANewRound(argc > 2 ? argv[2] : "");
        return absl::OkStatus();
      });
}
