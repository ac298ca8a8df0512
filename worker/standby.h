#pragma once

#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace ddprun::worker {

// The worker side of `ddprun --prewarm`. The agent starts the next round's
// workers while a round trains, with DDPRUN_STANDBY_FD set and none of the
// round's variables; each runs up to the point where it needs its round
// (libraries, data, model), then calls AwaitActivation. On a restart the
// agent writes the round's complete environment there, so the restarted
// worker skips the process start (~1 s for LibTorch's libraries) and all
// that the program does before this call.
//
// With DDPRUN_STANDBY_FD unset: returns OK at once (not prewarmed).
// Otherwise blocks until the agent writes the environment (a JSON object of
// strings) and closes the descriptor, then replaces this process's whole
// environment with it (clearenv + setenv: read the worker environment only
// after this call; ReadWorkerEnv refuses before), installs the error-file
// handlers of the new TORCHELASTIC_ERROR_FILE, and returns OK. End of input
// without data means the standby is not needed: the process exits 0 at
// once, quietly (no destructors, no atexit handlers run). Errors: the
// descriptor is not a number or unreadable, or the data is not a JSON
// object of strings (the message names which).
//
// Call it from the main thread before starting threads that read the
// environment (setenv is not thread-safe).
//
// The zygote. With DDPRUN_ZYGOTE_FD set (ddprun --prewarm starts one such
// process per node for a program that is not Python), this process never
// becomes a worker itself: it serves the agent's requests for standbys by
// forking, copy-on-write, from this point (a few ms instead of a process
// start: LibTorch's libraries, static initialisers, and what the program
// did before the call, its data included, are already there). Each
// request's standby returns from AwaitActivation, and waits for its round
// as above. The zygote must be single-threaded here (checked on
// /proc/self/task before every fork): join threads, and leave OpenMP, gRPC
// and CUDA uninitialised, before this call (ServesStandbys says when it
// matters). Otherwise it tells the agent why and exits 0, and the agent
// starts standbys by exec. A forked standby is adopted by the agent (a
// child subreaper: double fork), leads its own process group and sets
// PR_SET_PDEATHSIG once adopted. The zygote exits 0 when the agent closes
// its socket.
//
// The seed. ddprun's default prewarming has no zygote of its own: with
// DDPRUN_ZYGOTE_SEED_FD set (one worker of a node without a zygote), a
// worker forks the node's zygote here (double fork; a few ms), then returns
// as the worker. The zygote closes its copies of the worker's channels and
// output and serves as above. A worker that runs threads here does not
// seed (it tells the agent why) and goes on: its node is then not
// prewarmed.
absl::Status AwaitActivation();

// Whether this process is, or forks, the standbys' zygote (DDPRUN_ZYGOTE_FD
// or DDPRUN_ZYGOTE_SEED_FD is set): it must then run no other thread when
// it calls AwaitActivation (e.g. load data on the calling thread instead of
// a loader thread, and leave CUDA for after the call).
bool ServesStandbys();

// Whether this process is a standby that a zygote forked (after
// AwaitActivation returned). For tests and logs.
bool ForkedByZygote();

// Parses what the agent writes on DDPRUN_STANDBY_FD and DDPRUN_CONTROL_FD
// (common/worker_protocol.h's EncodeWorkerEnv): one flat JSON object of
// strings, as (name, value) pairs sorted by name.
absl::StatusOr<std::vector<std::pair<std::string, std::string>>> ParseEnvJson(
    const std::string& text);

}  // namespace ddprun::worker
