#include "launcher/agent/failure_summary.h"

#include <fstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/time.h"
#include "common/rendezvous_words.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "launcher/agent/error_file.h"
#include "spdlog/spdlog.h"

namespace ddprun::launcher {
namespace {

std::string How(v1::WorkerFailure f) {
  common::NormalizeFailureCause(f);  // a server older than the enum
  if (f.failure_cause() == v1::FAILURE_CAUSE_HUNG) {
    return "hung (the error says where)";
  }
  if (f.failure_cause() == v1::FAILURE_CAUSE_SPAWN) {
    return "could not be started";
  }
  if (f.signal() != 0) {
    std::string name = f.signal_name().empty()
                           ? absl::StrCat("signal ", f.signal())
                           : f.signal_name();
    return absl::StrFormat("killed by %s (signal %d)", name, f.signal());
  }
  return absl::StrCat("exit code ", f.exit_code());
}

// `file` as JSON into `path`, replacing it; a failure is logged.
void WriteJson(const std::string& path, const google::protobuf::Struct& file) {
  std::string json;
  if (!google::protobuf::util::MessageToJsonString(file, &json).ok()) return;
  std::ofstream out(path, std::ios::trunc);
  out << json << "\n";
  if (!out.flush()) {
    spdlog::warn(
        "cannot write the job's error to TORCHELASTIC_ERROR_FILE "
        "'{}'; check that its folder exists and is writable",
        path);
  }
}

}  // namespace

std::string FormatFailure(const v1::WorkerFailure& f) {
  std::string time = absl::FormatTime("%Y-%m-%d %H:%M:%E3S UTC",
                                      absl::FromUnixMillis(f.time_unix_ms()),
                                      absl::UTCTimeZone());
  std::string message =
      f.message().empty()
          ? "no error message (the worker wrote no TORCHELASTIC_ERROR_FILE)"
          : absl::StrReplaceAll(f.message(), {{"\n", "\n      "}});
  return absl::StrFormat(
      "rank %d (local rank %d) on %s, round %d: %s at %s\n"
      "      error: %s",
      f.rank(), f.local_rank(), f.host(), f.round(), How(f), time, message);
}

std::string FormatFailureSummary(const std::string& run_id,
                                 const v1::JobEnded& ended) {
  std::string out = absl::StrFormat("ddprun: job '%s' failed", run_id);
  // The server's message names the job and its end too ("job 'X' failed:
  // 2 restarts used, ..."): only what it adds is repeated.
  absl::string_view detail = ended.message();
  absl::ConsumePrefix(&detail, absl::StrFormat("job '%s' failed", run_id));
  absl::ConsumePrefix(&detail, ": ");
  if (!detail.empty()) absl::StrAppend(&out, ": ", detail);
  absl::StrAppend(&out, "\n");
  if (ended.failures().empty()) {
    absl::StrAppend(&out, "  (the server recorded no worker failure)\n");
    return out;
  }
  absl::StrAppend(&out, "  first failure (root cause):\n    ",
                  FormatFailure(ended.failures(0)), "\n");
  if (ended.failures_size() > 1) {
    absl::StrAppend(&out, "  other failures:\n");
    for (int i = 1; i < ended.failures_size(); ++i) {
      absl::StrAppend(&out, "    ", FormatFailure(ended.failures(i)), "\n");
    }
  }
  return out;
}

void WriteAgentErrorFile(const std::string& path, const v1::JobEnded& ended) {
  if (path.empty() || ended.failures().empty()) return;
  const v1::WorkerFailure& root = ended.failures(0);
  // torchrun copies the root cause's error file as @record wrote it
  // ({"message": {"message", "extraInfo": {"py_callstack", "timestamp"}}})
  // and sets message.errorCode to the worker's exit code (-signal when
  // killed). The root cause may be another node's: its file is rebuilt from
  // the message, which carries the traceback after kTracebackMarker.
  std::pair<std::string, std::string> text_and_trace =
      absl::StrSplit(root.message(), absl::MaxSplits(kTracebackMarker, 1));
  google::protobuf::Struct file;
  google::protobuf::Struct* message =
      (*file.mutable_fields())["message"].mutable_struct_value();
  (*message->mutable_fields())["message"].set_string_value(
      root.message().empty() ? FormatFailure(root) : text_and_trace.first);
  google::protobuf::Struct* extra =
      (*message->mutable_fields())["extraInfo"].mutable_struct_value();
  if (!text_and_trace.second.empty()) {
    (*extra->mutable_fields())["py_callstack"].set_string_value(
        text_and_trace.second);
  }
  (*extra->mutable_fields())["timestamp"].set_string_value(
      absl::StrCat(root.time_unix_ms() / 1000));
  // ddprun's own: where the root cause was (it may be another node).
  (*extra->mutable_fields())["rank"].set_string_value(
      absl::StrCat(root.rank()));
  (*extra->mutable_fields())["host"].set_string_value(root.host());
  int error_code = root.signal() != 0 ? -root.signal() : root.exit_code();
  if (error_code != 0) {
    (*message->mutable_fields())["errorCode"].set_number_value(error_code);
  }
  WriteJson(path, file);
}

void WriteAgentSignalErrorFile(const std::string& path, int pid, int sig,
                               absl::Time when) {
  if (path.empty()) return;
  google::protobuf::Struct file;
  google::protobuf::Struct* message =
      (*file.mutable_fields())["message"].mutable_struct_value();
  // torchrun's words (its SignalException), so that what reads them for
  // torchrun reads ours.
  (*message->mutable_fields())["message"].set_string_value(
      absl::StrFormat("SignalException: Process %d got signal: %d", pid, sig));
  (*(*message->mutable_fields())["extraInfo"]
        .mutable_struct_value()
        ->mutable_fields())["timestamp"]
      .set_string_value(absl::StrCat(absl::ToUnixSeconds(when)));
  WriteJson(path, file);
}

}  // namespace ddprun::launcher
