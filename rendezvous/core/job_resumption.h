#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "ddprun/v1/rendezvous.pb.h"

namespace ddprun::rendezvous {

// The rebuilding of one round of a job from its members' re-registrations
// after a server restart (Job's rules on learning a job again): what a
// node's record teaches, which record starts the rebuilding, which node may
// take which node rank, and whether the members that came back make up the
// round. A decider: Job keeps the round's members by node rank ("" for one
// not back yet) and applies what this class decides to its nodes. Not
// thread-safe: its Job owns it.
class JobResumption {
 public:
  // The restart count a node's record tells: the higher of the record's and
  // its assignment's, plus one when its round failed unacknowledged.
  static int RestartsIn(const v1::RoundRecord& record);
  // Whether a Resume with a record of `record_round` starts rebuilding that
  // round, when the job is in `round` and `joining` (forming a round): only
  // until a round was closed or resumed here (`round_decided_here`), and
  // only for a round not older than the forming one. `rebuilding`: the
  // round being rebuilt, if any; a higher round replaces it.
  static bool Starts(int64_t record_round, int64_t round, bool joining,
                     bool round_decided_here,
                     std::optional<int64_t> rebuilding);

  // Rebuilds `assignment`'s round (the first record's) from `now`: given up
  // when not whole within the round's heartbeat timeout.
  JobResumption(const v1::Assignment& assignment, int64_t heartbeat_timeout_ms,
                absl::Time now);

  int num_nodes() const { return num_nodes_; }
  int world_size() const { return world_size_; }
  absl::Time deadline() const { return deadline_; }

  // Why `request` (a Resume with its record) cannot take its node rank in
  // the round, with `members` back so far; nullopt when it may. The message
  // names the node, the round and what disagrees.
  std::optional<std::string> Refusal(const v1::JoinRequest& request,
                                     absl::Span<const std::string> members,
                                     absl::string_view run_id,
                                     int64_t round) const;
  // Every node rank is back.
  static bool Whole(absl::Span<const std::string> members);
  // Why the members' peers (by node rank) do not make up the round: their
  // rank offsets do not tile the world, or hold other than world_size
  // ranks; nullopt when they do, as a round closed here would.
  std::optional<std::string> Disagreement(absl::Span<const v1::Peer> peers,
                                          absl::string_view run_id,
                                          int64_t round) const;
  // The node ranks not back, "0, 3".
  static std::string MissingRanks(absl::Span<const std::string> members);
  // The peer entry of `request`'s node in the rebuilt round.
  static v1::Peer PeerOf(const v1::JoinRequest& request);

 private:
  int num_nodes_ = 0;
  int world_size_ = 0;
  absl::Time deadline_;
};

}  // namespace ddprun::rendezvous
