#pragma once

#include <string>

#include "common/credentials.h"

namespace ddprun::launcher {

// What a node's orphan guard (posix/orphan_guard.h) needs to tell the
// rendezvous that the node's agent died: without it the other nodes learn
// it from the server only when the node's heartbeats stop for the job's
// heartbeat timeout (10 s by default), wherever the agent had no heartbeat
// stream open (the server counts a broken stream at once).
struct Farewell {
  std::string endpoint;  // HOST:PORT of the rendezvous
  std::string run_id;
  std::string node_id;
  // The agent's token and TLS files (absolute paths: the guard runs in /).
  common::Credentials credentials;
};

// The guard's copy, one opaque string (OrphanGuard::SetFarewell). It holds
// the token: it goes to the guard over their socket pair only.
std::string EncodeFarewell(const Farewell& farewell);
// The inverse; false for a malformed string.
bool DecodeFarewell(const std::string& encoded, Farewell& farewell);

// In the guard, once it cleaned up after a dead agent: Leave(node,
// REASON_AGENT_LOST) on the rendezvous, one call of at most 2 s, no
// retry (the node id is this agent's alone, so a late Leave can hurt no
// other node). The guard has no output; failures are silent.
void SayFarewell(const std::string& encoded);

}  // namespace ddprun::launcher
