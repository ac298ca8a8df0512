#pragma once

#include <functional>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "common/metrics_http.h"
#include "ddprun/v1/rendezvous.pb.h"

namespace ddprun::rendezvous {

using StatusSource =
    std::function<absl::StatusOr<v1::StatusResponse>(const v1::StatusRequest&)>;

// The read-only job pages served on the metrics port, next to /metrics
// (and so with its reach: loopback unless --metrics-host widens it):
//   /jobs                   the jobs, linked
//   /jobs/<run_id>          a live page: nodes and ranks with phase and step
//                           rate, the slowest ranks and stragglers,
//                           restarts, the event timeline, a steps-per-second
//                           plot; self-contained (inline CSS, SVG and a
//                           little JavaScript that polls page.json every
//                           second)
//   /jobs/<run_id>/page.json    what the page shows, bounded (64 ranks, the
//                               8 slowest, 100 events) for any job size
//   /jobs/<run_id>/status.json  Rendezvous.Status for the job, with events
// nullopt for any other target (404). No gRPC here: `status` answers.
std::optional<common::HttpPage> JobPage(const std::string& target,
                                        const StatusSource& status);

}  // namespace ddprun::rendezvous
