#include "tests/testing/rendezvous_process.h"

#include <signal.h>

#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "tests/testing/wait_for.h"

namespace ddprun::testing {

bool RendezvousProcess::Start(int port, const std::vector<std::string>& flags) {
  const std::string prefix = "ddprun-rendezvous listening on 127.0.0.1:";
  bool listening = WaitFor(
      [&] {
        ++starts_;
        std::string out = dir_.File(absl::StrCat("rdzv", starts_, ".out"));
        err_ = dir_.File(absl::StrCat("rdzv", starts_, ".err"));
        SubprocessOptions options;
        options.argv = {BinaryPath("rendezvous/ddprun-rendezvous"), "--port",
                        absl::StrCat(port)};
        options.argv.insert(options.argv.end(), flags.begin(), flags.end());
        options.stdout_path = out;
        options.stderr_path = err_;
        absl::StatusOr<Subprocess> process = Subprocess::Start(options);
        if (!process.ok()) return false;
        bool up = WaitFor(
            [&] {
              if (process->Poll().has_value()) return true;  // it exited
              std::string text = ReadFileOrEmpty(out);
              size_t at = text.find(prefix);
              size_t eol = text.find('\n', at);
              if (at == std::string::npos || eol == std::string::npos) {
                return false;
              }
              return absl::SimpleAtoi(
                  text.substr(at + prefix.size(), eol - at - prefix.size()),
                  &port_);
            },
            absl::Seconds(10), absl::Milliseconds(20));
        // (A process that did not come up is killed and reaped by its
        // destructor.)
        if (!up || process->Poll().has_value()) return false;
        process_ = std::make_unique<Subprocess>(*std::move(process));
        return true;
      },
      absl::Seconds(30), absl::Milliseconds(200));
  if (!listening || (port != 0 && port_ != port)) return false;
  auto client = launcher::RendezvousClient::Create({.endpoint = endpoint()});
  if (!client.ok()) {
    last_seen_ = client.status().ToString();
    return false;
  }
  client_ = *std::move(client);
  return true;
}

bool RendezvousProcess::KillNine() {
  if (process_ == nullptr) return false;
  process_->Signal(SIGKILL);
  bool reaped = process_->Wait(absl::Seconds(10)).has_value();
  process_.reset();
  return reaped;
}

std::optional<v1::JobStatus> RendezvousProcess::Job(const std::string& run_id) {
  if (client_ == nullptr) return std::nullopt;
  v1::StatusRequest request;
  request.set_run_id(run_id);
  absl::StatusOr<v1::StatusResponse> status = client_->Status(request);
  if (!status.ok() || status->jobs_size() != 1) return std::nullopt;
  return status->jobs(0);
}

bool RendezvousProcess::WaitForRunning(const std::string& run_id, int64_t round,
                                       int restart_count, int nodes,
                                       absl::Duration timeout) {
  return WaitFor(
      [&] {
        std::optional<v1::JobStatus> job = Job(run_id);
        last_seen_ = job.has_value() ? job->DebugString() : "no job";
        if (!job.has_value() || job->state() != v1::JOB_STATE_RUNNING ||
            job->round() != round || job->restart_count() != restart_count) {
          return false;
        }
        int running = 0;
        for (const v1::NodeStatus& node : job->nodes()) {
          if (node.node_rank() < 0) continue;  // not a member of the round
          if (node.node_state() != v1::NODE_STATE_RUNNING) return false;
          ++running;
        }
        return running == nodes;
      },
      timeout, absl::Milliseconds(50));
}

std::string RendezvousProcess::endpoint() const {
  return absl::StrCat("127.0.0.1:", port_);
}

std::string RendezvousProcess::log() const {
  return absl::StrCat(ReadFileOrEmpty(err_), "--- last status seen:\n",
                      last_seen_);
}

}  // namespace ddprun::testing
