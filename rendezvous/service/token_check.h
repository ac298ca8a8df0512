#pragma once

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "grpcpp/server_context.h"
#include "rendezvous/core/job_token.h"

namespace ddprun::rendezvous {

// The server's admission of a call (metadata `authorization: Bearer <token>`),
// run first by every Rendezvous and Store handler. Two kinds of token pass:
// - the server's own secret (--token-file): every job, and what only an
//   operator may do (Status of every job);
// - a job token (job_token.h), derived from the secret and one run id: that
//   job's Rendezvous calls and its store scopes, nothing of another job.
// The health and reflection services stay open: probes (e.g. the kubelet's)
// carry no token, and neither reveals job data.
// A server that serves one job (the rendezvous a ddprun agent hosts) admits
// calls on that run id only, whatever the token, and may keep Status for
// callers with a token: without one it gives no more than torchrun's c10d
// store does (the job's rendezvous and store, not a view of the job).
// Immutable after construction; thread-safe.
struct TokenCheckOptions {
  // An empty secret admits every call.
  std::string secret;
  // When set, calls on any other run id are refused (PERMISSION_DENIED).
  std::string only_run_id;
  // Without a secret, whether Status answers (every caller could ask).
  bool status_without_secret = true;
};

class TokenCheck {
 public:
  explicit TokenCheck(TokenCheckOptions options);

  // Admits a call on job `run_id` (a store scope's run_id is its job):
  // OK, UNAUTHENTICATED when the call carries no token this server issued,
  // or PERMISSION_DENIED when it carries another job's token. The messages
  // say what to do and never echo a token.
  absl::Status Check(const grpc::ServerContextBase& context,
                     absl::string_view run_id) const;
  // Admits only the server's own secret; `what` names the operation.
  absl::Status CheckAdmin(const grpc::ServerContextBase& context,
                          absl::string_view what) const;
  // Admits a Status call: on `run_id` as Check does, or on every job (empty
  // run_id) as CheckAdmin does; refused without a secret when
  // status_without_secret is off.
  absl::Status CheckStatus(const grpc::ServerContextBase& context,
                           absl::string_view run_id) const;

 private:
  enum class Verdict { kAdmitted, kNoToken, kOtherJob };
  // `run_id` nullptr: only the secret admits.
  Verdict Judge(const grpc::ServerContextBase& context,
                const absl::string_view* run_id) const;

  // A refusal when the server serves another job only; OK otherwise.
  absl::Status CheckServedJob(absl::string_view run_id) const;

  const std::string secret_;
  const std::string only_run_id_;
  const bool status_without_secret_;
  // nullptr when there is no secret (or OpenSSL failed: then only the secret
  // itself admits).
  std::unique_ptr<JobTokens> job_tokens_;
};

}  // namespace ddprun::rendezvous
