#pragma once

#include <functional>
#include <string>

#include "absl/status/status.h"

namespace ddprun::worker {

// torchrun's error-file JSON, which ddprun's agent (and torchrun's) reads
// for the root cause of a failed worker:
// {"message": {"message": "<message>", "extraInfo": {"py_callstack": "",
// "timestamp": "<unix seconds>"}}}
std::string ErrorFileJson(const std::string& message, long long unix_seconds);

// Writes ErrorFileJson(message, now) to `path`; an empty path does nothing.
absl::Status WriteErrorFile(const std::string& path,
                            const std::string& message);

// From here on, an uncaught exception ("<type>: <what>") or a fatal signal
// (SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT: "Signal SIGSEGV (11) received")
// writes the error file at `path` before the process dies as it would have.
// The signal path uses only async-signal-safe calls. Call once, early.
void InstallErrorFileHandlers(const std::string& path);

// What a worker's main() calls: installs the handlers for
// TORCHELASTIC_ERROR_FILE, runs `body`, and on an error writes the error
// file and one line "<program>: error: <message>" on stderr. Returns the
// process exit code (0 or 1).
int RunWorkerMain(const std::string& program,
                  const std::function<absl::Status()>& body);

}  // namespace ddprun::worker
