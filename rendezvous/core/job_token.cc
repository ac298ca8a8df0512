#include "rendezvous/core/job_token.h"

#include <openssl/core_names.h>
#include <openssl/evp.h>
#include <openssl/params.h>

#include <utility>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"

namespace ddprun::rendezvous {

struct JobTokens::Keyed {
  EVP_MAC* mac = nullptr;
  EVP_MAC_CTX* ctx = nullptr;
  ~Keyed() {
    EVP_MAC_CTX_free(ctx);
    EVP_MAC_free(mac);
  }
};

JobTokens::JobTokens(std::unique_ptr<Keyed> keyed) : keyed_(std::move(keyed)) {}
JobTokens::~JobTokens() = default;

absl::StatusOr<std::unique_ptr<JobTokens>> JobTokens::Create(
    absl::string_view secret) {
  if (secret.empty()) {
    return absl::InvalidArgumentError(
        "job tokens are derived from the server's token, and none is set; "
        "give --token-file (or DDPRUN_TOKEN)");
  }
  auto keyed = std::make_unique<Keyed>();
  keyed->mac = EVP_MAC_fetch(nullptr, OSSL_MAC_NAME_HMAC, nullptr);
  if (keyed->mac != nullptr) keyed->ctx = EVP_MAC_CTX_new(keyed->mac);
  char digest[] = OSSL_DIGEST_NAME_SHA2_256;
  OSSL_PARAM params[] = {
      OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, digest, 0),
      OSSL_PARAM_construct_end()};
  if (keyed->ctx == nullptr ||
      EVP_MAC_init(keyed->ctx,
                   reinterpret_cast<const unsigned char*>(secret.data()),
                   secret.size(), params) != 1) {
    return absl::InternalError(
        "OpenSSL has no HMAC-SHA256 here (EVP_MAC_fetch/EVP_MAC_init "
        "failed); check the libssl3 installation");
  }
  return std::unique_ptr<JobTokens>(new JobTokens(std::move(keyed)));
}

std::string JobTokens::For(absl::string_view run_id) const {
  unsigned char out[EVP_MAX_MD_SIZE];
  size_t len = 0;
  EVP_MAC_CTX* ctx = EVP_MAC_CTX_dup(keyed_->ctx);
  bool ok =
      ctx != nullptr &&
      EVP_MAC_update(ctx, reinterpret_cast<const unsigned char*>(run_id.data()),
                     run_id.size()) == 1 &&
      EVP_MAC_final(ctx, out, &len, sizeof(out)) == 1;
  EVP_MAC_CTX_free(ctx);
  // Only an allocation failure gets here: no token then matches, so every
  // job-token call is refused rather than admitted.
  if (!ok) return std::string();
  return absl::BytesToHexString(
      absl::string_view(reinterpret_cast<const char*>(out), len));
}

bool LooksLikeJobToken(absl::string_view token) {
  if (token.size() != 64) return false;
  for (char c : token) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

absl::StatusOr<std::string> JobToken(absl::string_view secret,
                                     absl::string_view run_id) {
  absl::StatusOr<std::unique_ptr<JobTokens>> tokens = JobTokens::Create(secret);
  if (!tokens.ok()) return tokens.status();
  return (*tokens)->For(run_id);
}

}  // namespace ddprun::rendezvous
