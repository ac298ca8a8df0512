// JobResumption's decisions on a fake clock: what a record teaches, which
// record starts the rebuilding, which node may take which node rank, and
// whether the members that came back make up the round.
#include "rendezvous/core/job_resumption.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "common/clock.h"

namespace ddprun::rendezvous {
namespace {

// Round 4 of 3 nodes of 2 ranks each, as node `rank` ran it.
v1::JoinRequest Resume(const std::string& id, int rank, int num_nodes = 3,
                       int world_size = 6) {
  v1::JoinRequest request;
  request.set_node_id(id);
  request.set_address("host-" + id);
  request.set_local_world_size(2);
  v1::Assignment* a = request.mutable_record()->mutable_assignment();
  a->set_round(4);
  a->set_num_nodes(num_nodes);
  a->set_world_size(world_size);
  a->set_node_rank(rank);
  a->set_rank_offset(2 * rank);
  a->set_heartbeat_timeout_ms(6000);
  return request;
}

TEST(JobResumptionTest, ARecordTellsTheHigherRestartCountPlusAFailure) {
  v1::RoundRecord record;
  record.set_restart_count(2);
  record.mutable_assignment()->set_restart_count(3);
  EXPECT_EQ(JobResumption::RestartsIn(record), 3);
  record.set_failed(true);
  EXPECT_EQ(JobResumption::RestartsIn(record), 4);
}

TEST(JobResumptionTest, OnlyARoundNotOlderStartsUntilARoundIsDecidedHere) {
  // Forming round 3: a record of round 4 or 3 starts, one of round 2 not.
  EXPECT_TRUE(JobResumption::Starts(4, 3, true, false, std::nullopt));
  EXPECT_TRUE(JobResumption::Starts(3, 3, true, false, std::nullopt));
  EXPECT_FALSE(JobResumption::Starts(2, 3, true, false, std::nullopt));
  // A round closed here, or a running round: records no longer start one.
  EXPECT_FALSE(JobResumption::Starts(4, 3, true, true, std::nullopt));
  EXPECT_FALSE(JobResumption::Starts(4, 3, false, false, std::nullopt));
  // While round 4 is rebuilt, only a higher round replaces it.
  EXPECT_TRUE(JobResumption::Starts(5, 4, false, false, 4));
  EXPECT_FALSE(JobResumption::Starts(4, 4, false, false, 4));
}

TEST(JobResumptionTest, IsGivenUpOneHeartbeatTimeoutAfterItStarts) {
  common::FakeClock clock;
  JobResumption resumption(Resume("a", 0).record().assignment(), 6000,
                           clock.Now());
  EXPECT_EQ(resumption.deadline(), clock.Now() + absl::Seconds(6));
  EXPECT_EQ(resumption.num_nodes(), 3);
  EXPECT_EQ(resumption.world_size(), 6);
}

TEST(JobResumptionTest, RefusesARecordThatDoesNotFitTheRound) {
  common::FakeClock clock;
  JobResumption resumption(Resume("a", 0).record().assignment(), 6000,
                           clock.Now());
  std::vector<std::string> members = {"a", "", ""};
  EXPECT_EQ(resumption.Refusal(Resume("b", 1), members, "job", 4),
            std::nullopt);
  // The same node again (a retried Resume) keeps its rank.
  EXPECT_EQ(resumption.Refusal(Resume("a", 0), members, "job", 4),
            std::nullopt);
  auto why = resumption.Refusal(Resume("b", 1, 4, 8), members, "job", 4);
  ASSERT_TRUE(why.has_value());
  EXPECT_NE(why->find("with 4 nodes and world size 8"), std::string::npos)
      << *why;
  why = resumption.Refusal(Resume("b", 3), members, "job", 4);
  ASSERT_TRUE(why.has_value());
  EXPECT_NE(why->find("node rank 3"), std::string::npos) << *why;
  why = resumption.Refusal(Resume("b", 0), members, "job", 4);
  ASSERT_TRUE(why.has_value());
  EXPECT_NE(why->find("already held by node 'a'"), std::string::npos) << *why;
  v1::JoinRequest no_ranks = Resume("b", 1);
  no_ranks.set_local_world_size(0);
  EXPECT_TRUE(resumption.Refusal(no_ranks, members, "job", 4).has_value());
}

TEST(JobResumptionTest, WholeWhenEveryRankIsBackAndNamesTheMissing) {
  EXPECT_FALSE(JobResumption::Whole(std::vector<std::string>{"a", "", "c"}));
  EXPECT_EQ(JobResumption::MissingRanks({"", "b", "", "d"}), "0, 2");
  EXPECT_TRUE(JobResumption::Whole(std::vector<std::string>{"a", "b", "c"}));
  EXPECT_EQ(JobResumption::MissingRanks({"a", "b"}), "");
}

TEST(JobResumptionTest, MembersMustTileTheWorld) {
  common::FakeClock clock;
  JobResumption resumption(Resume("a", 0).record().assignment(), 6000,
                           clock.Now());
  std::vector<v1::Peer> peers = {JobResumption::PeerOf(Resume("a", 0)),
                                 JobResumption::PeerOf(Resume("b", 1)),
                                 JobResumption::PeerOf(Resume("c", 2))};
  EXPECT_EQ(peers[1].address(), "host-b");
  EXPECT_EQ(peers[2].rank_offset(), 4);
  EXPECT_EQ(resumption.Disagreement(peers, "job", 4), std::nullopt);
  peers[2].set_rank_offset(3);
  auto why = resumption.Disagreement(peers, "job", 4);
  ASSERT_TRUE(why.has_value());
  EXPECT_NE(why->find("node 'c' starts at rank 3, expected 4"),
            std::string::npos)
      << *why;
  peers[2].set_rank_offset(4);
  peers[2].set_local_world_size(1);
  why = resumption.Disagreement(peers, "job", 4);
  ASSERT_TRUE(why.has_value());
  EXPECT_NE(why->find("hold 5 ranks, not world size 6"), std::string::npos)
      << *why;
}

}  // namespace
}  // namespace ddprun::rendezvous
