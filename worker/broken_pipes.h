#pragma once

namespace ddprun::worker {

// A write to a pipe or socket whose reader is gone must fail that write,
// not kill this worker: the agent may be gone (the progress pipe), or a
// peer killed mid-step (Gloo writes to its sockets without MSG_NOSIGNAL,
// and in-place recovery keeps this rank). Sets SIGPIPE to be ignored unless
// the program installed its own handler, which is kept. Idempotent.
void IgnoreBrokenPipes();

}  // namespace ddprun::worker
