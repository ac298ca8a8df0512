#include "launcher/cli/farewell.h"

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "ddprun/v1/rendezvous.pb.h"
#include "launcher/agent/rendezvous_client.h"

namespace ddprun::launcher {
namespace {

// The fields by name, so that the encoding and the decoding cannot drift.
std::vector<std::pair<const char*, std::string*>> Fields(Farewell& f) {
  common::Credentials& c = f.credentials;
  return {{"endpoint", &f.endpoint},
          {"run_id", &f.run_id},
          {"node_id", &f.node_id},
          {"token", &c.token},
          {"tls_ca_file", &c.tls_ca_file},
          {"tls_cert_file", &c.tls_cert_file},
          {"tls_key_file", &c.tls_key_file},
          {"tls_server_name", &c.tls_server_name}};
}

}  // namespace

std::string EncodeFarewell(const Farewell& farewell) {
  Farewell copy = farewell;
  std::string out;
  for (const auto& [name, value] : Fields(copy)) {
    absl::StrAppend(&out, name, "=", absl::CEscape(*value), "\n");
  }
  return out;
}

bool DecodeFarewell(const std::string& encoded, Farewell& farewell) {
  std::map<std::string, std::string> values;
  for (absl::string_view line :
       absl::StrSplit(encoded, '\n', absl::SkipEmpty())) {
    std::pair<std::string, std::string> kv =
        absl::StrSplit(line, absl::MaxSplits('=', 1));
    std::string value;
    if (!absl::CUnescape(kv.second, &value)) return false;
    values[kv.first] = std::move(value);
  }
  for (const auto& [name, field] : Fields(farewell)) {
    auto it = values.find(name);
    if (it == values.end()) return false;
    *field = it->second;
  }
  return !farewell.endpoint.empty() && !farewell.node_id.empty();
}

void SayFarewell(const std::string& encoded) {
  Farewell farewell;
  if (!DecodeFarewell(encoded, farewell)) return;
  RendezvousClientOptions options;
  options.endpoint = farewell.endpoint;
  static_cast<common::Credentials&>(options.channel) = farewell.credentials;
  options.rpc_timeout = absl::Seconds(2);
  absl::StatusOr<std::unique_ptr<RendezvousClient>> client =
      RendezvousClient::Create(options);
  if (!client.ok()) return;
  v1::LeaveRequest request;
  request.set_run_id(farewell.run_id);
  request.set_node_id(farewell.node_id);
  request.set_reason(v1::LeaveRequest::REASON_AGENT_LOST);
  (*client)->Leave(request).IgnoreError();
}

}  // namespace ddprun::launcher
