#pragma once

#include <string>

#include "absl/time/time.h"
#include "common/credentials.h"

namespace ddprun::relay {

// What ddprun-relay needs: where the rendezvous server is, where to listen,
// and how hard to batch.
struct RelayOptions {
  // The rendezvous server, "host:port".
  std::string upstream;
  // How the relay dials it: TLS files only. The token is never the relay's:
  // every call carries its caller's `authorization`, forwarded as is.
  common::ChannelOptions upstream_channel;
  std::string host = "127.0.0.1";  // "0.0.0.0" / "::" for all interfaces
  int port = 0;                    // 0: the kernel picks; read it with port()
  // TLS towards the agents; mutual TLS when tls.client_ca_file is set.
  common::ServerTlsOptions tls;
  // Nodes per upstream Join, and beats per upstream heartbeat message
  // (the server takes at most 1,024).
  int max_batch = 64;
  // A group is sent when it holds max_batch entries or when its first entry
  // waited this long.
  absl::Duration batch_window = absl::Milliseconds(2);
  // The longest deadline an upstream batched Join gets (its callers'
  // latest deadline, or this when one of them has none). Longer than the
  // server's join_timeout (600 s by default), so that the server's answer,
  // not this cap, says what happened.
  absl::Duration max_join_deadline = absl::Minutes(30);
};

}  // namespace ddprun::relay
