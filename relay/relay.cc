#include "relay/relay.h"

#include "absl/strings/str_format.h"
#include "common/endpoint.h"
#include "grpcpp/generic/async_generic_service.h"
#include "grpcpp/server_builder.h"
#include "relay/beat_call.h"
#include "relay/join_call.h"
#include "relay/passthrough_call.h"
#include "spdlog/spdlog.h"

namespace ddprun::relay {
namespace {

constexpr char kJoin[] = "/ddprun.v1.Rendezvous/Join";
constexpr char kHeartbeat[] = "/ddprun.v1.Rendezvous/Heartbeat";
constexpr char kHeartbeats[] = "/ddprun.v1.Rendezvous/Heartbeats";
// The largest message either way: the server enforces its own (smaller)
// limits; this only bounds what a stranger can make the relay buffer.
constexpr int kMaxMessageBytes = 64 << 20;

}  // namespace

// Every method lands here (the relay registers no typed service).
class Relay::Service : public grpc::CallbackGenericService {
 public:
  explicit Service(Relay* relay) : relay_(relay) {}

  grpc::ServerGenericBidiReactor* CreateReactor(
      grpc::GenericCallbackServerContext* context) override {
    const std::string& method = context->method();
    Relay& r = *relay_;
    if (method == kJoin) {
      return StartJoinCall(context, r.batcher_.get(), r.generic_.get(),
                           r.options_.upstream, &r.counters_);
    }
    if (method == kHeartbeat || method == kHeartbeats) {
      return StartBeatCall(context, r.beats_.get(), method == kHeartbeats,
                           &r.counters_);
    }
    return StartPassthrough(context, r.generic_.get(), r.options_.upstream,
                            &r.counters_);
  }

 private:
  Relay* const relay_;
};

Relay::Relay(const RelayOptions& options)
    : options_(options), counters_(registry_) {}

absl::StatusOr<std::unique_ptr<Relay>> Relay::Start(
    const RelayOptions& options) {
  if (options.port < 0 || options.port > 65535) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "bad port %d: give 1-65535, or 0 to let the kernel pick one",
        options.port));
  }
  if (options.max_batch < 1 || options.max_batch > 1024) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--max-batch %d: give 1-1024 (the server takes at most 1,024 nodes "
        "per message)",
        options.max_batch));
  }
  if (options.batch_window < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        "--batch-window-ms is negative: give 0 or more milliseconds");
  }
  absl::StatusOr<common::Endpoint> upstream =
      common::ParseEndpoint(options.upstream);
  if (!upstream.ok()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--upstream '%s': %s; give the rendezvous server's HOST:PORT",
        options.upstream, upstream.status().message()));
  }
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> credentials =
      common::CreateServerCredentials(options.tls);
  if (!credentials.ok()) return credentials.status();
  common::ChannelOptions channel_options = options.upstream_channel;
  channel_options.token.clear();  // callers' tokens travel, never the relay's
  // Find a server that (re)starts soon after it went away.
  if (channel_options.reconnect_backoff_initial_ms == 0) {
    channel_options.reconnect_backoff_initial_ms = 100;
  }
  if (channel_options.reconnect_backoff_max_ms == 0) {
    channel_options.reconnect_backoff_max_ms = 2000;
  }
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel =
      common::CreateChannel(upstream->ToString(), channel_options);
  if (!channel.ok()) return channel.status();

  std::unique_ptr<Relay> relay(new Relay(options));
  relay->channel_ = *std::move(channel);
  relay->stub_ = v1::Rendezvous::NewStub(relay->channel_);
  relay->generic_ = std::make_unique<grpc::GenericStub>(relay->channel_);
  relay->batcher_ = std::make_unique<JoinBatcher>(options, relay->stub_.get(),
                                                  &relay->counters_);
  relay->beats_ = std::make_unique<HeartbeatMux>(options, relay->stub_.get(),
                                                 &relay->counters_);
  relay->service_ = std::make_unique<Service>(relay.get());

  grpc::ServerBuilder builder;
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  // As the server: find agents whose host died while their Join is parked.
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, 10000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 5000);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  // Agents ping every 2 s while a call is in flight (as the server allows).
  builder.AddChannelArgument(
      GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 1000);
  builder.SetMaxReceiveMessageSize(kMaxMessageBytes);
  builder.SetMaxSendMessageSize(kMaxMessageBytes);
  std::string address = common::Endpoint{options.host, options.port}.ToString();
  builder.AddListeningPort(address, *credentials, &relay->port_);
  builder.RegisterCallbackGenericService(relay->service_.get());
  relay->server_ = builder.BuildAndStart();
  if (relay->server_ == nullptr || relay->port_ == 0) {
    relay->server_.reset();
    return absl::UnavailableError(absl::StrFormat(
        "cannot listen on %s: the address is in use or not local; pick "
        "another --host/--port (port 0 lets the kernel pick)",
        address));
  }
  spdlog::info(
      "ddprun-relay listening on {} ({}), upstream {}", relay->endpoint(),
      options.tls.cert_file.empty()
          ? "plaintext"
          : (options.tls.client_ca_file.empty() ? "TLS" : "mutual TLS"),
      options.upstream);
  return relay;
}

Relay::~Relay() { Shutdown(); }

std::string Relay::endpoint() const {
  std::string host = options_.host;
  if (host == "0.0.0.0" || host.empty()) host = "127.0.0.1";
  if (host == "::" || host == "[::]") host = "::1";
  return common::Endpoint{host, port_}.ToString();
}

void Relay::Shutdown() {
  if (shut_down_) return;
  shut_down_ = true;
  // Callers first (their calls are cancelled; parked ones end), then what
  // still waits upstream.
  if (server_ != nullptr) {
    server_->Shutdown(std::chrono::system_clock::now() +
                      std::chrono::seconds(1));
  }
  if (batcher_ != nullptr) batcher_->Shutdown();
  if (beats_ != nullptr) beats_->Shutdown();
  if (server_ != nullptr) server_->Wait();
}

}  // namespace ddprun::relay
