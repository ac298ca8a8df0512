#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "ddprun/v1/rendezvous.pb.h"
#include "rendezvous/core/effects.h"
#include "rendezvous/core/job_events.h"
#include "rendezvous/core/job_resumption.h"
#include "rendezvous/core/poll_pacing.h"
#include "rendezvous/core/round_most.h"
#include "rendezvous/core/straggler_detector.h"

namespace ddprun::rendezvous {

struct JobOptions {
  // Assignments list every peer only up to this many nodes: beyond it the
  // list would make each answer O(n) and a round's answers O(n^2) bytes.
  // Agents need only master_addr/master_port and their own ranks; Status
  // lists every node.
  int max_peers_in_assignment = 128;
  // The failure records kept per job (oldest first; [0] is the root cause).
  int max_failures_kept = 64;
  // Longer failure messages are cut to this many bytes.
  int64_t max_failure_message_bytes = 8192;
  // Nodes a job keeps (members, joining and waiting); more Joins are
  // refused RESOURCE_EXHAUSTED.
  int64_t max_nodes = 100000;
  // Heartbeats per second one job's nodes may send. A round of n nodes
  // heartbeats every max(interval, n / budget): beyond `budget` nodes per
  // second of interval the server hands out a longer interval in the
  // assignment (agents follow it) and lengthens the timeout in proportion,
  // so that a large job neither floods the server nor has live nodes
  // declared lost because their heartbeats queued. 0: never lengthened.
  int64_t heartbeat_budget_per_s = 10000;
  // How often each node sends its ranks' straggler figures (they ride on a
  // heartbeat; figures that changed much go at once), and how many figures
  // messages per second one job's nodes may send: a round of n nodes sends
  // them every max(figures_interval, n / budget), handed out in the
  // assignment, and the straggler detector keeps a node's figures fresh
  // for 2.5 such intervals (StragglerOptions::max_age at least). Each
  // figures message costs the server gRPC work for a few hundred bytes, so
  // the budget bounds their share of a core (bench/rendezvous,
  // ddprun-insight-bench --process). 0: never lengthened.
  absl::Duration figures_interval = absl::Seconds(1);
  int64_t figures_budget_per_s = 250;
  // A Tick that comes this long after the previous one means the server
  // itself did not run (overloaded, paused): heartbeats sent meanwhile wait
  // in its queues behind this Tick. The gap is then not counted as any
  // node's silence. Infinite: never (callers that tick at will, as tests
  // with a fake clock do).
  absl::Duration forgive_stalls_over = absl::InfiniteDuration();
  // Joins with `poll` parked at once per job; beyond, they are answered
  // `waiting` and poll. A parked call costs ~14 KiB of gRPC memory and, in
  // Debian's debug-built libgrpc, a scan step on every completion of its
  // queue; a poll costs one short call per interval. Joins without `poll`
  // (older agents) are always parked.
  int64_t max_parked_joins = 16384;
  // When polling nodes poll (PollPacing's rules).
  PollPacingOptions poll;
  // Who is named a straggler (StragglerDetector's rules).
  StragglerOptions straggler;
  // The events each job keeps (JobEvents).
  int max_events = 512;
};

// The rendezvous state machine of one job: rounds, membership, ranks,
// heartbeats, failures. A plain class: every method takes `now` and records
// what the adapters must do in `Effects`; it never blocks, sleeps or talks to
// the network. Not thread-safe: JobTable owns each Job and calls it under its
// mutex.
//
// The rules (the contract agents code against):
// - Rounds are numbered from 0 and only grow. A Join is parked (its waiter is
//   kept) until its round closes, join_timeout passes, or the call goes away.
// - A forming round closes when (a) max_nodes are parked, or (b) at least
//   min_nodes are parked and every node expected is parked (expected = the
//   previous round's members still alive + the nodes parked), which makes
//   restarts fast, or (c) at least min_nodes are parked and
//   last_call_timeout passed since the min-th arrived. Rule (b) applies only
//   once a previous round exists; the first round waits for last call.
// - Closing assigns ranks once: nodes that asked for a node_rank get it, the
//   others keep the previous round's order, newcomers follow by arrival. The
//   ranks are then made contiguous (0..n-1) keeping that order; at most
//   max_nodes are taken, the rest stay parked for the next round.
// - Polling (JoinRequest.poll): a Join with `poll` that would park while the
//   job already holds max_parked_joins parked calls is answered `waiting`
//   (round, poll interval, timeout) and its node waits as a parked one does,
//   holding no call. Its next Join (same node_id) is answered with the
//   decision reached meanwhile (assignment, JobEnded, join timeout), or
//   parked when a parked slot is free, or `waiting` again. join_timeout runs
//   from its first Join. A polling node is dropped when it does not poll
//   within the timeout it was given; a member whose assignment waits for
//   its poll is dropped the same way (the round ends), and its heartbeat
//   clock starts when it collects the assignment.
// - When a waiting node should poll, and when one is dropped for not
//   polling: PollPacing's rules. Only a forming round (JOINING, not being
//   resumed) has an expected close.
// - A round's heartbeat interval and timeout are the config's, lengthened
//   in proportion for a job too large for JobOptions::heartbeat_budget_per_s
//   (ScaleHeartbeats; the assignment carries both).
// - While a round runs, a Join from a member (its agent restarted) ends the
//   round; a Join from a new node ends it too when fewer than max_nodes are
//   members, otherwise the node waits. A member silent for
//   heartbeat_timeout, or leaving with SHUTDOWN, ends the round. None of these
//   count as restarts.
// - ReportFailure for the running round ends it and counts one restart; when
//   restart_count > max_restarts the job is FAILED. Reports for older rounds
//   change nothing (a report for the round that was just failed adds its
//   records to the failure list, so the summary is complete).
// - When every member of the running round left with SUCCEEDED the job is
//   SUCCEEDED. An ended job answers Joins and Heartbeats with JobEnded.
//
// Learning a job again after a server restart (agents carry a RoundRecord:
// their last assignment and the restart count they last heard):
// - The restart count never goes below a record's: every Join or Resume
//   with a record raises it to the record's (plus one when the record says
//   its round failed unacknowledged), so --max-restarts still bounds a job
//   whose server restarted. Restarts-exhausted is judged at the next
//   ReportFailure, as always.
// - Until this server has closed or resumed a round of the job, a Join with
//   a record of round r raises the forming round to r + 1 (its round r is
//   over), so rounds keep growing across restarts.
// - Resume (a record of round r whose workers still run): the highest round
//   wins. Until this server has closed or resumed a round, a record with
//   r >= the forming round starts rebuilding round r: the round is RUNNING,
//   its members are the nodes that resume with r (at their recorded node
//   ranks), and each is answered at once with its assignment, so no worker
//   restarts. A record with a higher round than the one being rebuilt
//   replaces it (its earlier members are told to rejoin by heartbeat).
//   Every other record (an older round, a node rank held by another node, a
//   different num_nodes or world size) is answered `rejoin`: that node
//   stops its workers and Joins as usual.
// - The rebuilt round is whole when all its num_nodes node ranks resumed;
//   nodes that Joined meanwhile are then admitted as in a running round.
//   When it is not whole within the round's heartbeat_timeout (from the
//   record), it ends as if the missing members were silent: round r + 1
//   forms and nothing counts as a restart.
class Job {
 public:
  // `config` must be normalized (NormalizeJobConfig).
  Job(std::string run_id, v1::JobConfig config, absl::Time now,
      JobOptions options = {});

  const std::string& run_id() const { return run_id_; }
  const v1::JobConfig& config() const { return config_; }
  int64_t round() const { return round_; }
  v1::JobState state() const { return state_; }
  int restart_count() const { return restart_count_; }
  bool ended() const;
  // When the job ended, or when its last node went away; nullopt while
  // nodes remain. JobTable releases a job some grace time after this.
  std::optional<absl::Time> idle_since() const;

  // Parks `waiter` for this node's round, or answers it at once (through
  // effects, like every other completion). `in_batch`: the waiter is one
  // node of a batched Join (JoinRequest.more), not a call of its own: it
  // does not count against max_parked_joins (its batch holds one call for
  // up to 1,024 nodes), so it is parked, never answered `waiting` for
  // lack of a parked slot.
  void Join(const v1::JoinRequest& request, WaiterId waiter, absl::Time now,
            Effects* effects, bool in_batch = false);
  // The parked Join `waiter` went away (client cancelled or disconnected):
  // the node is dropped. No effect when the waiter was already answered.
  void CancelJoin(const std::string& node_id, WaiterId waiter, absl::Time now,
                  Effects* effects);
  v1::HeartbeatResponse Heartbeat(const v1::HeartbeatRequest& request,
                                  absl::Time now);
  // What Heartbeat would answer node `node_id` of round `round` now, without
  // taking it for a heartbeat (nothing changes): the answer pushed on its
  // heartbeat stream when its round ends.
  v1::HeartbeatResponse HeartbeatAnswer(const std::string& node_id,
                                        int64_t round) const;
  // The node's heartbeat stream ended (its agent closed or cancelled it, or
  // went away) while it was a member of running round `round`. An agent
  // that still runs ends its stream only after its round ended, and sends
  // unary heartbeats when a stream breaks; so a member that then sends
  // nothing for StreamLossGrace is gone (kill -9, a crash) and is dropped
  // then, instead of after the whole heartbeat timeout.
  void HeartbeatStreamEnded(const std::string& node_id, int64_t round,
                            absl::Time now);
  v1::ReportFailureResponse ReportFailure(
      const v1::ReportFailureRequest& request, absl::Time now,
      Effects* effects);
  void Leave(const v1::LeaveRequest& request, absl::Time now, Effects* effects);
  // Re-registration of a node whose workers run in request.record()'s round
  // (the rules above); never parks.
  v1::ResumeResponse Resume(const v1::JoinRequest& request, absl::Time now,
                            Effects* effects);
  // Decisions (a round's assignments, JobEnded, errors) that wait for
  // their polling node to collect them: while any do, the round's fan-out
  // goes on (the server gives memory back only after it).
  int64_t answers_for_poll() const { return answers_for_poll_; }
  // True while a round is being rebuilt from re-registrations.
  bool resuming() const { return resuming_.has_value(); }
  // Join timeouts, silent nodes, last call.
  void Tick(absl::Time now, Effects* effects);
  // The earliest time Tick has something to do (a join, poll or heartbeat
  // deadline, the last call, a resume deadline; at the latest the next full
  // scan); InfiniteFuture for an ended job. Whoever calls a method that may
  // lower it tells the ticker (JobTableOptions::wake_by).
  absl::Time NextTick() const;
  // The answers of `round` (a ClosedRound effect) were sent by `now`: its
  // members' heartbeat clocks start then, not at the close.
  void AnswersDelivered(int64_t round, absl::Time now);
  // The batched Join holding these nodes' assignments was answered (or its
  // sender went away) by `now`: their silence counts from then. Until then
  // it does not: a batch is answered when its last node's outcome is
  // decided, which may come long after another of its nodes' round closed.
  void HeldAnswersDelivered(absl::Span<const std::string> node_ids,
                            absl::Time now);
  // Answers every parked Join with `status` (server shutdown).
  void CancelAllJoins(const absl::Status& status, Effects* effects);

  // `events`: with the job's event log.
  v1::JobStatus Status(absl::Time now, bool events = false) const;

 private:
  struct Node {
    v1::JoinRequest join;  // the latest Join (address, ports, node_rank)
    uint64_t arrival = 0;  // order of first arrival; newcomers go by it
    absl::Time last_seen;
    std::optional<WaiterId> waiter;  // a parked Join
    // The waiter is a node of a batched Join: it holds no call of its own
    // and does not count in parked_calls_.
    bool waiter_in_batch = false;
    // Its assignment went to its batch's answer, which is not sent yet
    // (HeldAnswersDelivered): its silence does not count.
    bool answer_held = false;
    absl::Time join_deadline;
    int previous_rank = -1;  // rank in the last closed round, -1: none
    int rank_offset = -1;    // in the last closed round
    bool member = false;     // in the running round
    bool done = false;       // left with SUCCEEDED
    // When its heartbeat stream ended in its running round (it is gone
    // unless it heartbeats again: HeartbeatStreamEnded).
    absl::Time stream_lost_at = absl::InfinitePast();
    // False from its round's assignment until it is heard from in that
    // round. An agent killed during a round change (after its Join was
    // answered, before its first heartbeat) has no stream whose end tells.
    bool heard_in_round = true;
    // Its local ranks' figures from its latest heartbeat of the running
    // round that carried them.
    google::protobuf::RepeatedPtrField<v1::RankFigures> ranks;
    // Waits for its round by polling Join (holds no call).
    bool polling = false;
    // The decision its next poll collects (assignment, JobEnded, error).
    std::optional<absl::StatusOr<v1::JoinResponse>> answer_for_poll;
    // Polling, or answer_for_poll set: dropped when it has not polled by then.
    absl::Time poll_deadline;

    // Parked or polling: counts for the forming round.
    bool waiting() const { return waiter.has_value() || polling; }
  };

  // The node `id` (made if new) takes `request`, its config dropped; a call
  // of its still parked is answered ABORTED, superseded by `newer_call`.
  Node& NodeFor(const std::string& id, const v1::JoinRequest& request,
                absl::string_view newer_call, Effects* effects);
  // Counts the node for the forming round: parks `waiter`, or, for a Join
  // with `poll` past max_parked_joins, lets the node poll (then true: the
  // caller answers `waiter` with RespondToPoll).
  bool Park(Node& node, WaiterId waiter, bool poll, bool in_batch,
            absl::Time now);
  // Keeps `waiter` as the node's parked Join (counted in parked_calls_
  // unless it is a node of a batch).
  void Hold(Node& node, WaiterId waiter, bool in_batch);
  // Forgets the node's parked Join (answered or gone).
  void Release(Node& node);
  // A repeated polling Join of a node that polls or has an answer waiting.
  void Poll(Node& node, const std::string& id, WaiterId waiter, bool in_batch,
            absl::Time now, Effects* effects);
  // Answers a polling node's `waiter`: its answer when one was decided
  // (then dropped from the job when it is an error), else `waiting`.
  // `in_batch`: `waiter` is a node of a batched Join (an assignment it
  // collects is held until the batch is answered).
  void RespondToPoll(const std::string& id, WaiterId waiter, absl::Time now,
                     Effects* effects, bool in_batch = false);
  // How long a node answered `waiting` now waits before its next poll
  // (PollPacing, with the forming round's expected close).
  int64_t PollDelayMs(absl::Time now);
  // When a polling node not yet answered `waiting` must poll again.
  absl::Time PollDeadline(absl::Time now) const;
  void Answer(Node& node, absl::StatusOr<v1::JoinResponse> response,
              Effects* effects);
  void Refuse(WaiterId waiter, absl::Status status, Effects* effects);
  v1::JoinResponse EndedResponse() const;
  v1::JobEnded Ended() const;
  // Rules (a) to (c) above; closes the forming round when one holds.
  void MaybeClose(absl::Time now, Effects* effects);
  void Close(absl::Time now, Effects* effects);
  using Entry = std::pair<const std::string, Node>;
  // The forming round's members in node-rank order (the closing rule
  // above): pinned node ranks first, then the previous round's order, then
  // arrival; at most max_nodes.
  std::vector<Entry*> ChooseMembers();
  // The running round is over: the next one starts forming.
  void EndRound(absl::Time now, Effects* effects);
  void Finish(v1::JobState state, absl::Time now, Effects* effects);
  void DropNode(const std::string& node_id, absl::Time now);
  // Forgets the node's decision waiting for its poll, if any.
  void ClearAnswerForPoll(Node& node);
  void AddFailures(const v1::ReportFailureRequest& request, absl::Time now);
  bool AllExpectedParked() const;
  // Sets the round's heartbeat interval and timeout, and its figures
  // interval, for `nodes` nodes.
  void ScaleRoundHeartbeats(int64_t nodes);
  // Sets the round's figures interval (and so how long the straggler
  // detector keeps figures fresh).
  void SetFiguresInterval(int64_t interval_ms);
  // How long a member whose heartbeat stream ended may stay silent: two
  // heartbeat intervals and at least a second (the agent falls back to
  // unary heartbeats at its next beat), never more than the heartbeat
  // timeout.
  absl::Duration StreamLossGrace() const;
  // How long a member may take to send its first heartbeat of a round: four
  // heartbeat intervals and at least two seconds (the agent beats one
  // interval after it started or reached its workers), never more than the
  // heartbeat timeout.
  absl::Duration FirstBeatGrace() const;
  std::string JoinTimeoutMessage() const;
  // Tick's parts. The server did not run for `stall` (its heartbeats
  // queued): nobody's silence grows by it.
  void ForgiveStall(absl::Duration stall, absl::Time now);
  // The nodes whose deadline passed by `now`, by what they missed; sets
  // next_scan_ to the earliest deadline still ahead.
  struct Overdue {
    std::vector<std::string> timed_out;        // join_timeout
    std::vector<std::string> stopped_polling;  // poll deadline, waiting
    std::vector<std::string> silent;           // heartbeat or collect
  };
  Overdue FindOverdue(absl::Time now);
  // When a node that heartbeats is silent too long: the heartbeat timeout,
  // or sooner for a member whose stream ended (StreamLossGrace) or that has
  // not beaten in its round yet (FirstBeatGrace).
  absl::Time SilenceDeadline(const Node& node) const;
  // Drops a silent node; true when it was a member of the running round
  // (which then ends).
  bool DropSilent(const std::string& id, absl::Time now);
  // A member's heartbeat of the running round carried rank figures: keeps
  // them and hands them to the straggler detector.
  void TakeFigures(Node& node, const v1::HeartbeatRequest& request,
                   absl::Time now);
  // Has the straggler detector compare the ranks when a window is due (on
  // any member's heartbeat of the running round) and logs and records what
  // it decides.
  void EvaluateStragglers(absl::Time now);

  // Re-registration after a server restart (the rules above; the
  // decisions are JobResumption's).
  // Raises the restart count to what `record` says and, when the record's
  // round is over for its node (a Join), the forming round past it. Fails
  // the job when the learned count is past max_restarts.
  void LearnFromRecord(const v1::RoundRecord& record, bool round_over,
                       absl::Time now, Effects* effects);
  // Starts rebuilding the record's round; forgets one rebuilt before.
  void StartResuming(const v1::RoundRecord& record, absl::Time now,
                     Effects* effects);
  v1::ResumeResponse AddResumed(const v1::JoinRequest& request, absl::Time now,
                                Effects* effects);
  // Every member is back: the round runs as one this server closed.
  void FinishResuming(absl::Time now, Effects* effects);
  // The deadline passed with members missing: the round ends.
  void AbandonResuming(absl::Time now, Effects* effects);
  static v1::ResumeResponse ResumeRefused(std::string why);

  const std::string run_id_;
  const v1::JobConfig config_;
  const JobOptions options_;
  int64_t round_ = 0;
  v1::JobState state_ = v1::JOB_STATE_JOINING;
  int restart_count_ = 0;
  int64_t failed_round_ = -1;  // the last round ended by ReportFailure
  std::vector<v1::WorkerFailure> failures_;
  absl::flat_hash_map<std::string, Node> nodes_;
  // Node ids of the last closed round, by rank: the running round's members
  // while RUNNING, the previous round's afterwards.
  std::vector<std::string> last_members_;
  std::vector<v1::Peer> last_peers_;
  int world_size_ = 0;
  int parked_ = 0;            // nodes waiting for a round (parked or polling)
  int64_t parked_calls_ = 0;  // nodes with a parked Join call
  int64_t polling_ = 0;       // nodes waiting by polling
  // Nodes whose decision (assignment, JobEnded, error) waits for their
  // next poll: the fan-out still to come.
  int64_t answers_for_poll_ = 0;
  uint64_t next_arrival_ = 0;
  // The running (or last) round's heartbeat interval and timeout.
  int64_t heartbeat_interval_ms_ = 0;
  int64_t heartbeat_timeout_ms_ = 0;
  // The running (or last) round's figures interval.
  int64_t figures_interval_ms_ = 0;
  std::optional<absl::Time> min_reached_at_;  // rule (c)'s clock
  // No join deadline or heartbeat deadline falls before this: Tick skips its
  // O(nodes) scan until then (a scan every tick made the 10 ms ticker the
  // server's largest cost at 100,000 nodes). Deadlines only move later
  // (heartbeats), except a new Join's (Park lowers it) and a new round's
  // (Close rescans).
  absl::Time next_scan_ = absl::InfinitePast();
  // No node's silence counts before this: the running round's answers were
  // sent by then (AnswersDelivered).
  absl::Time heartbeat_clock_start_ = absl::InfinitePast();
  absl::Time last_tick_ = absl::InfinitePast();
  std::optional<absl::Time> ended_at_;
  absl::Time last_activity_;
  // A round closed or resumed on this server: records no longer move the
  // round.
  bool round_decided_here_ = false;
  // The round being rebuilt from re-registrations, if any.
  std::optional<JobResumption> resuming_;
  PollPacing poll_pacing_;
  StragglerDetector stragglers_;
  // The most steps a rank of the running round reported
  // (HeartbeatRequest.steps, HeartbeatResponse.round_steps), and the furthest
  // one got through the round's state sync (sync, round_sync).
  RoundMost round_steps_;
  RoundMost round_sync_;
  JobEvents events_;
};

}  // namespace ddprun::rendezvous
