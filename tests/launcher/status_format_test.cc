// `ddprun status`'s text: ranks with their figures, stragglers, and the
// event log as text and as JSON lines.
#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "launcher/cli/status_command.h"

namespace ddprun::launcher {
namespace {

v1::StatusResponse AJob() {
  v1::StatusResponse response;
  v1::JobStatus* job = response.add_jobs();
  job->set_run_id("job \"x\"");
  job->set_state(v1::JOB_STATE_RUNNING);
  v1::NodeStatus* node = job->add_nodes();
  node->set_node_id("host:1");
  node->set_node_rank(0);
  node->set_rank_offset(4);
  node->set_local_world_size(1);
  v1::RankFigures* r = node->add_ranks();
  r->set_local_rank(0);
  r->set_phase("step");
  r->set_steps(120);
  r->set_steps_per_s(25);
  r->set_samples(50);
  r->set_compute_mean_s(0.0305);
  r->set_compute_p99_s(0.12);
  v1::Straggler* s = job->add_stragglers();
  s->set_rank(4);
  s->set_node_id("host:1");
  s->set_compute_s(0.0305);
  s->set_job_median_s(0.0150);
  s->set_ratio(2.03);
  v1::JobEvent* e = job->add_events();
  e->set_time_unix_ms(1796428800000);  // 2026-12-05T00:00:00Z
  e->set_kind("straggler");
  e->set_round(3);
  e->set_rank(4);
  e->set_message("rank 4 is a straggler");
  return response;
}

TEST(StatusFormatTest, ShowsRanksWithTheirFiguresAndTheStragglers) {
  const std::string text = FormatStatus(AJob());
  EXPECT_TRUE(absl::StrContains(text, "COMPUTE_MS")) << text;
  // Global rank 4 (offset 4 + local 0), its phase, steps, rate, figures.
  bool found = false;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    std::vector<absl::string_view> words =
        absl::StrSplit(line, ' ', absl::SkipEmpty());
    if (words.size() == 7 && words[0] == "4") {
      found = true;
      EXPECT_EQ(words[2], "step");
      EXPECT_EQ(words[3], "120");
      EXPECT_EQ(words[4], "25.0");
      EXPECT_EQ(words[5], "30.50");
      EXPECT_EQ(words[6], "120.00");
    }
  }
  EXPECT_TRUE(found) << text;
  EXPECT_TRUE(absl::StrContains(
      text, "straggler: rank 4 (node host:1, local rank 0): 30.50 ms"))
      << text;
  EXPECT_TRUE(absl::StrContains(text, "2.03x the other ranks' median 15.00"))
      << text;
}

TEST(StatusFormatTest, EventsAsTextAndAsJsonLines) {
  const std::string text = FormatEvents(AJob(), /*json=*/false);
  EXPECT_EQ(text,
            "2026-12-05T00:00:00.000Z job \"x\" round 3 straggler         "
            "rank 4 is a straggler\n");
  const std::string json = FormatEvents(AJob(), /*json=*/true);
  ASSERT_EQ(json.back(), '\n');
  EXPECT_EQ(json.find('\n'), json.size() - 1) << "one line an event";
  google::protobuf::Struct parsed;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(json, &parsed).ok())
      << json;
  EXPECT_EQ(parsed.fields().at("run_id").string_value(), "job \"x\"");
  EXPECT_EQ(parsed.fields().at("kind").string_value(), "straggler");
  EXPECT_EQ(parsed.fields().at("rank").number_value(), 4);
  EXPECT_EQ(parsed.fields().at("time_unix_ms").string_value(), "1796428800000");
}

}  // namespace
}  // namespace ddprun::launcher
