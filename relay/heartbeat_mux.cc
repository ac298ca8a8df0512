#include "relay/heartbeat_mux.h"

#include <algorithm>

#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "spdlog/spdlog.h"

namespace ddprun::relay {

// One upstream Heartbeats stream. Deletes itself when it ends.
//
// Lifetime: a hold (AddHold) keeps gRPC from ending the stream (OnDone)
// while the mux may still write on it. The mux releases it once, when it
// retires the stream (broken, idle or shutting down) and no write of its
// is scheduled or in flight (mu_ decides; RemoveHold runs without it).
class HeartbeatMux::Upstream
    : public grpc::ClientBidiReactor<v1::HeartbeatRequest,
                                     v1::HeartbeatResponse> {
 public:
  Upstream(HeartbeatMux* mux, std::string key,
           const ForwardedMetadata& metadata)
      : mux_(mux),
        key_(std::move(key)),
        context_(std::make_shared<grpc::ClientContext>()) {
    // No deadline: the stream lives as long as beats flow.
    AttachMetadata(metadata, context_.get());
  }

  void Open(v1::Rendezvous::Stub* stub) {
    stub->async()->Heartbeats(context_.get(), this);
    AddHold();
    StartRead(&response_);
    StartCall();
  }
  void Write(v1::HeartbeatRequest request) {
    request_ = std::move(request);
    StartWrite(&request_);
  }
  void Close() { StartWritesDone(); }
  void Release() { RemoveHold(); }

  const std::string& key() const { return key_; }
  const std::shared_ptr<grpc::ClientContext>& context() const {
    return context_;
  }

  void OnWriteDone(bool ok) override { mux_->OnWritten(this, ok); }
  void OnReadDone(bool ok) override {
    if (!ok) {  // the stream is over
      mux_->OnBroken(this);
      return;
    }
    mux_->OnAnswer(this, response_);
    StartRead(&response_);
  }
  void OnDone(const grpc::Status& status) override {
    mux_->OnEnded(this, status);
    delete this;
  }

  // Guarded by the mux's mu_.
  bool writing = false;   // a write scheduled or in flight
  bool retired = false;   // no longer the group's stream
  bool released = false;  // its hold was (or is being) removed
  // The callers whose beats it carried when it broke.
  std::vector<std::shared_ptr<BeatSink>> failed;

 private:
  HeartbeatMux* const mux_;
  const std::string key_;
  // Shared, so that Shutdown may cancel a stream that is ending.
  const std::shared_ptr<grpc::ClientContext> context_;
  v1::HeartbeatRequest request_;
  v1::HeartbeatResponse response_;
};

HeartbeatMux::HeartbeatMux(const RelayOptions& options,
                           v1::Rendezvous::Stub* stub, RelayCounters* counters)
    : options_(options), stub_(stub), counters_(counters) {
  flusher_ = std::thread([this] { FlushLoop(); });
}

HeartbeatMux::~HeartbeatMux() { Shutdown(); }

void HeartbeatMux::Beat(const ForwardedMetadata& metadata,
                        std::shared_ptr<BeatSink> sink,
                        v1::HeartbeatRequest request) {
  std::string key = GroupKey(request.run_id(), metadata);
  Actions actions;
  {
    absl::MutexLock lock(&mu_);
    if (!stopping_) {
      absl::Time now = absl::Now();
      auto [it, created] = groups_.try_emplace(key);
      Group& group = it->second;
      if (created) {
        group.run_id = request.run_id();
        group.metadata = metadata;
        group.max_nodes = options_.max_batch;
        group.backoff = common::Backoff(common::BackoffOptions{
            .initial = absl::Milliseconds(100), .max = absl::Seconds(2)});
      }
      if (group.pending.empty()) {
        group.first_pending = now;
        changed_.Signal();
      }
      Entry entry{std::move(sink), std::move(request)};
      group.pending_nodes += entry.nodes();
      group.pending.push_back(std::move(entry));
      group.last_activity = now;
      Pump(key, group, now, /*force=*/false, &actions);
      sink = nullptr;
    }
  }
  if (sink != nullptr) {
    sink->OnError(grpc::Status(grpc::StatusCode::UNAVAILABLE,
                               "ddprun-relay is shutting down"));
    return;
  }
  Run(std::move(actions));
}

void HeartbeatMux::Pump(const std::string& key, Group& group, absl::Time now,
                        bool force, Actions* actions) {
  if (stopping_ || group.pending.empty()) return;
  bool due = force || group.pending_nodes >= group.max_nodes ||
             now >= group.first_pending + options_.batch_window;
  if (!due) return;
  if (!group.unary && group.stream == nullptr) {
    if (now < group.reopen_at) return;  // the flusher opens it then
    group.stream = new Upstream(this, key, group.metadata);
    ++open_streams_;
    actions->opens.push_back(group.stream);
  }
  if (!group.unary && group.stream->writing) return;  // OnWritten pumps
  v1::HeartbeatRequest message;
  message.set_run_id(group.run_id);
  std::vector<Entry> sent;
  int nodes = 0;
  while (!group.pending.empty() &&
         (sent.empty() ||
          nodes + group.pending.front().nodes() <= group.max_nodes)) {
    Entry entry = std::move(group.pending.front());
    group.pending.pop_front();
    const v1::HeartbeatRequest& beat = entry.request;
    // Each node's rank figures, steps and sync go with its beat (the server
    // names stragglers from them, and answers the round's most of each).
    if (sent.empty()) {
      message.set_node_id(beat.node_id());
      message.set_round(beat.round());
      *message.mutable_ranks() = beat.ranks();
      message.set_steps(beat.steps());
      message.set_steps_age_ms(beat.steps_age_ms());
      message.set_sync(beat.sync());
      message.set_sync_age_ms(beat.sync_age_ms());
    } else {
      v1::NodeBeat* more = message.add_more();
      more->set_node_id(beat.node_id());
      more->set_round(beat.round());
      *more->mutable_ranks() = beat.ranks();
      more->set_steps(beat.steps());
      more->set_steps_age_ms(beat.steps_age_ms());
      more->set_sync(beat.sync());
      more->set_sync_age_ms(beat.sync_age_ms());
    }
    for (const v1::NodeBeat& more : beat.more()) *message.add_more() = more;
    nodes += entry.nodes();
    sent.push_back(std::move(entry));
  }
  group.pending_nodes -= nodes;
  group.first_pending = now;
  counters_->upstream_beat_messages.Increment();
  if (group.unary) {
    // Several may be in flight; each answer says which callers it is for.
    auto beat = std::make_unique<UnaryBeat>();
    beat->metadata = group.metadata;
    beat->request = std::move(message);
    beat->sent = std::move(sent);
    unary_in_flight_.insert(beat->context);
    ++group.unary_calls;
    actions->unary.emplace_back(key, beat.release());
    if (!group.pending.empty()) Pump(key, group, now, force, actions);
    return;
  }
  group.stream->writing = true;
  group.in_flight.push_back(std::move(sent));
  actions->writes.emplace_back(group.stream, std::move(message));
}

void HeartbeatMux::Run(Actions actions) {
  for (Upstream* stream : actions.opens) stream->Open(stub_);
  for (auto& [stream, message] : actions.writes) {
    stream->Write(std::move(message));
  }
  for (Upstream* stream : actions.closes) {
    stream->Close();
    stream->Release();
  }
  for (Upstream* stream : actions.releases) stream->Release();
  for (auto& [key, beat] : actions.unary) SendUnary(key, beat);
}

void HeartbeatMux::FlushLoop() {
  while (true) {
    Actions actions;
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) return;
      absl::Time now = absl::Now();
      absl::Time next = now + absl::Seconds(1);  // idle checks
      for (auto it = groups_.begin(); it != groups_.end();) {
        Group& group = it->second;
        Pump(it->first, group, now, /*force=*/false, &actions);
        if (!group.pending.empty()) {
          absl::Time at = group.first_pending + options_.batch_window;
          if (group.stream == nullptr) at = std::max(at, group.reopen_at);
          next = std::min(next, std::max(at, now + absl::Microseconds(100)));
        }
        bool idle = group.pending.empty() && group.in_flight.empty() &&
                    group.unary_calls == 0 &&
                    (group.stream == nullptr || !group.stream->writing) &&
                    now >= group.last_activity + kIdleClose;
        if (idle && group.stream != nullptr) {
          group.stream->retired = true;
          group.stream->released = true;
          actions.closes.push_back(group.stream);
          group.stream = nullptr;
        }
        if (idle && group.stream == nullptr) {
          it = groups_.erase(it);
        } else {
          ++it;
        }
      }
      if (actions.opens.empty() && actions.writes.empty() &&
          actions.closes.empty()) {
        changed_.WaitWithDeadline(&mu_, next);
      }
    }
    Run(std::move(actions));
  }
}

void HeartbeatMux::OnWritten(Upstream* stream, bool ok) {
  Actions actions;
  {
    absl::MutexLock lock(&mu_);
    stream->writing = false;
    if (stream->retired) {
      ReleaseIfIdle(stream, &actions);
    } else if (ok) {
      auto it = groups_.find(stream->key());
      if (it != groups_.end()) {
        Pump(it->first, it->second, absl::Now(), /*force=*/false, &actions);
      }
    }
    // Not ok: the stream broke; OnBroken follows (its read fails).
  }
  Run(std::move(actions));
}

void HeartbeatMux::ReleaseIfIdle(Upstream* stream, Actions* actions) {
  if (stream->writing || stream->released) return;
  stream->released = true;
  actions->releases.push_back(stream);
}

void HeartbeatMux::OnAnswer(Upstream* stream,
                            const v1::HeartbeatResponse& response) {
  Answers answers;
  Actions actions;
  {
    absl::MutexLock lock(&mu_);
    auto it = groups_.find(stream->key());
    if (it == groups_.end() || it->second.stream != stream ||
        it->second.in_flight.empty()) {
      return;
    }
    std::vector<Entry> sent = std::move(it->second.in_flight.front());
    it->second.in_flight.pop_front();
    Split(it->first, it->second, std::move(sent), response, &answers, &actions);
  }
  for (auto& [sink, answer] : answers) sink->OnAnswer(answer);
  Run(std::move(actions));
}

void HeartbeatMux::Split(const std::string& key, Group& group,
                         std::vector<Entry> sent,
                         const v1::HeartbeatResponse& response,
                         Answers* answers, Actions* actions) {
  group.backoff.Reset();
  group.reopen_at = absl::InfinitePast();
  // Answer i of the message: response for 0, response.more[i - 1] after.
  v1::HeartbeatResponse own = response;
  own.clear_more();
  int available = 1 + response.more_size();
  int next = 0;
  size_t e = 0;
  if (sent.size() == 1) {
    // One caller's message, sent as it came: its answer as the server gave
    // it (a server older than `more` answers its first node only, as it
    // would have answered the caller directly).
    answers->emplace_back(sent[0].sink, response);
    e = 1;
  }
  for (; e < sent.size(); ++e) {
    if (next + sent[e].nodes() > available) break;
    v1::HeartbeatResponse answer = next == 0 ? own : response.more(next - 1);
    for (int i = 1; i < sent[e].nodes(); ++i) {
      *answer.add_more() = response.more(next + i - 1);
    }
    next += sent[e].nodes();
    answers->emplace_back(sent[e].sink, std::move(answer));
  }
  if (e < sent.size()) {
    // A server older than batched heartbeats answered the first node
    // only: send the rest, and from now on, one caller per message.
    spdlog::warn(
        "ddprun-relay: {} answers heartbeats without `more`; beating nodes "
        "of job '{}' one per message",
        options_.upstream, group.run_id);
    group.max_nodes = 1;
    for (size_t r = sent.size(); r-- > e;) {
      group.pending_nodes += sent[r].nodes();
      group.pending.push_front(std::move(sent[r]));
    }
    Pump(key, group, absl::Now(), /*force=*/true, actions);
  }
}

void HeartbeatMux::SendUnary(const std::string& key, UnaryBeat* beat) {
  AttachMetadata(beat->metadata, beat->context.get());
  beat->context->set_deadline(
      absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
  stub_->async()->Heartbeat(
      beat->context.get(), &beat->request, &beat->response,
      [this, key, beat](grpc::Status status) {
        std::unique_ptr<UnaryBeat> done(beat);
        Answers answers;
        Actions actions;
        std::vector<std::shared_ptr<BeatSink>> failed;
        {
          absl::MutexLock lock(&mu_);
          unary_in_flight_.erase(done->context);
          changed_.SignalAll();
          auto it = groups_.find(key);  // kept while unary_calls > 0
          if (it != groups_.end()) --it->second.unary_calls;
          if (!status.ok() || it == groups_.end()) {
            for (Entry& entry : done->sent) failed.push_back(entry.sink);
          } else {
            Split(key, it->second, std::move(done->sent), done->response,
                  &answers, &actions);
          }
        }
        for (auto& [sink, answer] : answers) sink->OnAnswer(answer);
        grpc::Status answer = FromUpstream(status, options_.upstream);
        for (auto& sink : failed) sink->OnError(answer);
        Run(std::move(actions));
      });
}

void HeartbeatMux::OnBroken(Upstream* stream) {
  Actions actions;
  {
    absl::MutexLock lock(&mu_);
    auto it = groups_.find(stream->key());
    if (it != groups_.end() && it->second.stream == stream) {
      // Its beats get the stream's status, which comes with OnDone.
      Group& group = it->second;
      group.stream = nullptr;
      for (auto& message : group.in_flight) {
        for (Entry& entry : message) {
          stream->failed.push_back(std::move(entry.sink));
        }
      }
      for (Entry& entry : group.pending) {
        stream->failed.push_back(std::move(entry.sink));
      }
      group.in_flight.clear();
      group.pending.clear();
      group.pending_nodes = 0;
      group.reopen_at = absl::Now() + group.backoff.Next();
    }
    stream->retired = true;
    ReleaseIfIdle(stream, &actions);
  }
  Run(std::move(actions));
}

void HeartbeatMux::OnEnded(Upstream* stream, const grpc::Status& status) {
  std::vector<std::shared_ptr<BeatSink>> failed;
  grpc::Status answer = FromUpstream(status, options_.upstream);
  {
    absl::MutexLock lock(&mu_);
    failed = std::move(stream->failed);
    --open_streams_;
    changed_.SignalAll();
    if (status.error_code() == grpc::StatusCode::UNIMPLEMENTED) {
      // A server older than the Heartbeats stream: unary heartbeats (with
      // `more`) from now on. The beats that were on the stream are lost;
      // their callers beat again.
      auto it = groups_.find(stream->key());
      if (it != groups_.end()) {
        it->second.unary = true;
        it->second.reopen_at = absl::InfinitePast();
      }
      answer = grpc::Status(
          grpc::StatusCode::UNAVAILABLE,
          absl::StrFormat("ddprun-relay: the rendezvous server at %s has no "
                          "Heartbeats stream; the relay beats unary from now "
                          "on: beat again",
                          options_.upstream));
    }
  }
  if (failed.empty()) return;
  if (answer.ok()) {
    answer = grpc::Status(grpc::StatusCode::UNAVAILABLE,
                          "ddprun-relay: the rendezvous server at " +
                              options_.upstream +
                              " ended the heartbeat stream; beat again");
  }
  spdlog::info(
      "ddprun-relay: heartbeat stream to {} ended: {} ({} beats "
      "failed)",
      options_.upstream, status.error_message(), failed.size());
  // One error per caller, even if it had several beats waiting.
  std::sort(failed.begin(), failed.end());
  failed.erase(std::unique(failed.begin(), failed.end()), failed.end());
  for (auto& sink : failed) sink->OnError(answer);
}

void HeartbeatMux::Shutdown() {
  std::vector<std::shared_ptr<BeatSink>> failed;
  std::vector<std::shared_ptr<grpc::ClientContext>> streams;
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
    stopping_ = true;
    changed_.SignalAll();
    for (auto& [key, group] : groups_) {
      for (Entry& entry : group.pending) failed.push_back(entry.sink);
      group.pending.clear();
      // Cancelled below: their reads fail, OnBroken releases them.
      if (group.stream != nullptr) streams.push_back(group.stream->context());
    }
    for (const auto& context : unary_in_flight_) streams.push_back(context);
  }
  if (flusher_.joinable()) flusher_.join();
  for (auto& sink : failed) {
    sink->OnError(grpc::Status(grpc::StatusCode::UNAVAILABLE,
                               "ddprun-relay is shutting down"));
  }
  // Outside mu_: a cancelled stream's OnDone may run inline and take it.
  for (auto& context : streams) context->TryCancel();
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(this, &HeartbeatMux::AllCallsEnded));
}

}  // namespace ddprun::relay
