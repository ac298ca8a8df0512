#include "rendezvous/core/job_resumption.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace ddprun::rendezvous {

int JobResumption::RestartsIn(const v1::RoundRecord& record) {
  return std::max(record.restart_count(), record.assignment().restart_count()) +
         (record.failed() ? 1 : 0);
}

bool JobResumption::Starts(int64_t record_round, int64_t round, bool joining,
                           bool round_decided_here,
                           std::optional<int64_t> rebuilding) {
  if (rebuilding.has_value()) return record_round > *rebuilding;
  return !round_decided_here && joining && record_round >= round;
}

JobResumption::JobResumption(const v1::Assignment& assignment,
                             int64_t heartbeat_timeout_ms, absl::Time now)
    : num_nodes_(std::max(1, assignment.num_nodes())),
      world_size_(assignment.world_size()),
      deadline_(now + absl::Milliseconds(heartbeat_timeout_ms)) {}

std::optional<std::string> JobResumption::Refusal(
    const v1::JoinRequest& request, absl::Span<const std::string> members,
    absl::string_view run_id, int64_t round) const {
  const v1::Assignment& a = request.record().assignment();
  const std::string& id = request.node_id();
  const int rank = a.node_rank();
  if (a.num_nodes() != num_nodes_ || a.world_size() != world_size_) {
    return absl::StrFormat(
        "node '%s' ran round %d of job '%s' with %d nodes and world size %d, "
        "but its peers' records say %d nodes and world size %d",
        id, round, run_id, a.num_nodes(), a.world_size(), num_nodes_,
        world_size_);
  }
  if (rank < 0 || rank >= num_nodes_ || request.local_world_size() < 1) {
    return absl::StrFormat(
        "node '%s' has node rank %d and local world size %d in round %d of "
        "job '%s', which has %d nodes",
        id, rank, request.local_world_size(), round, run_id, num_nodes_);
  }
  const std::string& holder = members[rank];
  if (!holder.empty() && holder != id) {
    return absl::StrFormat(
        "node rank %d of round %d of job '%s' is already held by node '%s'; "
        "node '%s' must rejoin",
        rank, round, run_id, holder, id);
  }
  return std::nullopt;
}

bool JobResumption::Whole(absl::Span<const std::string> members) {
  return std::none_of(members.begin(), members.end(),
                      [](const std::string& m) { return m.empty(); });
}

std::optional<std::string> JobResumption::Disagreement(
    absl::Span<const v1::Peer> peers, absl::string_view run_id,
    int64_t round) const {
  int offset = 0;
  for (const v1::Peer& peer : peers) {
    if (peer.rank_offset() != offset) {
      return absl::StrFormat(
          "job '%s': the resumed members of round %d disagree on ranks (node "
          "'%s' starts at rank %d, expected %d); round %d ends",
          run_id, round, peer.node_id(), peer.rank_offset(), offset, round);
    }
    offset += peer.local_world_size();
  }
  if (offset != world_size_) {
    return absl::StrFormat(
        "job '%s': the resumed members of round %d hold %d ranks, not world "
        "size %d; round %d ends",
        run_id, round, offset, world_size_, round);
  }
  return std::nullopt;
}

std::string JobResumption::MissingRanks(absl::Span<const std::string> members) {
  std::string missing;
  for (size_t rank = 0; rank < members.size(); ++rank) {
    if (members[rank].empty()) {
      absl::StrAppend(&missing, missing.empty() ? "" : ", ", rank);
    }
  }
  return missing;
}

v1::Peer JobResumption::PeerOf(const v1::JoinRequest& request) {
  const v1::Assignment& a = request.record().assignment();
  v1::Peer peer;
  peer.set_node_id(request.node_id());
  peer.set_node_rank(a.node_rank());
  peer.set_address(request.address());
  peer.set_local_world_size(request.local_world_size());
  peer.set_rank_offset(a.rank_offset());
  return peer;
}

}  // namespace ddprun::rendezvous
