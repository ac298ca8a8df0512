#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/metrics.h"
#include "ddprun/v1/rendezvous.grpc.pb.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/server.h"
#include "relay/heartbeat_mux.h"
#include "relay/join_batcher.h"
#include "relay/relay_counters.h"
#include "relay/relay_options.h"

namespace ddprun::relay {

// ddprun-relay: agents and workers dial it as the rendezvous server. Single
// Joins and heartbeats go upstream in batches (JoinBatcher, HeartbeatMux);
// every other call, of either service or any method the relay does not
// know, passes through unchanged (gRPC's generic API). The relay holds no
// job state and checks no token: the upstream server checks the callers'.
// Thread-safe; Shutdown from any thread but a gRPC callback.
class Relay {
 public:
  static absl::StatusOr<std::unique_ptr<Relay>> Start(
      const RelayOptions& options);
  ~Relay();
  Relay(const Relay&) = delete;
  Relay& operator=(const Relay&) = delete;

  int port() const { return port_; }
  // "host:port" a client can dial; a wildcard host becomes loopback.
  std::string endpoint() const;
  // The relay's counters (RelayCounters), for /metrics.
  common::MetricsRegistry& metrics() { return registry_; }
  const RelayCounters& counters() const { return counters_; }
  // Single Joins waiting for their batch to be sent.
  size_t NumPendingJoinsForTest() const { return batcher_->num_pending(); }
  // Idempotent; the destructor calls it. Calls in progress end (UNAVAILABLE
  // or CANCELLED), then the relay stops.
  void Shutdown();

 private:
  class Service;
  explicit Relay(const RelayOptions& options);

  const RelayOptions options_;
  common::MetricsRegistry registry_;
  RelayCounters counters_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Rendezvous::Stub> stub_;
  std::unique_ptr<grpc::GenericStub> generic_;
  std::unique_ptr<JoinBatcher> batcher_;
  std::unique_ptr<HeartbeatMux> beats_;
  std::unique_ptr<Service> service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  bool shut_down_ = false;
};

}  // namespace ddprun::relay
