#pragma once

#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "ddprun/v1/rendezvous.grpc.pb.h"

namespace ddprun::bench {

struct AgentsOptions {
  std::string endpoint;
  // When set, connection i dials endpoints[i % size] instead (relays in
  // front of the server: the nodes spread over them).
  std::vector<std::string> endpoints;
  std::string run_id = "bench";
  int nodes = 100;
  int local_world_size = 8;
  // Connections the simulated agents share (real agents have one each;
  // thousands of sockets from one process would measure the client).
  int channels = 16;
  absl::Duration heartbeat_interval = absl::Seconds(1);
  absl::Duration heartbeat_timeout = absl::Seconds(3);
  // With figures (PacedHeartbeats, PacedStreamHeartbeats), a node's
  // figures ride on one heartbeat per this interval (rounded to whole
  // heartbeats), as ddprun's agents send them (launcher's
  // HeartbeatPolicyOptions::figures_interval); zero: on every heartbeat;
  // infinite: the interval the server's assignment says
  // (Assignment::figures_interval_ms), as ddprun's agents follow it.
  absl::Duration figures_interval = absl::ZeroDuration();
  int max_restarts = 0;
  // Sent on every call when set (the job's token).
  std::string token;
  // Joins say they can poll (JoinRequest.poll), as ddprun's agent does: a
  // server may then answer `waiting`, and the node Joins again after the
  // interval it says. False: every Join is parked (agents older than it).
  bool poll = true;
  // Nodes per Join message (JoinRequest.more, a relay's batch); 1: each
  // node its own Join, as ddprun's agent does.
  int join_batch = 1;
  // The server's CPU time so far (seconds), sampled at the join's phases
  // for JoinResult's accounting; unset: not sampled (0).
  std::function<double()> server_cpu_seconds;
};

// Where the CPU went up to one instant: the server, this process (the
// simulated agents), and the whole machine (/proc/stat: every process on
// every core, and the cores' idle time). Differences of two samples give
// one phase's accounting.
struct CpuSample {
  absl::Time at = absl::InfinitePast();  // InfinitePast: not sampled
  double server_s = 0;
  double agents_s = 0;
  double busy_s = 0;  // all processes, all cores (user, nice, system, irq)
  double idle_s = 0;  // all cores (idle, iowait)
};

struct JoinResult {
  // (A Join message: one node's, or a batch's with AgentsOptions.join_batch.)
  absl::Duration first_to_all;  // first Join sent -> every node assigned
  absl::Duration last_to_all;   // last Join sent -> every node assigned
  // First assignment received -> every node assigned: the round's fan-out
  // after its close (the first answer comes right after the close).
  absl::Duration close_to_all;
  int assigned = 0;
  int64_t waiting_answers = 0;  // `waiting` answers (each one poll more)
  std::string error;  // empty when every node got a consistent assignment

  // Accounting (bench.cc prints it under each row). Samples at the first
  // and the last Join sent, at the first assignment received (the close)
  // and at the last one (every node ranked).
  CpuSample first_sent, last_sent, closed, all_ranked;
  int64_t polls = 0;              // polling Joins sent (after `waiting`)
  int64_t polls_after_close = 0;  // of which sent after the close
  // `waiting` answers received after the close: polls that came before
  // the close and had to poll once more.
  int64_t waits_after_close = 0;
  // Assignments that answered a node's first Join (parked at the server,
  // or answered at once); the others answered a poll.
  int parked_answers = 0;
  // From the close: the latest time the server told a node to poll, the
  // last poll sent; and how late polls were sent after the time they were
  // told (the simulating process's own delay): worst and mean.
  absl::Duration last_poll_due = absl::ZeroDuration();
  absl::Duration last_poll_sent = absl::ZeroDuration();
  absl::Duration max_poll_late = absl::ZeroDuration();
  absl::Duration mean_poll_late = absl::ZeroDuration();
};

// Heartbeats on Rendezvous.Heartbeats streams (StreamedHeartbeats).
struct StreamedResult {
  double per_second = 0;  // answered heartbeats per second
  int64_t beats = 0;      // answered heartbeats in the window
  int idle_streams = 0;   // other streams held open meanwhile
  std::string error;      // empty when every stream worked
};

struct DetectionResult {
  absl::Duration first_knows;  // victim silent -> first survivor told rejoin
  absl::Duration all_know;     // victim silent -> every survivor told
  bool complete = false;
};

// Many agents of one job in one process, over real gRPC with no thread per
// agent: the callback client API, and for Join the async API with one
// completion queue and thread per connection. Not thread-safe; one
// measurement at a time.
struct PacedStreams;  // simulated_agents.cc

class SimulatedAgents {
 public:
  explicit SimulatedAgents(AgentsOptions options);
  ~SimulatedAgents();
  SimulatedAgents(const SimulatedAgents&) = delete;
  SimulatedAgents& operator=(const SimulatedAgents&) = delete;

  // Every node Joins at once (min = max = nodes); waits for all answers.
  JoinResult JoinAll(absl::Duration timeout);
  // Heartbeats kept `in_flight` at a time, round-robin over the nodes, for
  // `duration`; returns completed heartbeats per second.
  double HeartbeatThroughput(absl::Duration duration, int in_flight);
  // Heartbeats on `streams` Heartbeats streams for `duration`, each stream
  // beating for nodes i, i + streams, ... in turn with up to `window`
  // beats unanswered, spread over the connections. With `idle_streams`,
  // that many other streams (one per node, nodes 0..) each beat once first
  // and stay open, silent, during the measurement: what the server holds
  // when every node of a large job has its stream. The error says
  // UNIMPLEMENTED for a server without the stream. `before` runs when the
  // idle streams are open and the measurement starts, `after` when it
  // ended, the idle streams still open.
  // With per_message > 1 each message carries that many nodes' beats
  // (HeartbeatRequest.more: a relay's batch).
  StreamedResult StreamedHeartbeats(absl::Duration duration, int streams,
                                    int window, int idle_streams,
                                    int per_message,
                                    const std::function<void()>& before,
                                    const std::function<void()>& after);
  // Every node heartbeats once per interval (the server's, spread over
  // it) for `duration`, as the agents of a running job do, on unary calls;
  // with `figures`, one heartbeat per figures_interval carries its node's
  // ranks' figures (RankFigures: what an agent summarises of its ranks'
  // steps; one rank of node 7 twice as slow). Returns the heartbeats
  // answered OK.
  int64_t PacedHeartbeats(absl::Duration duration, bool figures);
  // The same on Rendezvous.Heartbeats streams, one per node as ddprun's
  // agents hold them, opened at the first call and kept open until the
  // destructor (at most one beat in flight per stream: a beat due while
  // the last is still being written is skipped). Returns the heartbeats
  // answered; 0 with an error on stderr when a stream failed.
  int64_t PacedStreamHeartbeats(absl::Duration duration, bool figures);
  // Every node heartbeats once per interval (spread over the interval);
  // node 0 stops. Measures when the survivors learn the round is over.
  DetectionResult DetectLostNode(absl::Duration max_wait);
  // Node 0 reports a failure in the current round: the round ends and the
  // nodes may JoinAll again (max_restarts permitting).
  absl::Status EndRound();
  int64_t round() const { return round_; }
  // What the last assignment said (the server may lengthen the job's
  // interval and timeout for a large job); the options' before a Join.
  absl::Duration heartbeat_interval() const { return interval_; }
  absl::Duration heartbeat_timeout() const { return timeout_; }
  // The figures interval the agents use: the options', or the assignment's
  // when the options say infinite (1 s before a Join).
  absl::Duration figures_interval() const;

 private:
  // With figures: every how many heartbeats a node sends them.
  int64_t FiguresEvery() const;
  // A Join in flight on one of queues_; `answered` is its JoinAll's.
  struct JoinCall {
    grpc::ClientContext context;
    v1::JoinResponse response;
    grpc::Status status;
    std::unique_ptr<grpc::ClientAsyncResponseReader<v1::JoinResponse>> reader;
    const std::function<void(JoinCall*)>* answered = nullptr;
    int node = 0;
    int count = 1;      // nodes node .. node + count - 1 (a batch when > 1)
    bool poll = false;  // a poll (the node was answered `waiting` before)
  };
  // Sends node `node`'s Join on its connection's queue; with count > 1 one
  // batched Join for nodes node .. node + count - 1.
  void SendJoin(int node, absl::Duration join_timeout,
                const std::function<void(JoinCall*)>* answered,
                bool poll = false, int count = 1);
  // Node `node`'s Join request.
  void FillJoin(int node, absl::Duration join_timeout,
                v1::JoinRequest* request) const;
  CpuSample SampleCpu() const;

  v1::Rendezvous::Stub& Stub(int node) { return *stubs_[node % stubs_.size()]; }
  std::string NodeId(int node) const;
  // Calls beat(node, tick) for every node once per interval, spread over
  // it, for `duration` (tick counts the calls from 0).
  void Pace(absl::Duration duration,
            absl::FunctionRef<void(int node, int64_t tick)> beat) const;
  // Node `node`'s heartbeat in the current round, with a 10 s deadline.
  void PrepareBeat(int node, grpc::ClientContext* context,
                   v1::HeartbeatRequest* request) const;
  // The token, when set, on a call about to start.
  void Authorize(grpc::ClientContext* context) const;

  AgentsOptions options_;
  std::vector<std::unique_ptr<v1::Rendezvous::Stub>> stubs_;
  std::vector<std::unique_ptr<grpc::CompletionQueue>> queues_;
  std::vector<std::thread> threads_;
  int64_t round_ = 0;
  std::unique_ptr<PacedStreams> paced_;  // PacedStreamHeartbeats' streams
  absl::Duration interval_;
  absl::Duration timeout_;
  absl::Duration assigned_figures_interval_ = absl::Seconds(1);
};

}  // namespace ddprun::bench
