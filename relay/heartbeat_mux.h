#pragma once

#include <deque>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/backoff.h"
#include "ddprun/v1/rendezvous.grpc.pb.h"
#include "grpcpp/support/status.h"
#include "relay/forwarding.h"
#include "relay/relay_counters.h"
#include "relay/relay_options.h"

namespace ddprun::relay {

// Where the answers to one caller's heartbeats go (its stream, or its unary
// call), in the order it sent them. Called from any thread; must tolerate
// calls after its caller is gone.
class BeatSink {
 public:
  virtual ~BeatSink() = default;
  virtual void OnAnswer(const v1::HeartbeatResponse& response) = 0;
  // The upstream stream that carried (or would carry) the beat failed.
  virtual void OnError(const grpc::Status& status) = 0;
};

// Carries every caller's heartbeats of one (run_id, forwarded metadata) on
// one upstream Heartbeats stream, up to max_batch nodes per message
// (HeartbeatRequest.more), and hands each answer back to its sink.
//
// Upstream failure (chosen and documented in relay/README.md): the beats in
// flight or waiting when the upstream stream ends get its status
// (UNAVAILABLE naming the upstream), which ends their callers' streams as a
// server would; agents reopen them with their own backoff and beat unary
// meanwhile. The next beat opens a new upstream stream, after
// common::Backoff's delay when the last one failed (beats wait for it). A
// stream idle for idle_close is closed.
//
// Threading: Beat from gRPC's callback threads; one flusher thread sends
// beats whose window passed and opens streams due; the upstream reactors
// run on gRPC's threads. mu_ guards the groups; gRPC is never called with
// it held (a reaction may run inline).
class HeartbeatMux {
 public:
  HeartbeatMux(const RelayOptions& options, v1::Rendezvous::Stub* stub,
               RelayCounters* counters);
  ~HeartbeatMux();
  HeartbeatMux(const HeartbeatMux&) = delete;
  HeartbeatMux& operator=(const HeartbeatMux&) = delete;

  // One downstream message (its own node and its `more`).
  void Beat(const ForwardedMetadata& metadata, std::shared_ptr<BeatSink> sink,
            v1::HeartbeatRequest request);
  // Fails what waits UNAVAILABLE, cancels the upstream streams and waits
  // for them to end. Idempotent.
  void Shutdown();

  static constexpr absl::Duration kIdleClose = absl::Seconds(30);

 private:
  class Upstream;
  struct Entry {
    std::shared_ptr<BeatSink> sink;
    v1::HeartbeatRequest request;
    int nodes() const { return 1 + request.more_size(); }
  };
  struct Group {
    std::string run_id;
    ForwardedMetadata metadata;
    std::deque<Entry> pending;
    int pending_nodes = 0;
    absl::Time first_pending;
    // Sent, answers due in this order.
    std::deque<std::vector<Entry>> in_flight;
    Upstream* stream = nullptr;  // open, or nullptr
    int max_nodes = 0;           // 1 after an answer without `more`
    bool unary = false;          // the server has no Heartbeats stream
    int unary_calls = 0;         // unary Heartbeats in flight
    common::Backoff backoff;
    absl::Time reopen_at = absl::InfinitePast();
    absl::Time last_activity;
  };
  // One unary upstream Heartbeat (a server without the stream).
  struct UnaryBeat {
    std::shared_ptr<grpc::ClientContext> context =
        std::make_shared<grpc::ClientContext>();
    ForwardedMetadata metadata;
    v1::HeartbeatRequest request;
    v1::HeartbeatResponse response;
    std::vector<Entry> sent;
  };
  using Answers =
      std::vector<std::pair<std::shared_ptr<BeatSink>, v1::HeartbeatResponse>>;
  // What to do once mu_ is released.
  struct Actions {
    std::vector<std::pair<std::string, UnaryBeat*>> unary;
    std::vector<std::pair<Upstream*, v1::HeartbeatRequest>> writes;
    std::vector<Upstream*> opens;
    std::vector<Upstream*> closes;    // idle: WritesDone, then release
    std::vector<Upstream*> releases;  // retired: release its hold
  };

  void FlushLoop();
  // Opens a stream, or takes the next message to write, when due.
  void Pump(const std::string& key, Group& group, absl::Time now, bool force,
            Actions* actions) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Run(Actions actions);
  void OnWritten(Upstream* stream, bool ok);
  void OnAnswer(Upstream* stream, const v1::HeartbeatResponse& response);
  // Hands `response` (the answer to the message of `sent`) to its callers,
  // and queues again those an old server did not answer.
  void Split(const std::string& key, Group& group, std::vector<Entry> sent,
             const v1::HeartbeatResponse& response, Answers* answers,
             Actions* actions) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sends `beat` (owned from here on) as a unary Heartbeat.
  void SendUnary(const std::string& key, UnaryBeat* beat);
  bool AllCallsEnded() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return open_streams_ == 0 && unary_in_flight_.empty();
  }
  // The stream's read failed: it is over; retire it.
  void OnBroken(Upstream* stream);
  // gRPC is done with it (after its hold was released).
  void OnEnded(Upstream* stream, const grpc::Status& status);
  void ReleaseIfIdle(Upstream* stream, Actions* actions)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const RelayOptions options_;
  v1::Rendezvous::Stub* const stub_;
  RelayCounters* const counters_;

  absl::Mutex mu_;
  std::map<std::string, Group> groups_ ABSL_GUARDED_BY(mu_);
  int open_streams_ ABSL_GUARDED_BY(mu_) = 0;
  std::set<std::shared_ptr<grpc::ClientContext>> unary_in_flight_
      ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  absl::CondVar changed_;
  std::thread flusher_;
};

}  // namespace ddprun::relay
