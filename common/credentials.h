#pragma once

#include <map>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/auth.h"
#include "grpcpp/channel.h"
#include "grpcpp/client_context.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/support/string_ref.h"

namespace ddprun::common {

// How a client proves itself to the rendezvous server and checks the
// server: a shared token sent as call metadata, and optionally TLS.
//
// The token travels as metadata `authorization: Bearer <token>` on every
// call. Without TLS it crosses the network in clear text: use TLS (or a
// private network) wherever strangers can listen.
inline constexpr char kAuthorizationKey[] = "authorization";

// Credentials plus the channel's own settings.
struct ChannelOptions : Credentials {
  // Reconnect pacing after a failed connection; 0: gRPC's defaults (1 s
  // growing to 120 s). The agent uses short values so that it finds a
  // rendezvous server that starts after it within its join retries.
  int reconnect_backoff_initial_ms = 0;
  int reconnect_backoff_max_ms = 0;
  // How long one connection attempt (TCP, TLS, HTTP/2 settings) may take
  // before gRPC gives it up and starts another on a fresh socket; 0:
  // gRPC's 20 s. With keepalive on, the socket's TCP_USER_TIMEOUT (below)
  // already ends a connect whose SYNs go unanswered; this bounds the rest
  // of the handshake too, and channels without keepalive. A second is far
  // more than a handshake takes inside a cluster; a channel whose handshake
  // needs longer never connects, so keep it above the network's round trip
  // times the handshake's (TLS: 2 or 3).
  int connect_timeout_ms = 1000;
  // The channel's own connections, not gRPC's process-wide subchannel
  // pool shared by every channel to the same target with the same settings.
  bool private_subchannels = false;
  // While a call is in flight, ping the server after this long without a
  // ping, and drop the connection when the ping is not answered within
  // keepalive_timeout_ms; 0: off. A connection whose server side is gone
  // (the server dropped it while a partition swallowed its close) is then
  // found at the next ping, which the server's host answers with a reset,
  // instead of holding a parked call until its own deadline (minutes): an
  // agent's Join, a relay's batched Join, a worker's store Get. The server
  // accepts pings this often (ServerOptions::min_ping_interval).
  //
  // gRPC also makes the timeout the socket's TCP_USER_TIMEOUT (gRFC A18):
  // data, a SYN included, unacknowledged that long ends the connection.
  //
  // The timeout is short so that a partition of a few seconds ends the
  // connections it froze while it lasts: their calls move to a fresh
  // connection, which connects within connect_timeout_ms of the network's
  // return. With 5 s, a worker's store channel and the agent's heartbeat
  // sat on the frozen connection for 3.3 s after the cable was back (their
  // data waiting on TCP's retransmission backoff), and every node of the
  // next round waited for them. A ping's answer, or an ACK, takes a round
  // trip through the peer's kernel and gRPC's I/O thread: a second is far
  // above that inside a cluster, and TCP reaches it only when one segment
  // is lost three times in a row (resent after 0.2, 0.6 and 1.4 s).
  int keepalive_time_ms = 2000;
  int keepalive_timeout_ms = 1000;
};

// A channel to `endpoint` ("host:port") that attaches the token to every
// call. Errors: an unreadable TLS file (named in the message).
absl::StatusOr<std::shared_ptr<grpc::Channel>> CreateChannel(
    const std::string& endpoint, const ChannelOptions& options);

// Attaches the token to one call, for channels not made by CreateChannel.
// No-op for an empty token.
void AttachToken(grpc::ClientContext* context, const std::string& token);

struct ServerTlsOptions {
  std::string cert_file;  // PEM certificate chain; empty: plaintext
  std::string key_file;   // PEM private key
  // Set: clients must present a certificate signed by this CA (mutual TLS).
  std::string client_ca_file;
};

// Plaintext when cert_file is empty, TLS otherwise.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>>
CreateServerCredentials(const ServerTlsOptions& options);

// Whether the call's metadata carries `token` (constant time in the token's
// length). An empty `token` admits every call.
bool CallHasToken(
    const std::multimap<grpc::string_ref, grpc::string_ref>& client_metadata,
    const std::string& token);

}  // namespace ddprun::common
