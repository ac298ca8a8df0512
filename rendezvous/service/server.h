#pragma once

#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/credentials.h"
#include "common/metrics.h"
#include "grpcpp/server.h"
#include "rendezvous/core/job_table.h"
#include "rendezvous/core/limits.h"
#include "rendezvous/core/memory_return.h"
#include "rendezvous/core/store_state.h"
#include "rendezvous/core/ticker.h"
#include "rendezvous/service/rendezvous_service.h"
#include "rendezvous/service/store_service.h"
#include "rendezvous/service/token_check.h"

namespace ddprun::rendezvous {

struct ServerOptions {
  std::string host = "127.0.0.1";  // "0.0.0.0" / "::" for all interfaces
  int port = 0;                    // 0: the kernel picks; read it with port()
  // Every Rendezvous and Store call must carry it (metadata
  // "authorization: Bearer <token>"); empty: no token check.
  std::string token;
  // When set, the server serves this one job: calls on another run id are
  // refused. The rendezvous a ddprun agent hosts serves its own job only.
  std::string only_run_id;
  // Without a token, whether any caller may read Status. The rendezvous an
  // agent hosts off loopback answers it only with a token: an open one
  // gives no more than torchrun's c10d store would.
  bool status_without_token = true;
  // TLS when tls.cert_file is set; mutual TLS when tls.client_ca_file is too.
  common::ServerTlsOptions tls;
  Limits limits;
  // Deadlines are checked at most this often: the precision of every
  // server-side timeout (join, last call, heartbeat, store waits), and the
  // batching of a burst of them.
  absl::Duration tick_interval = absl::Milliseconds(10);
  // Between deadlines the ticker sleeps, at most this long (and at most
  // half of forgive_stalls_over, so that its sleeps never look like a
  // stall). An idle server wakes ~2 times a second, not 100 (Ticker).
  absl::Duration max_tick_sleep = absl::Milliseconds(500);
  // Finished and abandoned jobs are kept this long, then released.
  absl::Duration ended_job_grace = absl::Minutes(5);
  // While calls are parked on a connection, the server pings its client
  // this often and drops the connection when a ping is not answered within
  // keepalive_timeout; the parked calls are then cancelled (a parked Join's
  // node is dropped). This finds agents whose host died or was cut off,
  // which close no socket.
  absl::Duration keepalive_time = absl::Seconds(10);
  absl::Duration keepalive_timeout = absl::Seconds(5);
  // Clients may ping this often while their calls send no data: ddprun's
  // own ping every 2 s while a call is in flight (common/credentials.h says
  // why). A client that pings more often is told to stop (GOAWAY) after
  // gRPC's two strikes.
  absl::Duration min_ping_interval = absl::Seconds(1);
  // Completion queues (one thread each) that serve Join: parked Joins
  // spread over them (async_join.h says why). Each thread also takes turns
  // in gRPC's poller, which costs every other call some CPU (8 queues:
  // ~14 % more per heartbeat, bench/rendezvous/README.md).
  int join_queues = 8;
  // Heartbeat streams open at once; more are refused and those agents send
  // unary heartbeats (HeartbeatStreams::set_max_streams says why).
  int64_t max_heartbeat_streams = 1024;
  // Assignments carry the peer list up to this many nodes.
  int max_peers_in_assignment = 128;
  // Heartbeats per second one job may send; larger jobs get a longer
  // interval (JobOptions::heartbeat_budget_per_s). 0: never lengthened.
  int64_t heartbeat_budget_per_s = 10000;
  // How often each node sends its ranks' straggler figures, and the
  // figures messages per second one job may send: larger jobs send them
  // less often (JobOptions::figures_interval, figures_budget_per_s). A
  // budget of 0: never lengthened.
  absl::Duration figures_interval = JobOptions{}.figures_interval;
  int64_t figures_budget_per_s = JobOptions{}.figures_budget_per_s;
  // Joins with `poll` parked per job; the others are answered `waiting`
  // and poll (JobOptions::max_parked_joins).
  int64_t max_parked_joins = 16384;
  // Polls per second one job's polling nodes may send; more polling nodes
  // get a longer poll interval (PollPacingOptions::budget_per_s).
  int64_t poll_budget_per_s = 25000;
  // The longest a waiting node is told to wait for the forming round's
  // expected close before it polls (PollPacingOptions::max_delay).
  absl::Duration max_poll_delay = absl::Seconds(10);
  // A tick this much later than the previous one means the server did not
  // run: that time does not count as any node's silence
  // (JobOptions::forgive_stalls_over).
  absl::Duration forgive_stalls_over = absl::Seconds(1);
  // After this many calls were parked at once and then answered, the
  // memory gRPC held for them is given back to the system once the Join
  // traffic calmed (MemoryReturn). 0: never.
  size_t return_memory_after_parked = 10000;
  // Who is named a straggler: a rank whose compute time per step stays
  // above `factor` times the other ranks' median for `windows` windows.
  StragglerOptions straggler;
  // The time source; nullptr: the real clock. Must outlive the server.
  const common::Clock* clock = nullptr;
  // Prometheus metrics: every RPC by method and code with its latency, and
  // per job its round, nodes, restarts and failures (read at scrape time).
  // Not owned; must outlive the server. nullptr: no metrics.
  common::MetricsRegistry* metrics = nullptr;
};

// ddprun's rendezvous server: the Rendezvous and Store services, the gRPC
// health service and server reflection, on one port. Used by
// ddprun-rendezvous and embedded by `ddprun --standalone`.
// Thread-safe; Shutdown may be called from any thread but a gRPC callback.
class Server {
 public:
  static absl::StatusOr<std::unique_ptr<Server>> Start(
      const ServerOptions& options);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  int port() const { return port_; }
  // What Rendezvous.Status answers (for the job pages, job_page.h).
  absl::StatusOr<v1::StatusResponse> JobStatus(
      const v1::StatusRequest& request) const {
    return jobs_.Status(request);
  }
  // "host:port" a client can dial; a wildcard host becomes loopback.
  std::string endpoint() const;
  // Where it listens: "host:port" as bound, with "(all interfaces)" after a
  // wildcard host.
  std::string listen_address() const;
  // Idempotent; the destructor calls it. Parked calls are answered
  // UNAVAILABLE, then the server stops.
  void Shutdown();

  // Ticks of the deadline thread so far, and its sleep after the last one.
  int64_t TicksForTest() const { return ticker_.ticks(); }
  absl::Duration PlannedTickSleepForTest() const {
    return ticker_.PlannedSleepForTest();
  }
  // Store Get/Wait calls parked now.
  size_t NumStoreWaitersForTest() const { return store_.num_waiters(); }
  // Calls parked now, Joins and store Get/Wait: each holds a reactor that
  // only an answer, a cancellation or shutdown releases.
  size_t NumParkedCallsForTest() const {
    return rendezvous_service_.num_parked() + store_service_.num_parked();
  }
  // Join calls each Join queue has received (all Joins go through them).
  std::vector<int64_t> JoinsPerQueueForTest() const {
    return rendezvous_service_.JoinsPerQueue();
  }
  // Heartbeats answered on Heartbeats streams, and such streams open now.
  int64_t StreamedHeartbeatsForTest() const {
    return rendezvous_service_.heartbeat_streams().beats();
  }
  int64_t OpenHeartbeatStreamsForTest() const {
    return rendezvous_service_.heartbeat_streams().open_streams();
  }
  int64_t RefusedHeartbeatStreamsForTest() const {
    return rendezvous_service_.heartbeat_streams().refused_streams();
  }
  // Answers pushed on streams when their nodes' rounds ended.
  int64_t HeartbeatPushesForTest() const {
    return rendezvous_service_.heartbeat_streams().pushes();
  }
  // Bytes the store charges now (limits.h), all jobs / one job.
  // How often memory was given back (three times per large fan-out).
  int MemoryTrimsForTest() const { return trims_.load(); }
  int64_t StoreBytesForTest() const { return store_.num_bytes(); }
  // Store writes parked by their job's write rate now, and since the start.
  size_t ParkedStoreWritesForTest() const {
    return store_service_.num_parked_writes();
  }
  int64_t DelayedStoreWritesForTest() const {
    return store_service_.delayed_writes();
  }
  int64_t HeldStoreRefusalsForTest() const {
    return store_service_.held_refusals();
  }
  int64_t JobStoreBytesForTest(const std::string& run_id) const {
    return store_.num_job_bytes(run_id);
  }

 private:
  explicit Server(const ServerOptions& options);
  // After a fan-out of at least return_memory_after_parked calls, once
  // they are answered and the Join traffic calmed (MemoryReturn), gives
  // the memory they held back to the system (ticker thread).
  void MaybeReturnMemory();
  // With Limits::max_memory_bytes: samples the resident memory for the
  // store's admission, giving back what glibc keeps free when the bound is
  // near (ticker thread).
  void SampleMemory();
  // One tick of the ticker thread; returns when the next is due.
  absl::Time Tick();
  // Sets the job gauges from the job table on every scrape.
  void AddJobMetrics(common::MetricsRegistry* registry);
  // The heartbeat streams' beats and open streams, on every scrape.
  void AddHeartbeatStreamMetrics(common::MetricsRegistry* registry);
  // Store writes delayed, refused parking, and parked now, on every scrape.
  void AddStoreWriteMetrics(common::MetricsRegistry* registry);

  const ServerOptions options_;
  const common::Clock* const clock_;
  // Before the tables: they tell it their deadlines from their first call
  // to their last.
  Ticker ticker_;
  const TokenCheck token_check_;
  JobTable jobs_;
  StoreState store_;
  StoreService store_service_;
  RendezvousService rendezvous_service_;
  std::unique_ptr<grpc::Server> server_;
  MemoryReturn memory_return_;  // MaybeReturnMemory's (ticker thread)
  std::atomic<int> trims_{0};
  std::optional<absl::Time> last_bound_trim_;  // SampleMemory's (ticker)
  int port_ = 0;
  absl::Mutex shutdown_mu_;
  bool shut_down_ ABSL_GUARDED_BY(shutdown_mu_) = false;
};

}  // namespace ddprun::rendezvous
