#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ddprun::rendezvous {

// Job tokens: a credential that admits one job's calls and no other job's.
// A job token is HMAC-SHA256(key = the server's secret, message = run_id) in
// lowercase hex (64 characters), so the server needs no table of tokens and
// the agents and workers need no change: they pass the token they are given
// (--token-file / DDPRUN_TOKEN) as before. The same value in a shell:
//   printf %s "$RUN_ID" | openssl dgst -sha256 -hmac "$(cat secret)"
// `ddprun-rendezvous job-token --run-id ID --token-file SECRET` prints it.
//
// OpenSSL's libcrypto computes the HMAC: it is already linked through gRPC
// (Debian's libgrpc-dev depends on libssl-dev), and absl has no HMAC.
class JobTokens {
 public:
  // The secret must not be empty.
  static absl::StatusOr<std::unique_ptr<JobTokens>> Create(
      absl::string_view secret);
  ~JobTokens();
  JobTokens(const JobTokens&) = delete;
  JobTokens& operator=(const JobTokens&) = delete;

  // The token of job `run_id`. Thread-safe.
  std::string For(absl::string_view run_id) const;

 private:
  struct Keyed;
  explicit JobTokens(std::unique_ptr<Keyed> keyed);
  // The HMAC state after the key, copied for each token (a fresh HMAC would
  // hash the key again and fetch the algorithm: 3x slower per call).
  std::unique_ptr<Keyed> keyed_;
};

// Whether `token` has the shape of a job token (64 lowercase hex digits).
bool LooksLikeJobToken(absl::string_view token);

// One-shot JobTokens::Create(secret)->For(run_id).
absl::StatusOr<std::string> JobToken(absl::string_view secret,
                                     absl::string_view run_id);

}  // namespace ddprun::rendezvous
