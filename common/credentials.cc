#include "common/credentials.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/worker_env.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/support/client_interceptor.h"
#include "grpcpp/support/interceptor.h"

namespace ddprun::common {
namespace {

std::string Bearer(const std::string& token) {
  return absl::StrCat("Bearer ", token);
}

// Adds the token to the initial metadata of every call on a channel.
class TokenInterceptor final : public grpc::experimental::Interceptor {
 public:
  explicit TokenInterceptor(const std::string* value) : value_(value) {}
  void Intercept(
      grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::
                PRE_SEND_INITIAL_METADATA)) {
      methods->GetSendInitialMetadata()->emplace(kAuthorizationKey, *value_);
    }
    methods->Proceed();
  }

 private:
  const std::string* value_;
};

class TokenInterceptorFactory final
    : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  explicit TokenInterceptorFactory(const std::string& token)
      : value_(Bearer(token)) {}
  grpc::experimental::Interceptor* CreateClientInterceptor(
      grpc::experimental::ClientRpcInfo* /*info*/) override {
    return new TokenInterceptor(&value_);
  }

 private:
  const std::string value_;  // the channel keeps the factory alive
};

// The channel arguments `options` give for the connection itself (pacing,
// connect bound, keepalive, subchannel pool); not TLS's or the token's.
grpc::ChannelArguments ConnectionArguments(const ChannelOptions& options) {
  grpc::ChannelArguments args;
  if (options.reconnect_backoff_initial_ms > 0) {
    // Not GRPC_ARG_MIN_RECONNECT_BACKOFF_MS: gRPC takes that as the shortest
    // connect deadline (connect_timeout_ms below), and at tens of
    // milliseconds a connect on a loaded host is cut off ("tcp handshaker
    // shutdown") again and again.
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS,
                options.reconnect_backoff_initial_ms);
  }
  if (options.reconnect_backoff_max_ms > 0) {
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS,
                options.reconnect_backoff_max_ms);
  }
  if (options.connect_timeout_ms > 0) {
    // gRPC's name for the minimum connect deadline (doc/
    // connection-backoff.md: MIN_CONNECT_TIMEOUT).
    args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, options.connect_timeout_ms);
  }
  if (options.keepalive_time_ms > 0) {
    args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, options.keepalive_time_ms);
    args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, options.keepalive_timeout_ms);
    // A parked call carries no data for minutes: ping regardless (gRPC
    // stops after 2 pings without data, and paces them 5 minutes apart).
    args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
    args.SetInt(GRPC_ARG_HTTP2_MIN_SENT_PING_INTERVAL_WITHOUT_DATA_MS,
                options.keepalive_time_ms);
  }
  if (options.private_subchannels) {
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  }
  return args;
}

}  // namespace

absl::StatusOr<std::shared_ptr<grpc::Channel>> CreateChannel(
    const std::string& endpoint, const ChannelOptions& options) {
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  grpc::ChannelArguments args = ConnectionArguments(options);
  if (options.tls_ca_file.empty()) {
    if (!options.tls_cert_file.empty() || !options.tls_key_file.empty()) {
      return absl::InvalidArgumentError(
          "a TLS client certificate was given without a CA file; give the "
          "CA that signed the server certificate too");
    }
    credentials = grpc::InsecureChannelCredentials();
  } else {
    grpc::SslCredentialsOptions ssl;
    absl::StatusOr<std::string> ca =
        ReadSecretFile(options.tls_ca_file, "TLS CA");
    if (!ca.ok()) return ca.status();
    ssl.pem_root_certs = *std::move(ca);
    if (options.tls_cert_file.empty() != options.tls_key_file.empty()) {
      return absl::InvalidArgumentError(
          "a TLS client certificate needs both the certificate and the key "
          "file");
    }
    if (!options.tls_cert_file.empty()) {
      absl::StatusOr<std::string> cert =
          ReadSecretFile(options.tls_cert_file, "TLS certificate");
      if (!cert.ok()) return cert.status();
      absl::StatusOr<std::string> key =
          ReadSecretFile(options.tls_key_file, "TLS key");
      if (!key.ok()) return key.status();
      ssl.pem_cert_chain = *std::move(cert);
      ssl.pem_private_key = *std::move(key);
    }
    credentials = grpc::SslCredentials(ssl);
    if (!options.tls_server_name.empty()) {
      args.SetSslTargetNameOverride(options.tls_server_name);
    }
  }
  std::vector<
      std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>>
      interceptors;
  if (!options.token.empty()) {
    interceptors.push_back(
        std::make_unique<TokenInterceptorFactory>(options.token));
  }
  return grpc::experimental::CreateCustomChannelWithInterceptors(
      endpoint, credentials, args, std::move(interceptors));
}

void AttachToken(grpc::ClientContext* context, const std::string& token) {
  if (!token.empty()) context->AddMetadata(kAuthorizationKey, Bearer(token));
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>>
CreateServerCredentials(const ServerTlsOptions& options) {
  if (options.cert_file.empty() && options.key_file.empty()) {
    if (!options.client_ca_file.empty()) {
      return absl::InvalidArgumentError(
          "a client CA for mutual TLS was given without a server certificate "
          "and key; give --tls-cert-file and --tls-key-file too");
    }
    return grpc::InsecureServerCredentials();
  }
  if (options.cert_file.empty() || options.key_file.empty()) {
    return absl::InvalidArgumentError(
        "TLS needs both the server certificate and its key "
        "(--tls-cert-file and --tls-key-file)");
  }
  absl::StatusOr<std::string> cert =
      ReadSecretFile(options.cert_file, "TLS certificate");
  if (!cert.ok()) return cert.status();
  absl::StatusOr<std::string> key = ReadSecretFile(options.key_file, "TLS key");
  if (!key.ok()) return key.status();
  grpc::SslServerCredentialsOptions ssl(
      GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  ssl.pem_key_cert_pairs.push_back({*std::move(key), *std::move(cert)});
  if (!options.client_ca_file.empty()) {
    absl::StatusOr<std::string> ca =
        ReadSecretFile(options.client_ca_file, "TLS client CA");
    if (!ca.ok()) return ca.status();
    ssl.pem_root_certs = *std::move(ca);
    ssl.client_certificate_request =
        GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
  }
  return grpc::SslServerCredentials(ssl);
}

bool CallHasToken(
    const std::multimap<grpc::string_ref, grpc::string_ref>& client_metadata,
    const std::string& token) {
  if (token.empty()) return true;
  const std::string expected = Bearer(token);
  bool found = false;
  auto range = client_metadata.equal_range(kAuthorizationKey);
  for (auto it = range.first; it != range.second; ++it) {
    const grpc::string_ref& got = it->second;
    // Compare every byte, whatever matches first, so timing says nothing
    // about how much of a guess was right.
    unsigned char diff = got.size() == expected.size() ? 0 : 1;
    for (size_t i = 0; i < expected.size(); ++i) {
      unsigned char g = i < got.size() ? got.data()[i] : 0;
      diff |= static_cast<unsigned char>(g ^ expected[i]);
    }
    found |= diff == 0;
  }
  return found;
}

}  // namespace ddprun::common
