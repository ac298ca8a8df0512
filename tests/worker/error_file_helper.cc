// A worker that fails on command, to test the error file: "throw" (an
// uncaught std::runtime_error), "segv" (SIGSEGV), "status" (main returns an
// error status), "ok".
#include <csignal>
#include <stdexcept>
#include <string>

#include "absl/status/status.h"
#include "worker/error_file.h"

int main(int argc, char** argv) {
  std::string mode = argc > 1 ? argv[1] : "ok";
  return ddprun::worker::RunWorkerMain("error_file_helper", [&]() -> absl::Status {
    if (mode == "throw") throw std::runtime_error("the \"model\" exploded");
    if (mode == "segv") std::raise(SIGSEGV);
    if (mode == "status") return absl::NotFoundError("no data here");
    return absl::OkStatus();
  });
}
