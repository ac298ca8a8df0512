#include "worker/store_client.h"

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <utility>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/backoff.h"
#include "common/credentials.h"
#include "common/endpoint.h"
#include "common/grpc_status.h"
#include "ddprun/v1/store.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "worker/collective_abort.h"

namespace ddprun::worker {
namespace {

using ::ddprun::v1::StoreScope;

std::chrono::system_clock::time_point ToChrono(absl::Time t) {
  return absl::ToChronoTime(t);
}

int64_t ToMillis(absl::Duration d) { return absl::ToInt64Milliseconds(d); }

// UNAVAILABLE is retried soon and often: a worker forming its group waits
// on these calls, and the server is back within a second of a restart.
common::BackoffOptions RetryPacing() {
  common::BackoffOptions pacing;
  pacing.initial = absl::Milliseconds(20);
  pacing.max = absl::Milliseconds(250);
  return pacing;
}

}  // namespace

class StoreClient::Impl {
 public:
  using Connect =
      std::function<absl::StatusOr<std::shared_ptr<grpc::Channel>>()>;

  Impl(const StoreClientOptions& options,
       std::shared_ptr<grpc::Channel> channel, Connect connect)
      : options_(options),
        connect_(std::move(connect)),
        stub_(ddprun::v1::Store::NewStub(std::move(channel))) {
    scope_.set_run_id(options.run_id);
    scope_.set_round(options.round);
  }

  const StoreScope& scope() const { return scope_; }
  // A snapshot: Reconnect may replace the stub while a call runs.
  std::shared_ptr<ddprun::v1::Store::Stub> stub() {
    absl::MutexLock lock(&mu_);
    return stub_;
  }

  // Runs `rpc(context)` with a deadline of `budget` from now; retries
  // UNAVAILABLE with backoff for up to options.retry_unavailable_for. The
  // result's message says what failed and where.
  template <typename Rpc>
  absl::Status Call(absl::string_view op, absl::string_view what,
                    absl::Duration budget, Rpc rpc) {
    common::Backoff backoff(RetryPacing());
    absl::Time give_up = absl::Now() + options_.retry_unavailable_for;
    while (true) {
      grpc::ClientContext context;
      context.set_deadline(ToChrono(absl::Now() + budget));
      // A call of a round that is over ends when the agent announces the
      // next: the server's answer to a parked Get ("round over") is lost
      // where the connection broke meanwhile (a partition that outlived
      // the server's keepalive), and the call would wait out its deadline
      // (the group's timeout, minutes) with the next round unread. The
      // soak saw workers wait a minute so in the node layouts' Get.
      std::optional<OnCollectiveAbort> end_with_round;
      if (options_.end_with_round) {
        end_with_round.emplace([&context] { context.TryCancel(); });
      }
      auto round_ended = [&] {
        return options_.end_with_round && CollectiveAbortRequested();
      };
      if (round_ended()) return RoundEnded(op, what);
      grpc::Status status = rpc(&context);
      if (status.ok()) return absl::OkStatus();
      if (round_ended()) return RoundEnded(op, what);
      if (status.error_code() == grpc::StatusCode::UNAVAILABLE) {
        absl::Duration delay = backoff.Next();
        if (absl::Now() + delay < give_up) {
          absl::SleepFor(delay);
          Reconnect();
          continue;
        }
      }
      absl::Status s = common::FromGrpcStatus(status);
      return absl::Status(
          s.code(),
          absl::StrFormat(
              "store %s of %s at %s (run '%s', round %d) failed: %s%s", op,
              what, options_.endpoint, options_.run_id, options_.round,
              s.message(), Advice(s.code())));
    }
  }

 private:
  absl::Status RoundEnded(absl::string_view op, absl::string_view what) const {
    return absl::AbortedError(absl::StrFormat(
        "store %s of %s at %s (run '%s', round %d) given up: the round ended "
        "(the agent announced the next one)",
        op, what, options_.endpoint, options_.run_id, options_.round));
  }

  static const char* Advice(absl::StatusCode code) {
    switch (code) {
      case absl::StatusCode::kUnavailable:
        return "; is the rendezvous server (DDPRUN_STORE_ENDPOINT) up and "
               "reachable from this host?";
      case absl::StatusCode::kDeadlineExceeded:
        return "; a peer that should have written it may have died or not "
               "started";
      case absl::StatusCode::kFailedPrecondition:
        return "; this worker belongs to a round that is over and should "
               "exit";
      case absl::StatusCode::kUnauthenticated:
        return "; check DDPRUN_TOKEN_FILE / DDPRUN_TOKEN";
      default:
        return "";
    }
  }

  // A fresh channel for the next attempt. gRPC 1.51's channel, once a
  // connect failed while the server was down (a rendezvous restart),
  // answered every call with that failure for seconds after the server was
  // back, whatever its reconnect settings; a worker forming its group waited
  // out all of it. A new channel with its own subchannel connects at once.
  void Reconnect() {
    absl::StatusOr<std::shared_ptr<grpc::Channel>> channel = connect_();
    if (!channel.ok()) return;  // the next attempt reports the old error
    absl::MutexLock lock(&mu_);
    stub_ = ddprun::v1::Store::NewStub(*std::move(channel));
  }

  StoreClientOptions options_;
  StoreScope scope_;
  const Connect connect_;
  absl::Mutex mu_;
  std::shared_ptr<ddprun::v1::Store::Stub> stub_ ABSL_GUARDED_BY(mu_);
};

absl::StatusOr<std::unique_ptr<StoreClient>> StoreClient::Create(
    const StoreClientOptions& options) {
  absl::StatusOr<common::Endpoint> endpoint =
      common::ParseEndpoint(options.endpoint);
  if (!endpoint.ok()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("store endpoint: %s", endpoint.status().message()));
  }
  // The shared channel helper attaches the token to every call; TLS is on
  // when tls_ca_file is set (the agent passes its own --tls-* settings).
  common::ChannelOptions channel_options;
  static_cast<common::Credentials&>(channel_options) = options.credentials;
  // Each channel connects on its own (Impl::Reconnect says why).
  channel_options.private_subchannels = true;
  std::string target = endpoint->ToString();
  auto connect = [target, channel_options]() {
    return common::CreateChannel(target, channel_options);
  };
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel = connect();
  if (!channel.ok()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("store channel to %s: %s", options.endpoint,
                        channel.status().message()));
  }
  return std::unique_ptr<StoreClient>(new StoreClient(
      options, std::make_unique<Impl>(options, std::move(*channel),
                                      std::move(connect))));
}

StoreClient::StoreClient(StoreClientOptions options, std::unique_ptr<Impl> impl)
    : options_(std::move(options)), impl_(std::move(impl)) {}

StoreClient::~StoreClient() = default;

static std::string KeyName(const std::string& key) {
  return absl::StrFormat("key '%s'", key);
}

static std::string KeysName(const std::vector<std::string>& keys) {
  return absl::StrFormat("keys [%s]", absl::StrJoin(keys, ", "));
}

absl::Status StoreClient::Set(const std::string& key,
                              const std::string& value) {
  ddprun::v1::SetRequest request;
  *request.mutable_scope() = impl_->scope();
  request.set_key(key);
  request.set_value(value);
  ddprun::v1::SetResponse response;
  return impl_->Call("Set", KeyName(key), options_.call_timeout,
                     [&](grpc::ClientContext* c) {
                       return impl_->stub()->Set(c, request, &response);
                     });
}

absl::StatusOr<std::string> StoreClient::Get(const std::string& key,
                                             absl::Duration timeout) {
  bool forever = timeout == absl::InfiniteDuration();
  ddprun::v1::GetRequest request;
  *request.mutable_scope() = impl_->scope();
  request.set_key(key);
  absl::Duration chunk = forever ? options_.forever_chunk : timeout;
  request.set_timeout_ms(std::max<int64_t>(1, ToMillis(chunk)));
  ddprun::v1::GetResponse response;
  while (true) {
    absl::Status status =
        impl_->Call("Get", KeyName(key), chunk + options_.deadline_slack,
                    [&](grpc::ClientContext* c) {
                      return impl_->stub()->Get(c, request, &response);
                    });
    if (forever && absl::IsDeadlineExceeded(status)) continue;
    if (!status.ok()) return status;
    return std::move(*response.mutable_value());
  }
}

absl::StatusOr<int64_t> StoreClient::Add(const std::string& key,
                                         int64_t delta) {
  ddprun::v1::AddRequest request;
  *request.mutable_scope() = impl_->scope();
  request.set_key(key);
  request.set_delta(delta);
  ddprun::v1::AddResponse response;
  absl::Status status = impl_->Call(
      "Add", KeyName(key), options_.call_timeout, [&](grpc::ClientContext* c) {
        return impl_->stub()->Add(c, request, &response);
      });
  if (!status.ok()) return status;
  return response.value();
}

absl::StatusOr<std::string> StoreClient::CompareSet(
    const std::string& key, const std::string& expected,
    const std::string& desired) {
  ddprun::v1::CompareSetRequest request;
  *request.mutable_scope() = impl_->scope();
  request.set_key(key);
  request.set_expected(expected);
  request.set_desired(desired);
  ddprun::v1::CompareSetResponse response;
  absl::Status status =
      impl_->Call("CompareSet", KeyName(key), options_.call_timeout,
                  [&](grpc::ClientContext* c) {
                    return impl_->stub()->CompareSet(c, request, &response);
                  });
  if (!status.ok()) return status;
  return std::move(*response.mutable_value());
}

absl::StatusOr<bool> StoreClient::Check(const std::vector<std::string>& keys) {
  ddprun::v1::CheckRequest request;
  *request.mutable_scope() = impl_->scope();
  for (const auto& key : keys) request.add_keys(key);
  ddprun::v1::CheckResponse response;
  absl::Status status =
      impl_->Call("Check", KeysName(keys), options_.call_timeout,
                  [&](grpc::ClientContext* c) {
                    return impl_->stub()->Check(c, request, &response);
                  });
  if (!status.ok()) return status;
  return response.ready();
}

absl::Status StoreClient::Wait(const std::vector<std::string>& keys,
                               absl::Duration timeout) {
  bool forever = timeout == absl::InfiniteDuration();
  ddprun::v1::WaitRequest request;
  *request.mutable_scope() = impl_->scope();
  for (const auto& key : keys) request.add_keys(key);
  absl::Duration chunk = forever ? options_.forever_chunk : timeout;
  request.set_timeout_ms(std::max<int64_t>(1, ToMillis(chunk)));
  ddprun::v1::WaitResponse response;
  while (true) {
    absl::Status status =
        impl_->Call("Wait", KeysName(keys), chunk + options_.deadline_slack,
                    [&](grpc::ClientContext* c) {
                      return impl_->stub()->Wait(c, request, &response);
                    });
    if (forever && absl::IsDeadlineExceeded(status)) continue;
    return status;
  }
}

absl::StatusOr<bool> StoreClient::DeleteKey(const std::string& key) {
  ddprun::v1::DeleteKeyRequest request;
  *request.mutable_scope() = impl_->scope();
  request.set_key(key);
  ddprun::v1::DeleteKeyResponse response;
  absl::Status status =
      impl_->Call("DeleteKey", KeyName(key), options_.call_timeout,
                  [&](grpc::ClientContext* c) {
                    return impl_->stub()->DeleteKey(c, request, &response);
                  });
  if (!status.ok()) return status;
  return response.deleted();
}

absl::StatusOr<int64_t> StoreClient::NumKeys() {
  ddprun::v1::NumKeysRequest request;
  *request.mutable_scope() = impl_->scope();
  ddprun::v1::NumKeysResponse response;
  absl::Status status =
      impl_->Call("NumKeys", "the scope", options_.call_timeout,
                  [&](grpc::ClientContext* c) {
                    return impl_->stub()->NumKeys(c, request, &response);
                  });
  if (!status.ok()) return status;
  return response.num_keys();
}

}  // namespace ddprun::worker
