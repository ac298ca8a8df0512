#include "launcher/agent/failure_report.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/rendezvous_words.h"
#include "launcher/agent/error_file.h"
#include "launcher/posix/exit_status.h"

namespace ddprun::launcher {

namespace {

std::string Waiter(const LocalFailure& f) {
  return f.waited_by >= 0 ? absl::StrCat("local rank ", f.waited_by)
                          : "a rank of another node";
}

}  // namespace

std::string DescribeHang(const LocalFailure& f) {
  const absl::string_view phase = common::PhaseName(f.phase);
  // Whole milliseconds: "34ms", not "34.19673ms".
  const std::string silent =
      absl::FormatDuration(absl::Trunc(f.silent, absl::Milliseconds(1)));
  if (f.stopped) {
    // With the default bound it is found at the first look: "for 0".
    if (f.silent < absl::Milliseconds(1)) {
      return absl::StrFormat("stopped (state T) in phase %s", phase);
    }
    return absl::StrFormat("stopped (state T) for %s in phase %s", silent,
                           phase);
  }
  if (f.blocked) {
    std::string quiet;
    if (f.quiet) {
      quiet = f.first_time ? ", and quiet (no bytes read or written, no "
                             "child process) the first time this rank was "
                             "there"
                           : ", and quiet (no bytes read or written, no "
                             "child process)";
    }
    return absl::StrFormat(
        "blocked for %s in phase %s: asleep without using CPU while %s "
        "waited for it%s (a deadlock, or a wait that does not end; "
        "--hang-bound blocked=SECONDS changes the bound)",
        silent, phase, Waiter(f), quiet);
  }
  if (f.gave_up_round) {
    return absl::StrFormat(
        "waiting for %s in phase %s for a next round that did not come: its "
        "round could not form (a peer it could not reach) and nobody else "
        "ended it",
        silent, phase);
  }
  if (f.spinning) {
    absl::string_view work = "its step";
    if (f.phase == common::Phase::kCheckpoint) work = "its checkpoint write";
    if (f.phase == common::Phase::kEval) work = "its evaluation";
    if (f.phase == common::Phase::kJoin) work = "its join of the round";
    return absl::StrFormat(
        "spinning for %s in phase %s: used %s of CPU without finishing %s "
        "while %s waited for it (a loop that does not end; "
        "--hang-bound spin=SECONDS changes the bound)",
        silent, phase,
        absl::FormatDuration(absl::Trunc(f.cpu, absl::Milliseconds(1))), work,
        Waiter(f));
  }
  return absl::StrFormat(
      "no progress for %s in phase %s (its bound; --hang-bound %s=SECONDS "
      "changes it)",
      silent, phase, phase);
}

v1::ReportFailureRequest BuildFailureReport(
    const FailureReportContext& context,
    const std::vector<LocalFailure>& failures,
    const std::vector<std::string>& error_files, const std::string& spawn_error,
    absl::Time now) {
  v1::ReportFailureRequest request;
  request.set_run_id(context.run_id);
  request.set_node_id(context.node_id);
  request.set_round(context.round);
  auto add = [&](int local_rank) {
    v1::WorkerFailure* f = request.add_failures();
    f->set_node_id(context.node_id);
    f->set_host(context.host);
    f->set_round(context.round);
    f->set_rank(context.rank_offset + local_rank);
    f->set_local_rank(local_rank);
    return f;
  };
  if (!spawn_error.empty()) {
    v1::WorkerFailure* f = add(0);
    f->set_exit_code(-1);
    f->set_failure_cause(v1::FAILURE_CAUSE_SPAWN);
    common::NormalizeFailureCause(*f);  // the word too, for older servers
    f->set_message(spawn_error);
    f->set_time_unix_ms(absl::ToUnixMillis(now));
  }
  for (const LocalFailure& failure : failures) {
    v1::WorkerFailure* f = add(failure.local_rank);
    f->set_failure_cause(failure.cause);
    common::NormalizeFailureCause(*f);
    f->set_time_unix_ms(absl::ToUnixMillis(failure.time));
    if (failure.cause == v1::FAILURE_CAUSE_STRAGGLER) {
      f->set_exit_code(-1);
      f->set_message(
          "named a persistent straggler by the rendezvous server; the agent "
          "killed it to be replaced (--straggler-policy replace)");
      continue;
    }
    if (failure.cause == v1::FAILURE_CAUSE_HUNG) {
      f->set_exit_code(-1);
      f->set_message(
          absl::StrCat(DescribeHang(failure), "; the agent killed it"));
      continue;
    }
    f->set_exit_code(failure.exit.exit_code);
    f->set_signal(failure.exit.signal);
    if (failure.exit.signal != 0) {
      f->set_signal_name(SignalName(failure.exit.signal));
    }
    std::string message =
        failure.local_rank < static_cast<int>(error_files.size())
            ? ReadWorkerErrorMessage(error_files[failure.local_rank])
            : "";
    if (message.empty() && failure.exit.signal != 0) {
      message = absl::StrFormat("the worker was killed by %s",
                                SignalName(failure.exit.signal));
    }
    f->set_message(message);
  }
  return request;
}

}  // namespace ddprun::launcher
