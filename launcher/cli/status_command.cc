#include "launcher/cli/status_command.h"

#include <cstdio>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "common/endpoint.h"
#include "common/json_string.h"
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
    // The ranks' figures from the agents' heartbeats.
    bool header = false;
    for (const v1::NodeStatus& node : job.nodes()) {
      for (const v1::RankFigures& r : node.ranks()) {
        if (!header) {
          absl::StrAppendFormat(&out, "  %-6s %-40s %-10s %8s %8s %12s %10s\n",
                                "RANK", "NODE", "PHASE", "STEPS", "STEPS/S",
                                "COMPUTE_MS", "P99_MS");
          header = true;
        }
        absl::StrAppendFormat(
            &out, "  %-6d %-40s %-10s %8d %8.1f %12s %10s\n",
            node.rank_offset() + r.local_rank(), node.node_id(), r.phase(),
            r.steps(), r.steps_per_s(),
            r.samples() > 0 ? absl::StrFormat("%.2f", r.compute_mean_s() * 1e3)
                            : "-",
            r.samples() > 0 ? absl::StrFormat("%.2f", r.compute_p99_s() * 1e3)
                            : "-");
      }
    }
    for (const v1::Straggler& s : job.stragglers()) {
      absl::StrAppendFormat(
          &out,
          "  straggler: rank %d (node %s, local rank %d): %.2f ms of compute "
          "per step, %.2fx the other ranks' median %.2f ms\n",
          s.rank(), s.node_id(), s.local_rank(), s.compute_s() * 1e3, s.ratio(),
          s.job_median_s() * 1e3);
    }
    for (const v1::WorkerFailure& failure : job.failures()) {
      absl::StrAppend(&out, "  failure: ", FormatFailure(failure), "\n");
    }
  }
  return out;
}

std::string FormatEvents(const v1::StatusResponse& response, bool json) {
  std::string out;
  google::protobuf::util::JsonPrintOptions print;
  print.preserve_proto_field_names = true;
  print.always_print_primitive_fields = true;
  for (const v1::JobStatus& job : response.jobs()) {
    for (const v1::JobEvent& event : job.events()) {
      if (json) {
        std::string line;
        (void)google::protobuf::util::MessageToJsonString(event, &line, print);
        // {"run_id":"...", then the event's own fields.
        std::string prefix = "{\"run_id\":";
        common::AppendJsonString(prefix, job.run_id());
        absl::StrAppend(&out, prefix, ",", line.substr(1), "\n");
      } else {
        absl::StrAppendFormat(
            &out, "%s %s round %d %-17s %s\n",
            absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ",
                             absl::FromUnixMillis(event.time_unix_ms()),
                             absl::UTCTimeZone()),
            job.run_id(), event.round(), event.kind(), event.message());
      }
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
  request.set_events(options.events);
  absl::StatusOr<v1::StatusResponse> response = (*client)->Status(request);
  if (!response.ok()) {
    std::fprintf(stderr, "ddprun: error: %s\n",
                 std::string(response.status().message()).c_str());
    return 1;
  }
  if (options.events) {
    std::fputs(FormatEvents(*response, options.json).c_str(), stdout);
  } else if (options.json) {
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
