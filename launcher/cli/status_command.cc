#include "launcher/cli/status_command.h"

#include <cstdio>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "common/endpoint.h"
#include "common/rendezvous_words.h"
#include "google/protobuf/util/json_util.h"
#include "launcher/agent/failure_summary.h"
#include "launcher/agent/rendezvous_client.h"

namespace ddprun::launcher {
namespace {

std::string StateName(v1::JobState state) {
  std::string name = v1::JobState_Name(state);
  absl::string_view short_name = name;
  absl::ConsumePrefix(&short_name, "JOB_STATE_");
  return absl::AsciiStrToLower(short_name);
}

// The node's state as a word; a server older than node_state sends only the
// word.
std::string NodeStateOf(const v1::NodeStatus& node) {
  if (node.node_state() == v1::NODE_STATE_UNSPECIFIED) return node.state();
  return common::NodeStateWord(node.node_state());
}

}  // namespace

std::string FormatStatus(const v1::StatusResponse& response) {
  if (response.jobs().empty()) return "no jobs\n";
  std::string out;
  for (const v1::JobStatus& job : response.jobs()) {
    absl::StrAppendFormat(
        &out,
        "job %s: %s, round %d, world size %d, restarts %d/%d, nodes %d:%d%s\n",
        job.run_id(), StateName(job.state()), job.round(), job.world_size(),
        job.restart_count(), job.config().max_restarts(),
        job.config().min_nodes(), job.config().max_nodes(),
        job.resuming() ? " (server restarted: its members are resuming)" : "");
    absl::StrAppendFormat(&out, "  %-40s %-16s %9s %7s %6s %10s %s\n", "NODE",
                          "ADDRESS", "NODE_RANK", "RANKS", "NPROC", "HEARTBEAT",
                          "STATE");
    for (const v1::NodeStatus& node : job.nodes()) {
      std::string ranks =
          node.node_rank() < 0
              ? "-"
              : absl::StrCat(node.rank_offset(), "-",
                             node.rank_offset() + node.local_world_size() - 1);
      absl::StrAppendFormat(
          &out, "  %-40s %-16s %9d %7s %6d %9.1fs %s\n", node.node_id(),
          node.address(), node.node_rank(), ranks, node.local_world_size(),
          node.last_heartbeat_age_ms() / 1000.0, NodeStateOf(node));
    }
    for (const v1::WorkerFailure& failure : job.failures()) {
      absl::StrAppend(&out, "  failure: ", FormatFailure(failure), "\n");
    }
  }
  return out;
}

int RunStatus(const StatusOptions& options) {
  absl::StatusOr<common::Endpoint> endpoint =
      common::ParseEndpoint(options.rdzv_endpoint);
  if (!endpoint.ok()) {
    std::fprintf(stderr, "ddprun: error: --rdzv-endpoint: %s\n",
                 std::string(endpoint.status().message()).c_str());
    return 2;
  }
  RendezvousClientOptions client_options;
  client_options.endpoint = endpoint->ToString();
  client_options.rpc_timeout = options.timeout;
  absl::StatusOr<common::ChannelOptions> channel =
      MakeChannelOptions(options.auth);
  absl::StatusOr<std::unique_ptr<RendezvousClient>> client =
      channel.ok() ? RendezvousClient::Create(
                         {client_options.endpoint, *channel, options.timeout})
                   : channel.status();
  if (!client.ok()) {
    std::fprintf(stderr, "ddprun: error: %s\n",
                 std::string(client.status().message()).c_str());
    return 2;
  }
  v1::StatusRequest request;
  request.set_run_id(options.rdzv_id);
  absl::StatusOr<v1::StatusResponse> response = (*client)->Status(request);
  if (!response.ok()) {
    std::fprintf(stderr, "ddprun: error: %s\n",
                 std::string(response.status().message()).c_str());
    return 1;
  }
  if (options.json) {
    std::string json;
    google::protobuf::util::JsonPrintOptions print;
    print.add_whitespace = true;
    print.preserve_proto_field_names = true;
    (void)google::protobuf::util::MessageToJsonString(*response, &json, print);
    std::fputs(json.c_str(), stdout);
  } else {
    std::fputs(FormatStatus(*response).c_str(), stdout);
  }
  return 0;
}

}  // namespace ddprun::launcher
