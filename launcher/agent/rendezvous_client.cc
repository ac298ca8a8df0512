#include "launcher/agent/rendezvous_client.h"

#include <algorithm>
#include <chrono>

#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/grpc_status.h"
#include "launcher/agent/join_retry_policy.h"

namespace ddprun::launcher {

absl::StatusOr<common::ChannelOptions> MakeChannelOptions(
    const common::Credentials& auth) {
  common::ChannelOptions channel;
  static_cast<common::Credentials&>(channel) = auth;
  absl::StatusOr<std::string> token = common::LoadToken(auth.token_file);
  if (!token.ok()) return token.status();
  channel.token = *token;
  return channel;
}

absl::StatusOr<std::unique_ptr<RendezvousClient>> RendezvousClient::Create(
    RendezvousClientOptions options) {
  // Reconnect quickly once the server comes up or a connection drops; the
  // retry pacing of Join itself is JoinRetryPolicy's.
  options.channel.reconnect_backoff_initial_ms = 100;
  options.channel.reconnect_backoff_max_ms = 1000;
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel =
      common::CreateChannel(options.endpoint, options.channel);
  if (!channel.ok()) return channel.status();
  return std::unique_ptr<RendezvousClient>(
      new RendezvousClient(std::move(options), *std::move(channel)));
}

RendezvousClient::RendezvousClient(RendezvousClientOptions options,
                                   std::shared_ptr<grpc::Channel> channel)
    : options_(std::move(options)),
      channel_(std::move(channel)),
      stub_(v1::Rendezvous::NewStub(channel_)) {}

void RendezvousClient::Prepare(grpc::ClientContext& context,
                               absl::Duration timeout) const {
  // The channel attaches the token to every call.
  context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
}

absl::Status RendezvousClient::Explain(const char* call,
                                       const grpc::Status& status) const {
  absl::Status s = common::FromGrpcStatus(status);
  std::string hint;
  switch (status.error_code()) {
    case grpc::StatusCode::UNAVAILABLE:
      hint =
          "check that ddprun-rendezvous runs there, that the address is "
          "reachable from this host, and that TLS matches the server's "
          "(--tls-ca-file; with mutual TLS also --tls-cert-file and "
          "--tls-key-file, a certificate signed by its client CA)";
      break;
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      hint =
          "the server did not answer in time; check the other nodes and "
          "--rdzv-conf join_timeout";
      break;
    case grpc::StatusCode::UNAUTHENTICATED:
      hint = "check --token-file: it must hold the server's token";
      break;
    default:
      hint = "see the rendezvous server's log";
  }
  return absl::Status(
      s.code(), absl::StrFormat("%s to rendezvous %s failed: %s; %s", call,
                                options_.endpoint, s.message(), hint));
}

absl::StatusOr<v1::JoinResponse> RendezvousClient::Join(
    const v1::JoinRequest& request, absl::Duration join_timeout,
    absl::Duration unreachable_timeout) {
  return JoinUnless(request, join_timeout, unreachable_timeout,
                    [] { return false; });
}

absl::StatusOr<v1::JoinResponse> RendezvousClient::JoinUnless(
    const v1::JoinRequest& original, absl::Duration join_timeout,
    absl::Duration unreachable_timeout, absl::FunctionRef<bool()> leave) {
  // A server may answer `waiting` instead of parking this call (a large
  // job): the same Join is sent again after the interval it says.
  v1::JoinRequest request = original;
  request.set_poll(true);
  JoinRetryPolicy retry({.unreachable_timeout = unreachable_timeout},
                        absl::Now());
  const absl::Duration answer_bound =
      JoinRetryPolicy::AnswerBound(join_timeout);
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      join_woken_ = false;  // the check below sees what woke it
    }
    if (leave()) return JoinLeftError();
    // No gRPC deadline on the parked Join: the server would arm a timer for
    // it, and Debian's gRPC (built with its debug checks) walks a list of
    // every armed timer in its bucket on each add and remove, which made
    // 100,000 parked Joins cost O(n^2). The server answers at its own
    // join_timeout; this client gives up a little after it (so that the
    // server's answer, not our timer, says what happened) by cancelling.
    grpc::ClientContext context;
    v1::JoinResponse response;
    grpc::Status status;
    bool done = false;  // guarded by mu_: the callback sets it
    {
      absl::MutexLock lock(&mu_);
      if (join_cancelled_) {
        return absl::CancelledError("Join cancelled: the agent is stopping");
      }
      join_context_ = &context;
    }
    stub_->async()->Join(&context, &request, &response, [&](grpc::Status s) {
      absl::MutexLock lock(&mu_);
      status = std::move(s);
      done = true;
    });
    const absl::Time deadline = absl::Now() + answer_bound;
    bool timed_out = false;
    bool left = false;
    while (true) {
      {
        absl::MutexLock lock(&mu_);
        auto answered_or_woken = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          return done || join_woken_;
        };
        if (!mu_.AwaitWithDeadline(absl::Condition(&answered_or_woken),
                                   deadline)) {
          timed_out = true;
          break;
        }
        if (done) break;
        join_woken_ = false;
      }
      if (leave()) {
        left = true;
        break;
      }
    }
    {
      absl::MutexLock lock(&mu_);
      if (timed_out || left) {
        context.TryCancel();
        auto answered = [&]()
                            ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return done; };
        mu_.Await(absl::Condition(&answered));
      }
      join_context_ = nullptr;
      if (join_cancelled_) {
        return absl::CancelledError("Join cancelled: the agent is stopping");
      }
    }
    // Leaving wins over an answer that came meanwhile: the check said this
    // node has nothing to join for.
    if (left) return JoinLeftError();
    if (timed_out && !status.ok()) {
      status = grpc::Status(
          grpc::StatusCode::DEADLINE_EXCEEDED,
          absl::StrFormat("no answer within join_timeout + 5 s (%s)",
                          absl::FormatDuration(answer_bound)));
    }
    if (status.ok() && !response.has_waiting()) return response;
    const JoinRetryPolicy::Step step =
        status.ok() ? retry.OnWaiting(response.waiting().poll_interval_ms(),
                                      absl::Now())
                    : retry.OnFailed(common::FromGrpcStatus(status).code(),
                                     absl::Now());
    switch (step.action) {
      case JoinRetryPolicy::Action::kReturn:
        return Explain("Join", status);
      case JoinRetryPolicy::Action::kPollAgain: {
        // The round is not decided yet: poll again after the interval, or
        // at once when woken (the loop's start asks the check first, and
        // says CANCELLED when so).
        absl::MutexLock lock(&mu_);
        auto cancelled_or_woken = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          return join_cancelled_ || join_woken_;
        };
        mu_.AwaitWithTimeout(absl::Condition(&cancelled_or_woken), step.wait);
        break;
      }
      case JoinRetryPolicy::Action::kRetry:
        if (step.wait > absl::ZeroDuration()) absl::SleepFor(step.wait);
        break;
    }
  }
}

void RendezvousClient::WakeJoin() {
  absl::MutexLock lock(&mu_);
  join_woken_ = true;
}

void RendezvousClient::CancelJoin() {
  absl::MutexLock lock(&mu_);
  join_cancelled_ = true;
  if (join_context_ != nullptr) join_context_->TryCancel();
}

absl::StatusOr<v1::HeartbeatResponse> RendezvousClient::Heartbeat(
    const v1::HeartbeatRequest& request) {
  grpc::ClientContext context;
  Prepare(context, options_.rpc_timeout);
  v1::HeartbeatResponse response;
  grpc::Status status = stub_->Heartbeat(&context, request, &response);
  if (!status.ok()) return Explain("Heartbeat", status);
  return response;
}

// One Heartbeats stream on gRPC's callback API: one read is always
// outstanding, and Beat writes a heartbeat and waits for the next answer.
// Thread-safe between Beat (one caller at a time) and gRPC's reactions; the
// destructor cancels the stream and waits until gRPC is done with it.
//
// A hold keeps gRPC from ending the call (OnDone, which frees its state)
// while Beat may still start a write: without it a stream that broke
// between Beat's check and its StartWrite wrote into a finished call, and
// the agent crashed in gRPC's interceptors (found by the fault harness:
// a server killed, then paused, with the token interceptor on). The hold
// goes once the stream is broken and no write of Beat's is in flight; mu_
// decides that, and RemoveHold runs without it (it may call OnDone).
class RendezvousClient::Stream final
    : public HeartbeatStream,
      public grpc::ClientBidiReactor<v1::HeartbeatRequest,
                                     v1::HeartbeatResponse> {
 public:
  Stream(const RendezvousClient* client, PushHandler on_push)
      : client_(client), on_push_(std::move(on_push)) {
    // No deadline: the stream lives for the round; each Beat has its own.
    client_->stub_->async()->Heartbeats(&context_, this);
    AddHold();
    StartRead(&incoming_);
    StartCall();
  }

  ~Stream() override {
    // Fails the outstanding read, which releases the hold (OnReadDone).
    context_.TryCancel();
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(&done_));
  }

  absl::StatusOr<v1::HeartbeatResponse> Beat(
      const v1::HeartbeatRequest& request) override {
    int64_t answered = 0;
    {
      absl::MutexLock lock(&mu_);
      if (broken_) {
        // Its hold goes with the last write: OnDone brings the status.
        mu_.AwaitWithTimeout(absl::Condition(&done_),
                             client_->options_.rpc_timeout);
        return Ended();
      }
      if (writing_) {
        return client_->Explain(
            "Heartbeat stream",
            grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                         "the previous heartbeat is still being sent"));
      }
      writing_ = true;
      outgoing_ = request;
      answered = answers_;
    }
    StartWrite(&outgoing_);
    absl::MutexLock lock(&mu_);
    auto answer_or_end = [&] { return answers_ > answered || done_; };
    if (!mu_.AwaitWithTimeout(absl::Condition(&answer_or_end),
                              client_->options_.rpc_timeout)) {
      return client_->Explain(
          "Heartbeat stream",
          grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                       absl::StrFormat("no answer within %s",
                                       absl::FormatDuration(
                                           client_->options_.rpc_timeout))));
    }
    if (answers_ > answered) return last_;
    return Ended();
  }

  void OnWriteDone(bool /*ok*/) override {
    bool release = false;
    {
      absl::MutexLock lock(&mu_);
      writing_ = false;
      release = TakeReleaseLocked();
    }
    if (release) RemoveHold();
  }

  void OnReadDone(bool ok) override {
    if (!ok) {  // the stream is over: OnDone follows once the hold goes
      bool release = false;
      {
        absl::MutexLock lock(&mu_);
        broken_ = true;
        release = TakeReleaseLocked();
      }
      if (release) RemoveHold();
      return;
    }
    if (incoming_.pushed()) {
      // Unasked (the round ended): no answer to a Beat.
      const v1::HeartbeatResponse pushed = incoming_;
      StartRead(&incoming_);
      if (on_push_) on_push_(pushed);
      return;
    }
    {
      absl::MutexLock lock(&mu_);
      last_ = incoming_;
      ++answers_;
    }
    StartRead(&incoming_);
  }

  void OnDone(const grpc::Status& status) override {
    absl::MutexLock lock(&mu_);
    status_ = status;
    done_ = true;
  }

 private:
  // Whether the hold is to be removed now: the stream is broken and no
  // write is in flight (once).
  bool TakeReleaseLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!broken_ || writing_ || released_) return false;
    released_ = true;
    return true;
  }

  absl::Status Ended() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (status_.ok()) {
      return absl::UnavailableError(absl::StrFormat(
          "rendezvous %s closed the heartbeat stream", client_->endpoint()));
    }
    return client_->Explain("Heartbeat stream", status_);
  }

  const RendezvousClient* const client_;
  const PushHandler on_push_;
  grpc::ClientContext context_;
  v1::HeartbeatRequest outgoing_;   // the write in flight (gRPC reads it)
  v1::HeartbeatResponse incoming_;  // the read in flight (gRPC writes it)
  mutable absl::Mutex mu_;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  int64_t answers_ ABSL_GUARDED_BY(mu_) = 0;
  v1::HeartbeatResponse last_ ABSL_GUARDED_BY(mu_);
  bool broken_ ABSL_GUARDED_BY(mu_) = false;    // the read failed
  bool released_ ABSL_GUARDED_BY(mu_) = false;  // the hold was removed
  bool done_ ABSL_GUARDED_BY(mu_) = false;      // OnDone ran
  grpc::Status status_ ABSL_GUARDED_BY(mu_);
};

absl::StatusOr<std::unique_ptr<HeartbeatStream>>
RendezvousClient::OpenHeartbeatStream(PushHandler on_push) {
  return std::make_unique<Stream>(this, std::move(on_push));
}

absl::StatusOr<v1::ReportFailureResponse> RendezvousClient::ReportFailure(
    const v1::ReportFailureRequest& request) {
  grpc::ClientContext context;
  Prepare(context, options_.rpc_timeout);
  v1::ReportFailureResponse response;
  grpc::Status status = stub_->ReportFailure(&context, request, &response);
  if (!status.ok()) return Explain("ReportFailure", status);
  return response;
}

absl::Status RendezvousClient::Leave(const v1::LeaveRequest& request) {
  grpc::ClientContext context;
  Prepare(context, options_.rpc_timeout);
  v1::LeaveResponse response;
  grpc::Status status = stub_->Leave(&context, request, &response);
  if (!status.ok()) return Explain("Leave", status);
  return absl::OkStatus();
}

absl::StatusOr<v1::ResumeResponse> RendezvousClient::Resume(
    const v1::JoinRequest& request) {
  grpc::ClientContext context;
  Prepare(context, options_.rpc_timeout);
  v1::ResumeResponse response;
  grpc::Status status = stub_->Resume(&context, request, &response);
  if (!status.ok()) return Explain("Resume", status);
  return response;
}

absl::StatusOr<v1::StatusResponse> RendezvousClient::Status(
    const v1::StatusRequest& request) {
  grpc::ClientContext context;
  Prepare(context, options_.rpc_timeout);
  v1::StatusResponse response;
  grpc::Status status = stub_->Status(&context, request, &response);
  if (!status.ok()) return Explain("Status", status);
  return response;
}

}  // namespace ddprun::launcher
