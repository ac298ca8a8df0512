#pragma once

#include <string>
#include <vector>

#include "absl/time/time.h"
#include "ddprun/v1/rendezvous.pb.h"
#include "launcher/agent/supervisor_policy.h"

namespace ddprun::launcher {

// Who reports, for which round.
struct FailureReportContext {
  std::string run_id;
  std::string node_id;
  std::string host;  // this node's address, as peers know it
  int64_t round = 0;
  int rank_offset = 0;  // global rank of local rank 0
};

// What a hang was: "stopped (state T) for 0.5s in phase step", or "no
// progress for 12s in phase join (its bound; --hang-bound join=SECONDS
// changes it)".
std::string DescribeHang(const LocalFailure& failure);

// The ReportFailure request for this node's failed workers (oldest first):
// each with its global rank, exit code or signal name, time, and the message
// from its error file (error_files[local_rank]), or what the agent knows
// (killed by a signal, hung). A non-empty `spawn_error` is reported first,
// as local rank 0's failure to start.
v1::ReportFailureRequest BuildFailureReport(
    const FailureReportContext& context,
    const std::vector<LocalFailure>& failures,
    const std::vector<std::string>& error_files, const std::string& spawn_error,
    absl::Time now);

}  // namespace ddprun::launcher
