#include "tests/e2e/summary_json.h"

#include <dirent.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <cstdlib>
#include <regex>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/time.h"
#include "common/proc_stat.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/wait_for.h"

namespace ddprun::testing {

std::vector<int64_t> SummaryList(const std::string& json,
                                 const std::string& field) {
  std::smatch m;
  std::regex re("\"" + field + "\": \\[([^\\]]*)\\]");
  std::vector<int64_t> out;
  if (!std::regex_search(json, m, re)) return out;
  for (absl::string_view part :
       absl::StrSplit(m[1].str(), ',', absl::SkipWhitespace())) {
    int64_t v = 0;
    if (absl::SimpleAtoi(absl::StripAsciiWhitespace(part), &v)) {
      out.push_back(v);
    }
  }
  return out;
}

std::optional<double> SummaryNumber(const std::string& json,
                                    const std::string& field) {
  std::string quoted = "\"" + field + "\"";
  size_t at = json.find(quoted);
  if (at == std::string::npos) return std::nullopt;
  size_t colon = json.find(':', at + quoted.size());
  if (colon == std::string::npos) return std::nullopt;
  const char* begin = json.c_str() + colon + 1;
  char* end = nullptr;
  double value = std::strtod(begin, &end);
  if (end == begin) return std::nullopt;
  return value;
}

std::string ExpectTrainedSummary(const std::string& path, int world_size,
                                 double min_accuracy) {
  std::string summary = ReadFileOrEmpty(path);
  EXPECT_FALSE(summary.empty()) << "rank 0 wrote no --summary-json";
  if (summary.empty()) return summary;
  EXPECT_EQ(SummaryNumber(summary, "world_size"), world_size) << summary;
  std::optional<double> accuracy = SummaryNumber(summary, "test_accuracy");
  EXPECT_TRUE(accuracy.has_value()) << summary;
  EXPECT_GE(accuracy.value_or(0), min_accuracy) << summary;
  return summary;
}

namespace {

// The state letter of /proc/<pid>/stat ('T' stopped, 'Z' zombie); 0 when
// the process is gone.
char ProcessState(pid_t pid) {
  const std::vector<std::string> fields = common::ReadProcStatFields(pid);
  return fields.empty() || fields[0].empty() ? 0 : fields[0][0];
}

}  // namespace

bool FreezeProcesses(const std::vector<pid_t>& pids) {
  for (pid_t pid : pids) kill(pid, SIGSTOP);
  return WaitFor(
      [&] {
        for (pid_t pid : pids) {
          char state = ProcessState(pid);
          if (state != 0 && state != 'T' && state != 't' && state != 'Z') {
            return false;
          }
        }
        return true;
      },
      absl::Seconds(30));
}

void ThawProcesses(const std::vector<pid_t>& pids) {
  for (pid_t pid : pids) kill(pid, SIGCONT);
}

std::optional<int64_t> NewestCheckpointStep(const std::string& dir) {
  std::optional<int64_t> newest;
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return newest;
  while (struct dirent* entry = readdir(d)) {
    absl::string_view name = entry->d_name;
    int64_t step = 0;
    if (absl::ConsumePrefix(&name, "ckpt-") &&
        absl::ConsumeSuffix(&name, ".pt") && absl::SimpleAtoi(name, &step) &&
        (!newest.has_value() || step > *newest)) {
      newest = step;
    }
  }
  closedir(d);
  return newest;
}

void ExpectResumedFrom(const std::string& path, int64_t step) {
  std::string summary = ReadFileOrEmpty(path);
  ASSERT_FALSE(summary.empty()) << "rank 0 wrote no --summary-json";
  EXPECT_GT(step, 0);
  EXPECT_EQ(SummaryNumber(summary, "resumed_from_step"),
            static_cast<double>(step))
      << "the job did not resume from its checkpoint of step " << step << ": "
      << summary;
}

}  // namespace ddprun::testing
