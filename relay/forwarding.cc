#include "relay/forwarding.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/credentials.h"

namespace ddprun::relay {

ForwardedMetadata MetadataToForward(const grpc::ServerContextBase& context) {
  ForwardedMetadata metadata;
  for (const auto& [key, value] : context.client_metadata()) {
    absl::string_view name(key.data(), key.size());
    if (name == common::kAuthorizationKey ||
        absl::StartsWith(name, "ddprun-")) {
      metadata.emplace_back(std::string(name),
                            std::string(value.data(), value.size()));
    }
  }
  return metadata;
}

void AttachMetadata(const ForwardedMetadata& metadata,
                    grpc::ClientContext* upstream) {
  for (const auto& [key, value] : metadata) upstream->AddMetadata(key, value);
}

bool HasDeadline(std::chrono::system_clock::time_point deadline) {
  return deadline != std::chrono::system_clock::time_point::max();
}

void ForwardDeadline(const grpc::ServerContextBase& context,
                     grpc::ClientContext* upstream) {
  if (HasDeadline(context.deadline())) {
    upstream->set_deadline(context.deadline());
  }
}

grpc::Status FromUpstream(const grpc::Status& status,
                          const std::string& upstream) {
  if (status.error_code() != grpc::StatusCode::UNAVAILABLE) return status;
  return grpc::Status(
      grpc::StatusCode::UNAVAILABLE,
      absl::StrFormat("ddprun-relay could not reach the rendezvous server at "
                      "%s (%s); check that it runs and the relay's "
                      "--upstream",
                      upstream, status.error_message()));
}

std::string GroupKey(const std::string& run_id,
                     const ForwardedMetadata& metadata) {
  // Lengths first, so that no two different groups print the same.
  std::string key = absl::StrCat(run_id.size(), ":", run_id);
  for (const auto& [name, value] : metadata) {
    absl::StrAppend(&key, "|", name.size(), ":", name, value.size(), ":",
                    value);
  }
  return key;
}

}  // namespace ddprun::relay
