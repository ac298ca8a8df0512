#pragma once

#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/credentials.h"
#include "ddprun/v1/rendezvous.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "launcher/agent/rendezvous_api.h"

namespace ddprun::launcher {

struct RendezvousClientOptions {
  std::string endpoint;  // HOST:PORT
  // Token (sent as "authorization: Bearer <token>") and TLS settings.
  common::ChannelOptions channel;
  // Deadline of the short calls (Heartbeat, ReportFailure, Leave, Status).
  absl::Duration rpc_timeout = absl::Seconds(5);
};

// The channel settings for `auth`: reads the token (file, or $DDPRUN_TOKEN).
// Errors name the unreadable or empty file.
absl::StatusOr<common::ChannelOptions> MakeChannelOptions(
    const common::Credentials& auth);

// The agent's side of the Rendezvous service over gRPC: every call carries a
// deadline. Thread-safe (the agent's thread joins, the heartbeat thread
// heartbeats).
class RendezvousClient final : public RendezvousApi {
 public:
  // Errors: unreadable TLS files (named in the message).
  static absl::StatusOr<std::unique_ptr<RendezvousClient>> Create(
      RendezvousClientOptions options);

  // Join, parked on the server until the round closes, or (JoinRequest.poll,
  // which this sets) sent again at the interval the server says while it
  // answers `waiting`; returns the assignment or JobEnded, never `waiting`.
  // A server that cannot be reached is retried with backoff for up to
  // `unreachable_timeout`; the parked call itself may take up to
  // `join_timeout`. CANCELLED after CancelJoin().
  absl::StatusOr<v1::JoinResponse> Join(
      const v1::JoinRequest& request, absl::Duration join_timeout,
      absl::Duration unreachable_timeout) override;
  absl::StatusOr<v1::JoinResponse> JoinUnless(
      const v1::JoinRequest& request, absl::Duration join_timeout,
      absl::Duration unreachable_timeout,
      absl::FunctionRef<bool()> leave) override;
  void WakeJoin() override;
  // Makes a Join in progress (and the next ones) return CANCELLED; used when
  // the agent is told to stop while it waits. Any thread.
  void CancelJoin();

  absl::StatusOr<v1::HeartbeatResponse> Heartbeat(
      const v1::HeartbeatRequest& request) override;
  // Opens Rendezvous.Heartbeats (no deadline: it lives for the round); each
  // Beat waits up to rpc_timeout for its answer. Opening never fails here:
  // a server that refuses the stream says so on the first Beat.
  absl::StatusOr<std::unique_ptr<HeartbeatStream>> OpenHeartbeatStream(
      PushHandler on_push) override;
  absl::StatusOr<v1::ReportFailureResponse> ReportFailure(
      const v1::ReportFailureRequest& request) override;
  absl::Status Leave(const v1::LeaveRequest& request) override;
  absl::StatusOr<v1::ResumeResponse> Resume(
      const v1::JoinRequest& request) override;
  absl::StatusOr<v1::StatusResponse> Status(const v1::StatusRequest& request);

  const std::string& endpoint() const override { return options_.endpoint; }

 private:
  class Stream;

  RendezvousClient(RendezvousClientOptions options,
                   std::shared_ptr<grpc::Channel> channel);
  void Prepare(grpc::ClientContext& context, absl::Duration timeout) const;
  // Says which call failed, where, and what to do.
  absl::Status Explain(const char* call, const grpc::Status& status) const;

  RendezvousClientOptions options_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Rendezvous::Stub> stub_;

  absl::Mutex mu_;
  grpc::ClientContext* join_context_ ABSL_GUARDED_BY(mu_) = nullptr;
  bool join_cancelled_ ABSL_GUARDED_BY(mu_) = false;
  // Set by WakeJoin; the JoinUnless that asks its check again clears it.
  bool join_woken_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace ddprun::launcher
