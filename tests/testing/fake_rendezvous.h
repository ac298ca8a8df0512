#pragma once

#include <deque>
#include <functional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "ddprun/v1/rendezvous.pb.h"
#include "launcher/agent/rendezvous_api.h"
#include "tests/testing/wait_for.h"

namespace ddprun::testing {

// The one fake of the RendezvousApi seam (launcher/agent/rendezvous_api.h)
// for the unit tests of what drives it (Agent, HeartbeatLoop): it answers
// Joins from a queue the test fills, heartbeats and Resumes through hooks,
// and records every request. Heartbeats run on the heartbeat loop's thread:
// what both threads touch is guarded by `mu`.
class FakeRendezvous final : public launcher::RendezvousApi {
 public:
  // Answers to the Joins, in order; a Join past them is a test error.
  std::deque<absl::StatusOr<v1::JoinResponse>> joins ABSL_GUARDED_BY(mu);
  // Called on the heartbeat thread with the call's number (from 0).
  std::function<absl::StatusOr<v1::HeartbeatResponse>(
      const v1::HeartbeatRequest&, int)>
      heartbeat = [](const v1::HeartbeatRequest&, int) {
        v1::HeartbeatResponse running;
        running.set_state(v1::JOB_STATE_RUNNING);
        return absl::StatusOr<v1::HeartbeatResponse>(running);
      };
  bool restarts_exhausted = false;
  std::function<void()> on_join;
  std::function<void()> on_leave;  // called at each Leave, before it answers

  absl::StatusOr<v1::JoinResponse> Join(const v1::JoinRequest& request,
                                        absl::Duration,
                                        absl::Duration) override {
    if (on_join) on_join();
    absl::MutexLock lock(&mu);
    join_requests.push_back(request);
    if (joins.empty()) return absl::InternalError("unexpected Join");
    absl::StatusOr<v1::JoinResponse> r = joins.front();
    joins.pop_front();
    return r;
  }
  // An answer for `joins`: the Join parks, as for a round that never
  // forms. A JoinUnless asks its check until it says leave (each ask stands
  // for a WakeJoin: a child changed state), for at most 30 s; a Join
  // returns this status at once.
  static absl::Status Parked() {
    return absl::DeadlineExceededError("fake: the Join parks");
  }
  absl::StatusOr<v1::JoinResponse> JoinUnless(
      const v1::JoinRequest& request, absl::Duration join_timeout,
      absl::Duration unreachable_timeout,
      absl::FunctionRef<bool()> leave) override {
    if (leave()) return launcher::JoinLeftError();
    absl::StatusOr<v1::JoinResponse> r =
        Join(request, join_timeout, unreachable_timeout);
    if (r.status() != Parked()) return r;
    if (WaitFor([&] { return leave(); }, absl::Seconds(30))) {
      return launcher::JoinLeftError();
    }
    return r;
  }
  absl::StatusOr<v1::HeartbeatResponse> Heartbeat(
      const v1::HeartbeatRequest& request) override {
    int call;
    {
      absl::MutexLock lock(&mu);
      call = heartbeats++;
    }
    return heartbeat(request, call);
  }
  absl::StatusOr<v1::ReportFailureResponse> ReportFailure(
      const v1::ReportFailureRequest& request) override {
    absl::MutexLock lock(&mu);
    reports.push_back(request);
    if (!report_error.ok()) return report_error;
    v1::ReportFailureResponse r;
    r.set_restart_count(static_cast<int>(reports.size()));
    r.set_restarts_exhausted(restarts_exhausted);
    return r;
  }
  absl::Status Leave(const v1::LeaveRequest& request) override {
    if (on_leave) on_leave();
    absl::MutexLock lock(&mu);
    leaves.push_back(request);
    resumes_at_leave.push_back(static_cast<int>(resume_requests.size()));
    if (leave_errors.empty()) return absl::OkStatus();
    absl::Status error = leave_errors.front();
    leave_errors.pop_front();
    return error;
  }
  // Unset: UNIMPLEMENTED, as a server older than Resume.
  std::function<absl::StatusOr<v1::ResumeResponse>(const v1::JoinRequest&)>
      resume;
  absl::StatusOr<v1::ResumeResponse> Resume(
      const v1::JoinRequest& request) override {
    {
      absl::MutexLock lock(&mu);
      resume_requests.push_back(request);
    }
    if (!resume) return launcher::RendezvousApi::Resume(request);
    return resume(request);
  }
  const std::string& endpoint() const override { return endpoint_; }

  int resume_count() {
    absl::MutexLock lock(&mu);
    return static_cast<int>(resume_requests.size());
  }
  int heartbeat_count() {
    absl::MutexLock lock(&mu);
    return heartbeats;
  }

  absl::Mutex mu;
  std::vector<v1::JoinRequest> join_requests;
  std::vector<v1::ReportFailureRequest> reports;
  std::vector<v1::LeaveRequest> leaves;
  std::vector<int> resumes_at_leave;      // Resume calls made before each Leave
  std::deque<absl::Status> leave_errors;  // the first Leaves fail with these
  std::vector<v1::JoinRequest> resume_requests;
  absl::Status report_error;  // what ReportFailure fails with, when set
  int heartbeats ABSL_GUARDED_BY(mu) = 0;

 private:
  std::string endpoint_ = "fake:0";
};

}  // namespace ddprun::testing
