#include "bench/rendezvous/simulated_agents.h"

#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <queue>
#include <set>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"

namespace ddprun::bench {
namespace {

// One call in flight: what the callback API needs kept alive until done.
template <typename Request, typename Response>
struct Call {
  grpc::ClientContext context;
  Request request;
  Response response;
};

// What the simulated heartbeat streams of one measurement share.
struct StreamsShared {
  std::atomic<int64_t> answered{0};
  absl::Mutex mu;
  int running ABSL_GUARDED_BY(mu) = 0;
  std::string error ABSL_GUARDED_BY(mu);

  // A stream ended with `status`: the first error (not a cancel) is kept.
  void Ended(const grpc::Status& status) {
    absl::MutexLock lock(&mu);
    if (!status.ok() && status.error_code() != grpc::StatusCode::CANCELLED &&
        error.empty()) {
      error = absl::StrCat(status.error_code(), ": ", status.error_message());
    }
    --running;
  }
};

// One simulated Heartbeats stream: beats for nodes first, first + stride,
// ... in turn, at most `window` unanswered, until `stop`, then closes its
// side; with max_beats it stops after that many and stays open until
// cancelled. gRPC is never called with mu_ held.
class BeatStream final : public grpc::ClientBidiReactor<v1::HeartbeatRequest,
                                                        v1::HeartbeatResponse> {
 public:
  BeatStream(StreamsShared* shared, const std::vector<std::string>* node_ids,
             int first, int stride, int window, int64_t max_beats,
             absl::Time stop, int per_message = 1)
      : per_message_(std::max(1, per_message)),
        shared_(shared),
        node_ids_(node_ids),
        next_(first),
        stride_(stride),
        window_(window),
        max_beats_(max_beats),
        stop_(stop) {}

  void Start(v1::Rendezvous::Stub* stub, const std::string& token,
             const std::string& run_id, int64_t round) {
    if (!token.empty()) {
      context_.AddMetadata("authorization", absl::StrCat("Bearer ", token));
    }
    out_.set_run_id(run_id);
    out_.set_round(round);
    {
      absl::MutexLock lock(&shared_->mu);
      ++shared_->running;
    }
    stub->async()->Heartbeats(&context_, this);
    StartRead(&in_);
    Next();
    StartCall();
  }
  void Cancel() { context_.TryCancel(); }
  int64_t answered() {
    absl::MutexLock lock(&mu_);
    return answered_;
  }

  void OnWriteDone(bool ok) override {
    {
      absl::MutexLock lock(&mu_);
      writing_ = false;
      if (!ok) return;
    }
    Next();
  }
  void OnReadDone(bool ok) override {
    if (!ok) return;  // OnDone follows
    {
      absl::MutexLock lock(&mu_);
      ++answered_;
    }
    const int beats = 1 + in_.more_size();
    if (max_beats_ > 0) {
      // (Under the mutex: StreamedHeartbeats awaits these answers.)
      absl::MutexLock lock(&shared_->mu);
      shared_->answered.fetch_add(beats, std::memory_order_relaxed);
    } else {
      shared_->answered.fetch_add(beats, std::memory_order_relaxed);
    }
    StartRead(&in_);
    Next();
  }
  void OnWritesDoneDone(bool /*ok*/) override {}
  void OnDone(const grpc::Status& status) override { shared_->Ended(status); }

 private:
  // Writes the next beat, or closes the side, when it is time.
  void Next() {
    enum { kNothing, kWrite, kClose } action = kNothing;
    {
      absl::MutexLock lock(&mu_);
      if (writing_ || closed_) return;
      if (max_beats_ > 0 && sent_ >= max_beats_) return;
      if (max_beats_ == 0 && absl::Now() >= stop_) {
        closed_ = true;
        action = kClose;
      } else if (sent_ - answered_ < window_) {
        writing_ = true;
        out_.clear_more();
        for (int i = 0; i < per_message_; ++i) {
          const std::string& id = (*node_ids_)[next_];
          if (i == 0) {
            out_.set_node_id(id);
          } else {
            v1::NodeBeat* beat = out_.add_more();
            beat->set_node_id(id);
            beat->set_round(out_.round());
          }
          next_ += stride_;
          if (next_ >= static_cast<int>(node_ids_->size())) {
            next_ %= stride_;
          }
        }
        ++sent_;
        action = kWrite;
      }
    }
    if (action == kWrite) StartWrite(&out_);
    if (action == kClose) StartWritesDone();
  }

  const int per_message_;  // beats per message (1 + `more`)
  StreamsShared* const shared_;
  const std::vector<std::string>* const node_ids_;
  grpc::ClientContext context_;
  v1::HeartbeatResponse in_;
  absl::Mutex mu_;
  v1::HeartbeatRequest out_;  // the write in flight
  int next_ ABSL_GUARDED_BY(mu_);
  const int stride_;
  const int window_;
  const int64_t max_beats_;
  const absl::Time stop_;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  int64_t sent_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t answered_ ABSL_GUARDED_BY(mu_) = 0;
};

// Every core's busy and idle time so far, seconds, from /proc/stat's first
// line (user nice system idle iowait irq softirq steal ...).
void MachineCpu(double* busy, double* idle) {
  *busy = 0;
  *idle = 0;
  FILE* f = std::fopen("/proc/stat", "r");
  if (f == nullptr) return;
  unsigned long long v[8] = {0};
  int got = std::fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0],
                        &v[1], &v[2], &v[3], &v[4], &v[5], &v[6], &v[7]);
  std::fclose(f);
  if (got < 5) return;
  const double tick = static_cast<double>(sysconf(_SC_CLK_TCK));
  *busy = static_cast<double>(v[0] + v[1] + v[2] + v[5] + v[6] + v[7]) / tick;
  *idle = static_cast<double>(v[3] + v[4]) / tick;
}

// Node `node`'s ranks' figures, `beat` beats into the round: one rank of
// node 7 computes twice as long as the others.
void AddFigures(int node, int local_world_size, int64_t beat,
                v1::HeartbeatRequest* request) {
  for (int r = 0; r < local_world_size; ++r) {
    v1::RankFigures* f = request->add_ranks();
    f->set_local_rank(r);
    f->set_phase("step");
    f->set_steps(1000 + 10 * beat + r);
    f->set_steps_per_s(40);
    f->set_samples(80);
    const double slow = (node == 7 && r == 3) ? 2.0 : 1.0;
    f->set_compute_mean_s(0.020 * slow + 0.0001 * r);
    f->set_compute_median_s(0.019 * slow);
    f->set_compute_p99_s(0.030 * slow);
  }
}

// One node's Heartbeats stream that beats when told (Beat): at most one
// beat being written; the answers are counted in `shared`. gRPC is never
// called with mu_ held.
class PacedStream final
    : public grpc::ClientBidiReactor<v1::HeartbeatRequest,
                                     v1::HeartbeatResponse> {
 public:
  PacedStream(StreamsShared* shared, v1::HeartbeatRequest plain,
              v1::HeartbeatRequest figured)
      : shared_(shared),
        plain_(std::move(plain)),
        figured_(std::move(figured)) {}

  void Start(v1::Rendezvous::Stub* stub, const std::string& token) {
    if (!token.empty()) {
      context_.AddMetadata("authorization", absl::StrCat("Bearer ", token));
    }
    {
      absl::MutexLock lock(&shared_->mu);
      ++shared_->running;
    }
    stub->async()->Heartbeats(&context_, this);
    StartRead(&in_);
    StartCall();
  }
  // False when the last beat is still being written, or the stream ended.
  bool Beat(bool figures) {
    {
      absl::MutexLock lock(&mu_);
      if (writing_ || done_) return false;
      writing_ = true;
    }
    StartWrite(figures ? &figured_ : &plain_);
    return true;
  }
  void Cancel() { context_.TryCancel(); }

  void OnWriteDone(bool /*ok*/) override {
    absl::MutexLock lock(&mu_);
    writing_ = false;
  }
  void OnReadDone(bool ok) override {
    if (!ok) return;  // OnDone follows
    shared_->answered.fetch_add(1, std::memory_order_relaxed);
    StartRead(&in_);
  }
  void OnDone(const grpc::Status& status) override {
    {
      absl::MutexLock lock(&mu_);
      done_ = true;
    }
    shared_->Ended(status);
  }

 private:
  StreamsShared* const shared_;
  grpc::ClientContext context_;
  const v1::HeartbeatRequest plain_;
  const v1::HeartbeatRequest figured_;
  v1::HeartbeatResponse in_;
  absl::Mutex mu_;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace

// The streams of PacedStreamHeartbeats, one per node, open until the
// SimulatedAgents goes.
struct PacedStreams {
  StreamsShared shared;
  std::vector<std::unique_ptr<PacedStream>> streams;

  ~PacedStreams() {
    for (auto& stream : streams) stream->Cancel();
    absl::MutexLock lock(&shared.mu);
    auto ended = [this]() ABSL_SHARED_LOCKS_REQUIRED(shared.mu) {
      return shared.running == 0;
    };
    shared.mu.Await(absl::Condition(&ended));
  }
};

CpuSample SimulatedAgents::SampleCpu() const {
  CpuSample sample;
  sample.at = absl::Now();
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  sample.agents_s = static_cast<double>(ts.tv_sec) + ts.tv_nsec * 1e-9;
  if (options_.server_cpu_seconds) {
    sample.server_s = options_.server_cpu_seconds();
  }
  MachineCpu(&sample.busy_s, &sample.idle_s);
  return sample;
}

SimulatedAgents::SimulatedAgents(AgentsOptions options)
    : options_(std::move(options)),
      interval_(options_.heartbeat_interval),
      timeout_(options_.heartbeat_timeout) {
  int channels = std::max(1, std::min(options_.channels, options_.nodes));
  for (int i = 0; i < channels; ++i) {
    grpc::ChannelArguments args;
    // A distinct argument per channel gives each its own connection.
    args.SetInt("ddprun.bench.channel", i);
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    const std::string& endpoint =
        options_.endpoints.empty()
            ? options_.endpoint
            : options_.endpoints[i % options_.endpoints.size()];
    stubs_.push_back(v1::Rendezvous::NewStub(grpc::CreateCustomChannel(
        endpoint, grpc::InsecureChannelCredentials(), args)));
    // One completion queue per connection for the Joins, one thread each.
    // Real agents are separate processes, each with one call on its own
    // queue; on one shared queue (the callback API's) Debian's libgrpc,
    // built with debug checks, scans every outstanding call on each
    // completion, and the simulating process would measure its own O(n^2),
    // not the server.
    queues_.push_back(std::make_unique<grpc::CompletionQueue>());
    threads_.emplace_back([cq = queues_.back().get()] {
      void* tag = nullptr;
      bool ok = false;
      while (cq->Next(&tag, &ok)) {
        auto* call = static_cast<JoinCall*>(tag);
        (*call->answered)(call);
        delete call;
      }
    });
  }
}

SimulatedAgents::~SimulatedAgents() {
  paced_.reset();  // its streams end before the queues do
  for (auto& cq : queues_) cq->Shutdown();
  for (std::thread& thread : threads_) thread.join();
}

std::string SimulatedAgents::NodeId(int node) const {
  return absl::StrCat("sim-", node);
}

void SimulatedAgents::Authorize(grpc::ClientContext* context) const {
  if (!options_.token.empty()) {
    context->AddMetadata("authorization",
                         absl::StrCat("Bearer ", options_.token));
  }
}

absl::Status SimulatedAgents::EndRound() {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
  Authorize(&context);
  v1::ReportFailureRequest request;
  request.set_run_id(options_.run_id);
  request.set_node_id(NodeId(0));
  request.set_round(round_);
  v1::ReportFailureResponse response;
  grpc::Status status = Stub(0).ReportFailure(&context, request, &response);
  if (!status.ok()) return absl::UnavailableError(status.error_message());
  if (response.restarts_exhausted()) {
    return absl::FailedPreconditionError("the job's restarts ran out");
  }
  return absl::OkStatus();
}

void SimulatedAgents::FillJoin(int i, absl::Duration timeout,
                               v1::JoinRequest* r) const {
  r->set_run_id(options_.run_id);
  r->set_node_id(NodeId(i));
  r->set_local_world_size(options_.local_world_size);
  r->set_node_rank(-1);
  r->set_address(absl::StrCat("10.0.", i / 250, ".", i % 250));
  r->set_master_port(29500);
  r->set_poll(options_.poll);
  v1::JobConfig* c = r->mutable_config();
  c->set_min_nodes(options_.nodes);
  c->set_max_nodes(options_.nodes);
  c->set_max_restarts(options_.max_restarts);
  c->set_join_timeout_ms(absl::ToInt64Milliseconds(timeout));
  c->set_heartbeat_interval_ms(
      absl::ToInt64Milliseconds(options_.heartbeat_interval));
  c->set_heartbeat_timeout_ms(
      absl::ToInt64Milliseconds(options_.heartbeat_timeout));
}

void SimulatedAgents::SendJoin(int i, absl::Duration timeout,
                               const std::function<void(JoinCall*)>* answered,
                               bool poll, int count) {
  auto* call = new JoinCall;
  call->answered = answered;
  call->node = i;
  call->count = count;
  call->poll = poll;
  // As the agent's RendezvousClient::Join: no gRPC deadline on the parked
  // Join (the server answers at join_timeout).
  Authorize(&call->context);
  v1::JoinRequest r;
  FillJoin(i, timeout, &r);
  for (int k = 1; k < count; ++k) FillJoin(i + k, timeout, r.add_more());
  call->reader =
      Stub(i).AsyncJoin(&call->context, r, queues_[i % queues_.size()].get());
  call->reader->Finish(&call->response, &call->status, call);
}

JoinResult SimulatedAgents::JoinAll(absl::Duration timeout) {
  absl::Mutex mu;
  int done = 0;
  int64_t waiting_answers = 0;
  // Polls due, earliest first: one thread sends them (a gRPC alarm per
  // waiting node would put 100,000 timers in the client's own gRPC).
  using Due = std::pair<absl::Time, int>;
  std::priority_queue<Due, std::vector<Due>, std::greater<>> polls;
  bool stop_polling = false;
  absl::Time last_done;
  absl::Time first_assigned = absl::InfiniteFuture();
  std::string error;
  std::set<int> ranks;
  int world_size = -1;
  JoinResult result;
  // Accounting (JoinResult): polls and when they were due and sent.
  bool closed = false;
  absl::Time last_due = absl::InfinitePast();
  absl::Time last_poll_sent = absl::InfinitePast();
  absl::Duration poll_late_sum;
  // One node's answer (a single Join's, or its slot of a batch's); mu held.
  auto node_answered = [&](int node, bool poll, const grpc::Status& status,
                           const v1::JoinResponse& response) {
    if (options_.poll && status.error_code() == grpc::StatusCode::UNAVAILABLE) {
      // As the agent's RendezvousClient: an unreachable server is retried
      // (a batch's nodes one by one).
      polls.emplace(absl::Now() + absl::Seconds(1), node);
      return;
    }
    if (status.ok() && response.has_waiting()) {
      ++waiting_answers;
      if (closed) ++result.waits_after_close;
      const absl::Time due =
          absl::Now() +
          absl::Milliseconds(response.waiting().poll_interval_ms());
      last_due = std::max(last_due, due);
      polls.emplace(due, node);
      return;
    }
    ++done;
    last_done = absl::Now();
    if (status.ok() && response.has_assignment()) {
      if (!closed) {
        closed = true;
        result.closed = SampleCpu();
      }
      if (!poll) ++result.parked_answers;
    }
    if (done == options_.nodes) result.all_ranked = SampleCpu();
    if (!status.ok()) {
      if (error.empty()) error = status.error_message();
    } else if (response.has_error()) {
      if (error.empty()) error = response.error().message();
    } else if (!response.has_assignment()) {
      if (error.empty()) error = "a node got no assignment";
    } else {
      const v1::Assignment& a = response.assignment();
      first_assigned = std::min(first_assigned, last_done);
      if (!ranks.insert(a.node_rank()).second && error.empty()) {
        error = absl::StrCat("duplicate node rank ", a.node_rank());
      }
      if (world_size >= 0 && world_size != a.world_size() && error.empty()) {
        error = "world sizes differ";
      }
      world_size = a.world_size();
      round_ = a.round();
      if (a.heartbeat_interval_ms() > 0) {
        interval_ = absl::Milliseconds(a.heartbeat_interval_ms());
      }
      if (a.heartbeat_timeout_ms() > 0) {
        timeout_ = absl::Milliseconds(a.heartbeat_timeout_ms());
      }
      if (a.figures_interval_ms() > 0) {
        assigned_figures_interval_ =
            absl::Milliseconds(a.figures_interval_ms());
      }
    }
  };
  std::function<void(JoinCall*)> answered = [&](JoinCall* call) {
    absl::MutexLock lock(&mu);
    if (call->count == 1) {
      return node_answered(call->node, call->poll, call->status,
                           call->response);
    }
    // A batch: its nodes are answered in its slots. A server older than
    // JoinRequest.more answers the first node only.
    grpc::Status status = call->status;
    if (status.ok() && call->response.more_size() != call->count - 1) {
      status = grpc::Status(
          grpc::StatusCode::UNIMPLEMENTED,
          absl::StrFormat("a batched Join of %d nodes was answered for %d: "
                          "the server does not batch Joins (--join-batch 1)",
                          call->count, call->response.more_size() + 1));
    }
    if (!status.ok()) {
      for (int k = 0; k < call->count; ++k) {
        node_answered(call->node + k, call->poll, status, {});
      }
      return;
    }
    node_answered(call->node, call->poll, status, call->response);
    for (int k = 1; k < call->count; ++k) {
      node_answered(call->node + k, call->poll, status,
                    call->response.more(k - 1));
    }
  };

  std::thread poller([&] {
    absl::MutexLock lock(&mu);
    while (!stop_polling) {
      absl::Time now = absl::Now();
      std::vector<Due> due;
      while (!polls.empty() && polls.top().first <= now) {
        due.push_back(polls.top());
        polls.pop();
      }
      if (!due.empty()) {
        mu.Unlock();
        absl::Duration late_sum;
        absl::Time sent;
        for (const auto& [when, node] : due) {
          sent = absl::Now();
          late_sum += sent - when;
          result.max_poll_late = std::max(result.max_poll_late, sent - when);
          SendJoin(node, timeout, &answered, /*poll=*/true);
        }
        mu.Lock();
        poll_late_sum += late_sum;
        result.polls += static_cast<int64_t>(due.size());
        last_poll_sent = sent;
        if (closed) {
          result.polls_after_close += static_cast<int64_t>(due.size());
        }
        continue;
      }
      absl::Time next =
          polls.empty() ? now + absl::Milliseconds(50) : polls.top().first;
      auto woken = [&] {
        return stop_polling || (!polls.empty() && polls.top().first < next);
      };
      mu.AwaitWithDeadline(absl::Condition(&woken), next);
    }
  });
  result.first_sent = SampleCpu();
  absl::Time first_sent = result.first_sent.at;
  const int batch = std::max(1, options_.join_batch);
  for (int i = 0; i < options_.nodes; i += batch) {
    SendJoin(i, timeout, &answered, /*poll=*/false,
             std::min(batch, options_.nodes - i));
  }
  // (Before the lock: the close may come before the last send.)
  const CpuSample last_sample = SampleCpu();
  absl::Time last_sent = last_sample.at;
  absl::MutexLock lock(&mu);
  result.last_sent = last_sample;
  auto all_done = [&] { return done == options_.nodes; };
  mu.Await(absl::Condition(&all_done));
  stop_polling = true;
  mu.Unlock();
  poller.join();
  mu.Lock();
  result.waiting_answers = waiting_answers;
  result.first_to_all = last_done - first_sent;
  result.last_to_all = last_done - last_sent;
  result.close_to_all = last_done - first_assigned;
  if (closed) {
    if (last_due > first_assigned) {
      result.last_poll_due = last_due - first_assigned;
    }
    if (last_poll_sent > first_assigned) {
      result.last_poll_sent = last_poll_sent - first_assigned;
    }
  }
  if (result.polls > 0) result.mean_poll_late = poll_late_sum / result.polls;
  result.assigned = static_cast<int>(ranks.size());
  result.error = error;
  if (error.empty() &&
      world_size != options_.nodes * options_.local_world_size) {
    result.error = absl::StrFormat("world size %d, expected %d", world_size,
                                   options_.nodes * options_.local_world_size);
  }
  return result;
}

double SimulatedAgents::HeartbeatThroughput(absl::Duration duration,
                                            int in_flight) {
  using BeatCall = Call<v1::HeartbeatRequest, v1::HeartbeatResponse>;
  std::atomic<int64_t> completed{0};
  std::atomic<int64_t> next_node{0};
  std::atomic<int> running{0};
  absl::Time stop = absl::Now() + duration;
  absl::Mutex mu;
  std::function<void()> send = [&] {
    int node = static_cast<int>(next_node.fetch_add(1) % options_.nodes);
    auto* call = new BeatCall;
    PrepareBeat(node, &call->context, &call->request);
    Stub(node).async()->Heartbeat(&call->context, &call->request,
                                  &call->response,
                                  [&, call](grpc::Status status) {
                                    delete call;
                                    if (status.ok()) completed.fetch_add(1);
                                    if (absl::Now() < stop) {
                                      send();
                                    } else {
                                      absl::MutexLock lock(&mu);
                                      running.fetch_sub(1);
                                    }
                                  });
  };
  absl::Time start = absl::Now();
  running = in_flight;
  for (int i = 0; i < in_flight; ++i) send();
  absl::MutexLock lock(&mu);
  auto drained = [&] { return running.load() == 0; };
  mu.Await(absl::Condition(&drained));
  return static_cast<double>(completed.load()) /
         absl::ToDoubleSeconds(absl::Now() - start);
}

StreamedResult SimulatedAgents::StreamedHeartbeats(
    absl::Duration duration, int streams, int window, int idle_streams,
    int per_message, const std::function<void()>& before,
    const std::function<void()>& after) {
  StreamedResult result;
  std::vector<std::string> ids;
  ids.reserve(options_.nodes);
  for (int i = 0; i < options_.nodes; ++i) ids.push_back(NodeId(i));
  streams = std::max(1, std::min(streams, options_.nodes));
  idle_streams = std::max(0, std::min(idle_streams, options_.nodes));
  StreamsShared idle_shared;
  std::vector<std::unique_ptr<BeatStream>> idle;
  for (int i = 0; i < idle_streams; ++i) {
    idle.push_back(std::make_unique<BeatStream>(
        &idle_shared, &ids, i, options_.nodes, 1, 1, absl::InfiniteFuture()));
    idle.back()->Start(&Stub(i), options_.token, options_.run_id, round_);
  }
  // Every idle stream's beat answered (or failed): the server holds them.
  auto idle_ready = [&] {
    return idle_shared.answered.load() == idle_streams ||
           !idle_shared.error.empty() || idle_shared.running < idle_streams;
  };
  {
    absl::MutexLock lock(&idle_shared.mu);
    idle_shared.mu.AwaitWithTimeout(absl::Condition(&idle_ready),
                                    absl::Seconds(300));
    result.idle_streams = static_cast<int>(idle_shared.answered.load());
    result.error = idle_shared.error;
  }
  StreamsShared shared;
  if (result.error.empty()) {
    std::vector<std::unique_ptr<BeatStream>> active;
    if (before) before();
    const absl::Time start = absl::Now();
    for (int i = 0; i < streams; ++i) {
      active.push_back(std::make_unique<BeatStream>(
          &shared, &ids, i, streams, window, 0, start + duration, per_message));
      active.back()->Start(&Stub(i), options_.token, options_.run_id, round_);
    }
    absl::MutexLock lock(&shared.mu);
    auto ended = [&] { return shared.running == 0; };
    shared.mu.Await(absl::Condition(&ended));
    result.beats = shared.answered.load();
    result.per_second = static_cast<double>(result.beats) /
                        absl::ToDoubleSeconds(absl::Now() - start);
    result.error = shared.error;
  }
  if (after) after();
  for (auto& stream : idle) stream->Cancel();
  absl::MutexLock lock(&idle_shared.mu);
  auto idle_ended = [&] { return idle_shared.running == 0; };
  idle_shared.mu.Await(absl::Condition(&idle_ended));
  return result;
}

void SimulatedAgents::PrepareBeat(int node, grpc::ClientContext* context,
                                  v1::HeartbeatRequest* request) const {
  context->set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  Authorize(context);
  request->set_run_id(options_.run_id);
  request->set_node_id(NodeId(node));
  request->set_round(round_);
}

void SimulatedAgents::Pace(
    absl::Duration duration,
    absl::FunctionRef<void(int node, int64_t tick)> beat) const {
  const absl::Time start = absl::Now();
  for (int64_t tick = 0;; ++tick) {
    const absl::Time when =
        start + interval_ * (static_cast<double>(tick) / options_.nodes);
    if (when - start >= duration) return;
    const absl::Time now = absl::Now();
    if (when > now) absl::SleepFor(when - now);
    beat(static_cast<int>(tick % options_.nodes), tick);
  }
}

absl::Duration SimulatedAgents::figures_interval() const {
  return options_.figures_interval == absl::InfiniteDuration()
             ? assigned_figures_interval_
             : options_.figures_interval;
}

int64_t SimulatedAgents::FiguresEvery() const {
  const absl::Duration every = figures_interval();
  if (every <= absl::ZeroDuration()) return 1;
  return std::max<int64_t>(1, every / interval_);
}

int64_t SimulatedAgents::PacedHeartbeats(absl::Duration duration,
                                         bool figures) {
  using BeatCall = Call<v1::HeartbeatRequest, v1::HeartbeatResponse>;
  absl::Mutex mu;
  int outstanding = 0;
  int64_t answered = 0;
  Pace(duration, [&](int node, int64_t tick) {
    {
      absl::MutexLock lock(&mu);
      ++outstanding;
    }
    auto* call = new BeatCall;
    PrepareBeat(node, &call->context, &call->request);
    const int64_t beat = tick / options_.nodes;
    if (figures && beat % FiguresEvery() == 0) {
      AddFigures(node, options_.local_world_size, beat, &call->request);
    }
    Stub(node).async()->Heartbeat(&call->context, &call->request,
                                  &call->response,
                                  [&, call](grpc::Status status) {
                                    absl::MutexLock lock(&mu);
                                    if (status.ok()) ++answered;
                                    --outstanding;
                                    delete call;
                                  });
  });
  absl::MutexLock lock(&mu);
  auto drained = [&] { return outstanding == 0; };
  mu.Await(absl::Condition(&drained));
  return answered;
}

int64_t SimulatedAgents::PacedStreamHeartbeats(absl::Duration duration,
                                               bool figures) {
  if (paced_ == nullptr) {
    paced_ = std::make_unique<PacedStreams>();
    for (int node = 0; node < options_.nodes; ++node) {
      v1::HeartbeatRequest plain;
      plain.set_run_id(options_.run_id);
      plain.set_node_id(NodeId(node));
      plain.set_round(round_);
      v1::HeartbeatRequest figured = plain;
      AddFigures(node, options_.local_world_size, 0, &figured);
      paced_->streams.push_back(std::make_unique<PacedStream>(
          &paced_->shared, std::move(plain), std::move(figured)));
      paced_->streams.back()->Start(&Stub(node), options_.token);
    }
  }
  const int64_t answered_before = paced_->shared.answered.load();
  int64_t skipped = 0;
  Pace(duration, [&](int node, int64_t tick) {
    const bool with_figures =
        figures && (tick / options_.nodes) % FiguresEvery() == 0;
    if (!paced_->streams[node]->Beat(with_figures)) ++skipped;
  });
  // The last answers: at most one beat a stream is in flight.
  absl::SleepFor(absl::Milliseconds(100));
  {
    absl::MutexLock lock(&paced_->shared.mu);
    if (!paced_->shared.error.empty()) {
      std::fprintf(stderr, "a heartbeat stream failed: %s\n",
                   paced_->shared.error.c_str());
      return 0;
    }
  }
  if (skipped > 0) {
    std::fprintf(stderr, "%lld beats skipped (the last still being written)\n",
                 static_cast<long long>(skipped));
  }
  return paced_->shared.answered.load() - answered_before;
}

DetectionResult SimulatedAgents::DetectLostNode(absl::Duration max_wait) {
  using BeatCall = Call<v1::HeartbeatRequest, v1::HeartbeatResponse>;
  absl::Mutex mu;
  std::vector<absl::Time> told(options_.nodes, absl::InfiniteFuture());
  int outstanding = 0;
  int known_count = 0;
  const absl::Duration interval = interval_;  // as the server said
  // Node 0's last heartbeat: it is silent from when it was answered.
  {
    grpc::ClientContext context;
    v1::HeartbeatRequest request;
    PrepareBeat(0, &context, &request);
    v1::HeartbeatResponse response;
    Stub(0).Heartbeat(&context, request, &response);
  }
  absl::Time silent_since = absl::Now();
  absl::Time start = silent_since;
  DetectionResult result;
  for (int64_t tick = 0;; ++tick) {
    // Node i beats at start + (i / nodes + k) * interval.
    int node = static_cast<int>(tick % options_.nodes);
    absl::Time when =
        start + interval * (static_cast<double>(tick) / options_.nodes);
    if (when - start > max_wait) break;
    {
      absl::MutexLock lock(&mu);
      if (known_count == options_.nodes - 1) break;
    }
    absl::Time now = absl::Now();
    if (when > now) absl::SleepFor(when - now);
    if (node == 0) continue;
    {
      absl::MutexLock lock(&mu);
      if (told[node] != absl::InfiniteFuture()) continue;
      ++outstanding;
    }
    auto* call = new BeatCall;
    PrepareBeat(node, &call->context, &call->request);
    Stub(node).async()->Heartbeat(
        &call->context, &call->request, &call->response,
        [&, call, node](grpc::Status status) {
          absl::MutexLock lock(&mu);
          if (status.ok() && call->response.rejoin() &&
              told[node] == absl::InfiniteFuture()) {
            told[node] = absl::Now();
            ++known_count;
          }
          --outstanding;
          delete call;
        });
  }
  absl::MutexLock lock(&mu);
  auto drained = [&] { return outstanding == 0; };
  mu.Await(absl::Condition(&drained));
  absl::Time first = absl::InfiniteFuture();
  absl::Time last = absl::InfinitePast();
  int known = 0;
  for (int i = 1; i < options_.nodes; ++i) {
    if (told[i] == absl::InfiniteFuture()) continue;
    ++known;
    first = std::min(first, told[i]);
    last = std::max(last, told[i]);
  }
  result.complete = known == options_.nodes - 1 && known > 0;
  if (known > 0) {
    result.first_knows = first - silent_since;
    result.all_know = last - silent_since;
  }
  return result;
}

}  // namespace ddprun::bench
