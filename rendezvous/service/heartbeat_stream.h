#pragma once

#include <atomic>
#include <cstdint>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"
#include "ddprun/v1/rendezvous.pb.h"
#include "grpcpp/server_context.h"
#include "grpcpp/support/server_callback.h"
#include "rendezvous/core/job_table.h"
#include "rendezvous/service/token_check.h"

namespace ddprun::rendezvous {

// The most nodes one HeartbeatRequest may carry (itself and `more`).
inline constexpr int kMaxBeatsPerMessage = 1024;

// Answers a heartbeat message: its node and every node of `more`, in order,
// each as JobTable::Heartbeat answers it. INVALID_ARGUMENT past
// kMaxBeatsPerMessage; the job's error (NOT_FOUND) for all of them. Shared
// by the unary Heartbeat and the stream. Thread-safe.
absl::StatusOr<v1::HeartbeatResponse> AnswerHeartbeat(
    JobTable* jobs, const v1::HeartbeatRequest& request);

// The server side of Rendezvous.Heartbeats: one long-lived stream per agent
// on gRPC's callback API, each HeartbeatRequest answered in order with what
// the unary Heartbeat answers (JobTable::Heartbeat), so that a node's
// liveness (last seen) and everything the answer carries (round, state,
// rejoin, resume, ended) are the same on both paths.
//
// Why a stream: a unary Heartbeat costs the server a call set-up, its
// metadata, a token check (an HMAC for a job token) and four completions;
// on a stream a heartbeat is one read and one write, and the token is
// checked once, on the stream's first message (the run_id comes with it).
// A message naming another job is checked again.
//
// A stream ends with the unary call's error when a heartbeat is refused
// (NOT_FOUND: the job is unknown, e.g. after a restart; the agent Resumes
// and reopens), OK when the agent closes its side, CANCELLED when it goes
// away. A stream that stays open but stops sending keeps nothing alive: the
// node is dropped by last-seen time as with unary heartbeats.
//
// When a job's round ends, PushRoundOver sends each stream of one of its
// nodes still in that round, unasked, what its next heartbeat would be
// answered (HeartbeatResponse.pushed): the node hears at once that its
// round is over, not up to a heartbeat interval later. Every round change
// waits for the last node to hear it; at the default 250 ms interval that
// was 125 ms of each in-place recovery on average.
//
// Thread-safe: Open runs on gRPC's threads; the counters may be read from
// any thread. Must outlive every stream it opened (the server shuts down
// before it is destroyed).
class HeartbeatStreams {
 public:
  // `jobs` and `token` must outlive this.
  HeartbeatStreams(JobTable* jobs, const TokenCheck* token)
      : jobs_(jobs), token_(token) {}

  // Streams open at once past which a new one is refused with
  // RESOURCE_EXHAUSTED (the agent then sends unary heartbeats). Why a cap:
  // every open stream holds one read on gRPC's callback completion queue,
  // and Debian's libgrpc (1.51, built without NDEBUG) scans all of that
  // queue's outstanding operations on every completion of any callback
  // call; it also keeps ~6-13 KiB per open stream. Measured
  // (bench/rendezvous/README.md): with one stream per node, a streamed
  // heartbeat cost 21 µs of server CPU at 1,000 open streams and 60 µs
  // at 10,000, against 30-45 µs for a unary one. Set before the server
  // starts; 0 refuses every stream.
  void set_max_streams(int64_t max) { max_streams_ = max; }

  // The reactor of a new stream; it deletes itself when gRPC is done.
  grpc::ServerBidiReactor<v1::HeartbeatRequest, v1::HeartbeatResponse>* Open(
      grpc::CallbackServerContext* context);

  // Heartbeats answered on streams since the start (every node of a
  // message counts).
  int64_t beats() const { return beats_.load(std::memory_order_relaxed); }
  // Streams open now.
  int64_t open_streams() const { return open_.load(); }
  // Streams refused since the start (max_streams).
  int64_t refused_streams() const { return refused_.load(); }
  // Answers pushed since the start (PushRoundOver).
  int64_t pushes() const { return pushes_.load(); }

  // Job `run_id` moved past its rounds before `before_round` (it ended one,
  // or the job): each of its single-node streams whose last beat was of
  // such a round is sent what a heartbeat would be answered now, when that
  // says the round is over (rejoin) or the job ended; once per stream and
  // round. Call it with no lock held (it takes the job table's).
  void PushRoundOver(const std::string& run_id, int64_t before_round);

 private:
  class Stream;
  friend class Stream;

  JobTable* const jobs_;
  const TokenCheck* const token_;
  std::atomic<int64_t> beats_{0};
  std::atomic<int64_t> open_{0};
  std::atomic<int64_t> refused_{0};
  std::atomic<int64_t> pushes_{0};
  int64_t max_streams_ = 1024;

  // The open streams that beat for one node, by job, for PushRoundOver.
  // A stream is kept alive while a push holds it (Stream::Ref).
  void Register(const std::string& run_id, Stream* stream);
  void Unregister(const std::string& run_id, Stream* stream);
  absl::Mutex registry_mu_;
  absl::flat_hash_map<std::string, absl::flat_hash_set<Stream*>> by_job_
      ABSL_GUARDED_BY(registry_mu_);
};

}  // namespace ddprun::rendezvous
