#include "rendezvous/service/token_check.h"

#include <openssl/crypto.h>

#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "common/credentials.h"
#include "spdlog/spdlog.h"

namespace ddprun::rendezvous {
namespace {

constexpr absl::string_view kBearer = "Bearer ";

// Constant time in the content; a length mismatch returns at once, which
// tells a guesser only the length of a valid token (public for job tokens).
bool SameSecret(absl::string_view a, absl::string_view b) {
  return a.size() == b.size() &&
         CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

}  // namespace

TokenCheck::TokenCheck(TokenCheckOptions options)
    : secret_(std::move(options.secret)),
      only_run_id_(std::move(options.only_run_id)),
      status_without_secret_(options.status_without_secret) {
  if (secret_.empty()) return;
  absl::StatusOr<std::unique_ptr<JobTokens>> tokens =
      JobTokens::Create(secret_);
  if (tokens.ok()) {
    job_tokens_ = *std::move(tokens);
  } else {
    spdlog::error("job tokens are off, only the server's token admits: {}",
                  tokens.status().ToString());
  }
}

TokenCheck::Verdict TokenCheck::Judge(const grpc::ServerContextBase& context,
                                      const absl::string_view* run_id) const {
  if (secret_.empty()) return Verdict::kAdmitted;
  Verdict verdict = Verdict::kNoToken;
  std::string job_token;  // derived on first need
  auto range = context.client_metadata().equal_range(common::kAuthorizationKey);
  for (auto it = range.first; it != range.second; ++it) {
    absl::string_view value(it->second.data(), it->second.size());
    if (!absl::ConsumePrefix(&value, kBearer)) continue;
    if (SameSecret(value, secret_)) return Verdict::kAdmitted;
    if (!LooksLikeJobToken(value)) continue;
    if (run_id != nullptr && job_tokens_ != nullptr) {
      if (job_token.empty()) job_token = job_tokens_->For(*run_id);
      if (SameSecret(value, job_token)) return Verdict::kAdmitted;
    }
    verdict = Verdict::kOtherJob;
  }
  return verdict;
}

absl::Status TokenCheck::CheckServedJob(absl::string_view run_id) const {
  if (only_run_id_.empty() || run_id == only_run_id_) return absl::OkStatus();
  return absl::PermissionDeniedError(absl::StrFormat(
      "this rendezvous is served by the ddprun agent of job '%s' and serves "
      "no other run id (the call named '%s'); give --rdzv-id %s, or run "
      "ddprun-rendezvous to serve several jobs",
      only_run_id_, run_id, only_run_id_));
}

absl::Status TokenCheck::Check(const grpc::ServerContextBase& context,
                               absl::string_view run_id) const {
  switch (Judge(context, &run_id)) {
    case Verdict::kAdmitted:
      return CheckServedJob(run_id);
    case Verdict::kOtherJob:
      return absl::PermissionDeniedError(absl::StrFormat(
          "the call's token does not admit job '%s': it is neither this "
          "server's token nor the job token of '%s' (job tokens admit one "
          "run id each). Give this job's agents and workers the token that "
          "`ddprun-rendezvous job-token --run-id %s --token-file <the "
          "server's token file>` prints",
          run_id, run_id, run_id));
    case Verdict::kNoToken:
      break;
  }
  return absl::UnauthenticatedError(
      "the call carries no valid token: this server requires "
      "'authorization: Bearer <token>' with its own token or the job's token "
      "(`ddprun-rendezvous job-token`); give the agent the right --token-file "
      "(or DDPRUN_TOKEN)");
}

absl::Status TokenCheck::CheckAdmin(const grpc::ServerContextBase& context,
                                    absl::string_view what) const {
  switch (Judge(context, nullptr)) {
    case Verdict::kAdmitted:
      return absl::OkStatus();
    case Verdict::kOtherJob:
      return absl::PermissionDeniedError(absl::StrFormat(
          "%s needs the server's own token; a job token admits only its own "
          "job (name it, e.g. `ddprun status --rdzv-id ID`)",
          what));
    case Verdict::kNoToken:
      break;
  }
  return absl::UnauthenticatedError(absl::StrFormat(
      "%s: the call carries no valid token; give the server's --token-file "
      "(or DDPRUN_TOKEN)",
      what));
}

absl::Status TokenCheck::CheckStatus(const grpc::ServerContextBase& context,
                                     absl::string_view run_id) const {
  if (secret_.empty() && !status_without_secret_) {
    return absl::PermissionDeniedError(
        "this rendezvous is hosted by a ddprun agent without a token: like "
        "torchrun's c10d store it answers the job's own rendezvous and store "
        "calls, not Status; start the agents with --token-file (or "
        "DDPRUN_TOKEN) to read the job's status");
  }
  if (run_id.empty()) return CheckAdmin(context, "Status of every job");
  return Check(context, run_id);
}

}  // namespace ddprun::rendezvous
