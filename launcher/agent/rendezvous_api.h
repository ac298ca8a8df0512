#pragma once

#include <functional>
#include <memory>
#include <string>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "ddprun/v1/rendezvous.pb.h"

namespace ddprun::launcher {

// One open Rendezvous.Heartbeats stream: heartbeats of one node, each
// answered as a unary Heartbeat would be (and, unasked, the server's word
// that the round ended: RendezvousApi::PushHandler). Used by one thread at a
// time.
class HeartbeatStream {
 public:
  virtual ~HeartbeatStream() = default;
  // Sends `request` and waits for its answer. Any error ends the stream
  // (the caller drops it and opens another): the server's refusal
  // (NOT_FOUND, PERMISSION_DENIED, ...), a broken or stalled stream
  // (UNAVAILABLE, DEADLINE_EXCEEDED), or UNIMPLEMENTED from a server older
  // than the stream.
  virtual absl::StatusOr<v1::HeartbeatResponse> Beat(
      const v1::HeartbeatRequest& request) = 0;
};

// What RendezvousApi::JoinUnless returns when its `leave` check said so:
// CANCELLED, marked so that it cannot be taken for a server's CANCELLED.
absl::Status JoinLeftError();
bool IsJoinLeft(const absl::Status& status);

// What the agent asks of the rendezvous service: the seam between the round
// lifecycle and the network. RendezvousClient (gRPC) is the implementation
// ddprun uses; lifecycle tests pass a fake. Thread-safe: the agent's thread
// joins, reports and leaves while the heartbeat thread heartbeats.
class RendezvousApi {
 public:
  virtual ~RendezvousApi() = default;

  // Waits for this node's round to close (up to `join_timeout` once the
  // server answers); a server that cannot be reached is retried for up to
  // `unreachable_timeout`. Answers an assignment or JobEnded: a `waiting`
  // answer (JoinRequest.poll) is the implementation's to poll past.
  virtual absl::StatusOr<v1::JoinResponse> Join(
      const v1::JoinRequest& request, absl::Duration join_timeout,
      absl::Duration unreachable_timeout) = 0;
  // Join, which also ends with JoinLeftError() once `leave()` is true. The
  // check runs on the calling thread: before each Join is sent, and each time
  // WakeJoin() is called while it waits. A Join in flight is cancelled only
  // when the check says leave, never by WakeJoin itself: a Join cancelled
  // just as its round closes would lose the node's assignment, and its next
  // Join would end that round. The default asks once, then Joins.
  virtual absl::StatusOr<v1::JoinResponse> JoinUnless(
      const v1::JoinRequest& request, absl::Duration join_timeout,
      absl::Duration unreachable_timeout, absl::FunctionRef<bool()> leave);
  // Has the JoinUnless in flight (or the next one) ask its check again:
  // something it looks at changed (a child of the agent changed state). Any
  // thread; the default does nothing.
  virtual void WakeJoin() {}
  virtual absl::StatusOr<v1::HeartbeatResponse> Heartbeat(
      const v1::HeartbeatRequest& request) = 0;
  // What the server pushes on a heartbeat stream unasked (the node's round
  // ended: HeartbeatResponse.pushed), called on a thread of the client's; it
  // must not block.
  using PushHandler = std::function<void(const v1::HeartbeatResponse&)>;
  // A new heartbeat stream (HeartbeatStream) that hands its pushes to
  // `on_push` (unset: dropped) until it is destroyed. The default says
  // UNIMPLEMENTED: the caller sends unary Heartbeats.
  virtual absl::StatusOr<std::unique_ptr<HeartbeatStream>> OpenHeartbeatStream(
      PushHandler on_push) {
    return absl::UnimplementedError("heartbeat streams are not supported here");
  }
  virtual absl::StatusOr<v1::ReportFailureResponse> ReportFailure(
      const v1::ReportFailureRequest& request) = 0;
  virtual absl::Status Leave(const v1::LeaveRequest& request) = 0;
  // Re-registers a node whose workers run in request.record()'s round with a
  // server that lost the job (it restarted). Answered at once. The default
  // says UNIMPLEMENTED, as a server older than Resume does.
  virtual absl::StatusOr<v1::ResumeResponse> Resume(
      const v1::JoinRequest& request) {
    return absl::UnimplementedError(absl::StrCat(
        "Resume of job '", request.run_id(), "' is not supported here"));
  }

  // Where the service is, for log lines.
  virtual const std::string& endpoint() const = 0;
};

}  // namespace ddprun::launcher
