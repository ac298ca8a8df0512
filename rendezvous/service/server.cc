#include "rendezvous/service/server.h"

#include <fcntl.h>
#include <malloc.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <limits>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/endpoint.h"
#include "common/metrics_grpc.h"
#include "common/rendezvous_words.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server_builder.h"
#include "rendezvous/service/parse_error_interceptor.h"
#include "spdlog/spdlog.h"

namespace ddprun::rendezvous {
namespace {

// The process's resident memory (VmRSS), from /proc/self/statm; 0 when it
// cannot be read.
int64_t ResidentBytes() {
  int fd = open("/proc/self/statm", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  char buf[128];
  ssize_t n = read(fd, buf, sizeof(buf) - 1);
  close(fd);
  if (n <= 0) return 0;
  buf[n] = '\0';
  long size = 0;
  long resident = 0;
  if (std::sscanf(buf, "%ld %ld", &size, &resident) != 2) return 0;
  return static_cast<int64_t>(resident) * sysconf(_SC_PAGESIZE);
}

TickerOptions TickOptions(const ServerOptions& options) {
  TickerOptions ticker;
  ticker.min_period = options.tick_interval;
  // A job takes a gap between ticks longer than forgive_stalls_over for a
  // stalled server (Job::Tick): the ticker's own sleeps stay well below.
  ticker.max_sleep = options.max_tick_sleep;
  if (options.forgive_stalls_over != absl::InfiniteDuration()) {
    ticker.max_sleep =
        std::min(ticker.max_sleep, options.forgive_stalls_over / 2);
  }
  return ticker;
}

JobTableOptions TableOptions(const ServerOptions& options,
                             std::function<void(absl::Time)> wake_by) {
  JobTableOptions table;
  table.wake_by = std::move(wake_by);
  table.ended_job_grace = options.ended_job_grace;
  table.job.max_peers_in_assignment = options.max_peers_in_assignment;
  table.job.heartbeat_budget_per_s = options.heartbeat_budget_per_s;
  table.job.figures_interval = options.figures_interval;
  table.job.figures_budget_per_s = options.figures_budget_per_s;
  table.job.max_parked_joins = options.max_parked_joins;
  table.job.poll.budget_per_s = options.poll_budget_per_s;
  table.job.poll.max_delay = options.max_poll_delay;
  table.job.forgive_stalls_over = options.forgive_stalls_over;
  table.job.straggler = options.straggler;
  table.limits = options.limits;
  return table;
}

}  // namespace

Server::Server(const ServerOptions& options)
    : options_(options),
      clock_(options.clock != nullptr ? options.clock
                                      : &common::RealClock::Get()),
      ticker_(clock_, TickOptions(options)),
      token_check_(TokenCheckOptions{
          .secret = options.token,
          .only_run_id = options.only_run_id,
          .status_without_secret = options.status_without_token}),
      jobs_(clock_,
            TableOptions(options, [this](absl::Time t) { ticker_.WakeBy(t); })),
      store_(clock_, options.limits),
      store_service_(&jobs_, &store_, &token_check_, options.limits, clock_),
      rendezvous_service_(&jobs_, &store_service_, &token_check_,
                          options.join_queues),
      memory_return_(MemoryReturnOptions{
          .large_fan_out = options.return_memory_after_parked}) {
  rendezvous_service_.mutable_heartbeat_streams()->set_max_streams(
      options.max_heartbeat_streams);
  store_.SetWakeBy([this](absl::Time t) { ticker_.WakeBy(t); });
  store_service_.SetWakeBy([this](absl::Time t) { ticker_.WakeBy(t); });
}

absl::StatusOr<std::unique_ptr<Server>> Server::Start(
    const ServerOptions& options) {
  if (options.port < 0 || options.port > 65535) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "bad port %d: give 1-65535, or 0 to let the kernel pick one",
        options.port));
  }
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> credentials =
      common::CreateServerCredentials(options.tls);
  if (!credentials.ok()) return credentials.status();
  std::unique_ptr<Server> server(new Server(options));
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  // gRPC sets SO_REUSEPORT by default: a second server would then share a
  // busy port silently instead of failing.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.AddChannelArgument(
      GRPC_ARG_KEEPALIVE_TIME_MS,
      static_cast<int>(absl::ToInt64Milliseconds(options.keepalive_time)));
  builder.AddChannelArgument(
      GRPC_ARG_KEEPALIVE_TIMEOUT_MS,
      static_cast<int>(absl::ToInt64Milliseconds(options.keepalive_timeout)));
  // A parked call sends no data for minutes: keep pinging regardless (gRPC
  // stops after 2 pings without data by default).
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  builder.AddChannelArgument(
      GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS,
      static_cast<int>(absl::ToInt64Milliseconds(options.min_ping_interval)));
  std::string address = common::Endpoint{options.host, options.port}.ToString();
  // A CompareSet carries two values: room for both at the value limit.
  const Limits& limits = options.limits;
  builder.SetMaxReceiveMessageSize(static_cast<int>(std::min<int64_t>(
      std::max(limits.max_message_bytes,
               2 * limits.max_value_bytes + limits.max_key_bytes + 65536),
      std::numeric_limits<int>::max())));
  builder.AddListeningPort(address, *credentials, &server->port_);
  builder.RegisterService(&server->rendezvous_service_);
  server->rendezvous_service_.AddJoinQueues(&builder);
  builder.RegisterService(&server->store_service_);
  // The parse-error rewrite first, so that /metrics counts the code sent.
  std::vector<
      std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>>
      interceptors;
  interceptors.push_back(std::make_unique<ParseErrorInterceptorFactory>());
  if (options.metrics != nullptr) {
    for (auto& metrics :
         common::GrpcServerMetricsInterceptors(options.metrics)) {
      interceptors.push_back(std::move(metrics));
    }
  }
  builder.experimental().SetInterceptorCreators(std::move(interceptors));
  if (options.metrics != nullptr) {
    server->AddJobMetrics(options.metrics);
    server->AddHeartbeatStreamMetrics(options.metrics);
    server->AddStoreWriteMetrics(options.metrics);
  }
  server->server_ = builder.BuildAndStart();
  if (server->server_ == nullptr || server->port_ == 0) {
    return absl::UnavailableError(absl::StrFormat(
        "cannot listen on %s: the address is in use or not local; pick "
        "another --host/--port (port 0 lets the kernel pick)",
        address));
  }
  server->rendezvous_service_.StartJoins();
  server->SampleMemory();
  Server* raw = server.get();
  server->ticker_.Start([raw] { return raw->Tick(); });
  spdlog::info(
      "rendezvous server listening on {} ({}, {})", server->listen_address(),
      options.tls.cert_file.empty()
          ? "plaintext"
          : (options.tls.client_ca_file.empty() ? "TLS" : "mutual TLS"),
      options.token.empty() ? "no token" : "token required");
  return server;
}

Server::~Server() { Shutdown(); }

absl::Time Server::Tick() {
  absl::Time next = std::min(rendezvous_service_.Tick(), store_service_.Tick());
  // MemoryReturn's windows are seconds long: the ticker's max_sleep serves
  // it.
  MaybeReturnMemory();
  SampleMemory();
  // Under a memory bound the store admits writes by the last sample: keep
  // it as fresh as before (every tick_interval).
  if (options_.limits.max_memory_bytes > 0) next = absl::InfinitePast();
  return next;
}

void Server::MaybeReturnMemory() {
  // gRPC holds ~15 KiB per parked call (100,000 parked Joins: 1.5 GiB).
  // Once they are answered glibc keeps that memory for reuse, so the server
  // stayed at its peak for good; after a large fan-out it is given back.
  // Joins: the fan-outs that size (store waiters are few).
  FanOutState state;
  state.parked = rendezvous_service_.num_parked();
  state.peak_parked = rendezvous_service_.TakePeakParked();
  state.join_calls = rendezvous_service_.join_calls();
  // (One lock of the job table per tick, only between a fan-out and its
  // first trim.)
  state.answers_for_poll =
      memory_return_.wants_answers_for_poll() ? jobs_.AnswersForPoll() : 0;
  if (!memory_return_.Tick(clock_->Now(), state)) return;
#ifdef __GLIBC__
  malloc_trim(0);
#endif
  trims_.fetch_add(1);
}

void Server::SampleMemory() {
  const int64_t bound = options_.limits.max_memory_bytes;
  if (bound <= 0) return;
  int64_t resident = ResidentBytes();
  // Near the bound, memory glibc keeps free (of values deleted, rounds
  // released, answered calls) would refuse writes it could hold: give it
  // back first, at most once a second.
  const absl::Time now = clock_->Now();
  if (resident > bound - bound / 10 &&
      (!last_bound_trim_.has_value() ||
       now - *last_bound_trim_ >= absl::Seconds(1))) {
    last_bound_trim_ = now;
#ifdef __GLIBC__
    malloc_trim(0);
#endif
    resident = ResidentBytes();
  }
  store_.SetResidentBytes(resident);
}

namespace {

// A job's straggler and compute-time gauges. Bounded per job: the named
// stragglers (StragglerOptions::max_reported) and the 8 slowest ranks, so
// that a 1,000-node job does not make 8,000 series.
void AddRankGauges(const v1::JobStatus& job, common::GaugeFamily& stragglers,
                   common::GaugeFamily& straggler_ratio,
                   common::GaugeFamily& compute_median,
                   common::GaugeFamily& rank_compute,
                   common::GaugeFamily& steps_rate) {
  if (job.state() != v1::JOB_STATE_RUNNING) return;
  stragglers.WithLabels({job.run_id()}).Set(job.stragglers_size());
  for (const v1::Straggler& s : job.stragglers()) {
    straggler_ratio.WithLabels({job.run_id(), absl::StrCat(s.rank())})
        .Set(s.ratio());
  }
  std::vector<std::pair<double, int>> slowest;  // compute, rank
  std::vector<double> rates;
  for (const v1::NodeStatus& node : job.nodes()) {
    for (const v1::RankFigures& r : node.ranks()) {
      rates.push_back(r.steps_per_s());
      if (r.samples() > 0) {
        slowest.push_back(
            {r.compute_mean_s(), node.rank_offset() + r.local_rank()});
      }
    }
  }
  if (slowest.empty() && rates.empty()) return;
  compute_median.WithLabels({job.run_id()}).Set(job.compute_median_s());
  constexpr size_t kSlowest = 8;
  const size_t n = std::min(kSlowest, slowest.size());
  std::partial_sort(slowest.begin(), slowest.begin() + n, slowest.end(),
                    std::greater<>());
  for (size_t i = 0; i < n; ++i) {
    rank_compute.WithLabels({job.run_id(), absl::StrCat(slowest[i].second)})
        .Set(slowest[i].first);
  }
  if (!rates.empty()) {
    std::nth_element(rates.begin(), rates.begin() + rates.size() / 2,
                     rates.end());
    steps_rate.WithLabels({job.run_id()}).Set(rates[rates.size() / 2]);
  }
}

}  // namespace

void Server::AddJobMetrics(common::MetricsRegistry* registry) {
  common::GaugeFamily& jobs = registry->AddGauge(
      "ddprun_rendezvous_jobs", "Jobs the server holds, by state", {"state"});
  common::GaugeFamily& round = registry->AddGauge(
      "ddprun_rendezvous_round", "Each job's current round", {"run_id"});
  common::GaugeFamily& nodes =
      registry->AddGauge("ddprun_rendezvous_nodes",
                         "Each job's nodes, by state", {"run_id", "state"});
  common::GaugeFamily& restarts = registry->AddGauge(
      "ddprun_rendezvous_restarts", "Restarts each job has used", {"run_id"});
  common::GaugeFamily& failures = registry->AddGauge(
      "ddprun_rendezvous_failures",
      "Worker failures each job recorded, by cause", {"run_id", "cause"});
  common::GaugeFamily& heartbeat_age = registry->AddGauge(
      "ddprun_rendezvous_heartbeat_age_seconds",
      "Age of the oldest last heartbeat among each job's nodes", {"run_id"});
  common::GaugeFamily& stragglers = registry->AddGauge(
      "ddprun_rendezvous_stragglers",
      "Ranks each job names stragglers now (--straggler-factor)", {"run_id"});
  common::GaugeFamily& straggler_ratio = registry->AddGauge(
      "ddprun_rendezvous_straggler_ratio",
      "Each straggler's compute time per step over the other ranks' median "
      "(at most 16 per job)",
      {"run_id", "rank"});
  common::GaugeFamily& compute_median = registry->AddGauge(
      "ddprun_rendezvous_compute_median_seconds",
      "Median across each job's ranks of their own compute time per step",
      {"run_id"});
  common::GaugeFamily& rank_compute = registry->AddGauge(
      "ddprun_rendezvous_rank_compute_seconds",
      "Compute time per step of each job's slowest ranks (at most 8 per job)",
      {"run_id", "rank"});
  common::GaugeFamily& steps_rate = registry->AddGauge(
      "ddprun_rendezvous_steps_per_second",
      "Each job's training steps per second (the median rank's)", {"run_id"});
  registry->AddCollectHook([this, &jobs, &round, &nodes, &restarts, &failures,
                            &heartbeat_age, &stragglers, &straggler_ratio,
                            &compute_median, &rank_compute, &steps_rate] {
    absl::StatusOr<v1::StatusResponse> status =
        jobs_.Status(v1::StatusRequest());
    if (!status.ok()) return;
    for (common::GaugeFamily* family :
         {&jobs, &round, &nodes, &restarts, &failures, &heartbeat_age,
          &stragglers, &straggler_ratio, &compute_median, &rank_compute,
          &steps_rate}) {
      family->Clear();
    }
    for (const v1::JobStatus& job : status->jobs()) {
      jobs.WithLabels({v1::JobState_Name(job.state())}).Add(1);
      round.WithLabels({job.run_id()}).Set(job.round());
      restarts.WithLabels({job.run_id()}).Set(job.restart_count());
      int64_t oldest_ms = 0;
      for (const v1::NodeStatus& node : job.nodes()) {
        nodes
            .WithLabels(
                {job.run_id(), common::NodeStateWord(node.node_state())})
            .Add(1);
        oldest_ms = std::max(oldest_ms, node.last_heartbeat_age_ms());
      }
      heartbeat_age.WithLabels({job.run_id()}).Set(oldest_ms / 1000.0);
      AddRankGauges(job, stragglers, straggler_ratio, compute_median,
                    rank_compute, steps_rate);
      for (const v1::WorkerFailure& failure : job.failures()) {
        failures
            .WithLabels({job.run_id(),
                         common::FailureCauseWord(failure.failure_cause())})
            .Add(1);
      }
    }
  });
}

void Server::AddHeartbeatStreamMetrics(common::MetricsRegistry* registry) {
  // A stream is one call to the interceptors (counted when it ends): its
  // beats are counted here, from HeartbeatStreams' own counter at scrape
  // time, so that the hot path takes no metric.
  common::CounterFamily& beats = registry->AddCounter(
      "ddprun_rendezvous_streamed_heartbeats_total",
      "Heartbeats answered on Heartbeats streams (unary ones are "
      "ddprun_grpc_server_handled_total{method=\"Heartbeat\"})",
      {});
  common::GaugeFamily& open = registry->AddGauge(
      "ddprun_rendezvous_heartbeat_streams", "Heartbeat streams open now", {});
  auto reported = std::make_shared<int64_t>(0);
  registry->AddCollectHook([this, &beats, &open, reported] {
    const HeartbeatStreams& streams = rendezvous_service_.heartbeat_streams();
    const int64_t now = streams.beats();
    if (now > *reported) {
      beats.WithLabels({}).Increment(static_cast<double>(now - *reported));
      *reported = now;
    }
    open.WithLabels({}).Set(static_cast<double>(streams.open_streams()));
  });
}

void Server::AddStoreWriteMetrics(common::MetricsRegistry* registry) {
  common::CounterFamily& delayed = registry->AddCounter(
      "ddprun_rendezvous_store_writes_delayed_total",
      "Store writes answered late because their job passed "
      "--max-job-store-write-bytes-per-s",
      {});
  common::CounterFamily& refused = registry->AddCounter(
      "ddprun_rendezvous_store_writes_refused_parking_total",
      "Store writes over their job's rate refused RESOURCE_EXHAUSTED because "
      "holding them would pass --max-job-parked-write-bytes or a twentieth of "
      "--max-memory-bytes",
      {});
  common::CounterFamily& held = registry->AddCounter(
      "ddprun_rendezvous_store_refusals_held_total",
      "Of those refusals, the ones answered late, when their job's rate had "
      "paid for them (--max-held-store-refusals)",
      {});
  common::GaugeFamily& parked = registry->AddGauge(
      "ddprun_rendezvous_store_writes_parked",
      "Store writes (and held refusals) waiting for their job's write rate "
      "now",
      {});
  auto reported = std::make_shared<std::pair<int64_t, int64_t>>(0, 0);
  auto reported_held = std::make_shared<int64_t>(0);
  registry->AddCollectHook([this, &delayed, &refused, &held, &parked, reported,
                            reported_held] {
    const int64_t d = store_service_.delayed_writes();
    const int64_t r = store_service_.refused_writes();
    const int64_t h = store_service_.held_refusals();
    if (h > *reported_held) {
      held.WithLabels({}).Increment(static_cast<double>(h - *reported_held));
      *reported_held = h;
    }
    if (d > reported->first) {
      delayed.WithLabels({}).Increment(
          static_cast<double>(d - reported->first));
      reported->first = d;
    }
    if (r > reported->second) {
      refused.WithLabels({}).Increment(
          static_cast<double>(r - reported->second));
      reported->second = r;
    }
    parked.WithLabels({}).Set(
        static_cast<double>(store_service_.num_parked_writes()));
  });
}

std::string Server::endpoint() const {
  std::string host = options_.host;
  if (host == "0.0.0.0" || host.empty()) host = "127.0.0.1";
  if (host == "::" || host == "[::]") host = "::1";
  return common::Endpoint{host, port_}.ToString();
}

std::string Server::listen_address() const {
  const std::string& host = options_.host;
  bool wildcard =
      host.empty() || host == "0.0.0.0" || host == "::" || host == "[::]";
  std::string bound =
      common::Endpoint{host.empty() ? "0.0.0.0" : host, port_}.ToString();
  return wildcard ? bound + " (all interfaces)" : bound;
}

void Server::Shutdown() {
  {
    absl::MutexLock lock(&shutdown_mu_);
    if (shut_down_) return;
    shut_down_ = true;
  }
  ticker_.Stop();
  if (server_ == nullptr) return;
  grpc::Status closing(grpc::StatusCode::UNAVAILABLE,
                       "the rendezvous server is shutting down; retry "
                       "against a running server");
  rendezvous_service_.CancelAll(closing);
  store_service_.CancelAll(closing);
  // Calls that arrive meanwhile are cancelled at the deadline.
  server_->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(1)));
  server_->Wait();
  rendezvous_service_.StopJoins();
}

}  // namespace ddprun::rendezvous
