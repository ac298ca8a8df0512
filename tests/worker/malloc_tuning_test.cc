// libddp's malloc thresholds (worker/malloc_tuning.h): when they are chosen,
// and that a freed step-sized buffer then stays mapped, read from glibc's own
// figures (mallinfo2), not from what the code says it set.
#include "worker/malloc_tuning.h"

#include <malloc.h>

#include <cstdlib>
#include <cstring>
#include <map>
#include <string>

#include "gtest/gtest.h"

namespace ddprun::worker {
namespace {

std::optional<MallocTuning> Choose(
    const std::map<std::string, std::string>& env, std::string* why_not) {
  return ChooseMallocTuning(
      [&](const char* name) -> const char* {
        auto it = env.find(name);
        return it == env.end() ? nullptr : it->second.c_str();
      },
      why_not);
}

TEST(MallocTuningTest, ChosenUnlessTheEnvironmentTunesMallocItself) {
  std::string why_not;
  std::optional<MallocTuning> tuning = Choose({}, &why_not);
  ASSERT_TRUE(tuning.has_value());
  EXPECT_EQ(tuning->mmap_threshold, size_t{32} << 20);
  EXPECT_EQ(tuning->trim_threshold, size_t{1} << 30);
  // Other tunables and empty variables change nothing.
  EXPECT_TRUE(
      Choose({{"GLIBC_TUNABLES", "glibc.pthread.rseq=0"}, {"LD_PRELOAD", ""}},
             &why_not)
          .has_value());

  const std::map<std::string, std::string> own[] = {
      {{"GLIBC_TUNABLES", "glibc.malloc.trim_threshold=1"}},
      {{"MALLOC_TRIM_THRESHOLD_", "1000"}},
      {{"MALLOC_MMAP_THRESHOLD_", "1000"}},
      {{"LD_PRELOAD", "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"}},
  };
  for (const auto& env : own) {
    why_not.clear();
    EXPECT_FALSE(Choose(env, &why_not).has_value()) << env.begin()->first;
    EXPECT_NE(why_not.find(env.begin()->first), std::string::npos) << why_not;
  }
}

#ifdef __GLIBC__
// An 8 MiB buffer (above glibc's default 128 KiB mmap threshold) comes from
// the heap, and a freed 20 MiB one at the heap's top is kept, not trimmed:
// the next step reuses the pages instead of faulting them in again.
TEST(MallocTuningTest, FreedStepBuffersStayMapped) {
  // (What the decision reads; mallopt overrides what glibc read at start.)
  unsetenv("LD_PRELOAD");
  unsetenv("GLIBC_TUNABLES");
  ASSERT_TRUE(TuneMallocForTraining());
  EXPECT_TRUE(TuneMallocForTraining());  // once; the same answer

  const size_t mapped_before = mallinfo2().hblkhd;
  void* eight = malloc(size_t{8} << 20);
  ASSERT_NE(eight, nullptr);
  memset(eight, 1, size_t{8} << 20);
  EXPECT_EQ(mallinfo2().hblkhd, mapped_before)
      << "an 8 MiB block was mapped on its own";
  free(eight);

  void* twenty = malloc(size_t{20} << 20);
  ASSERT_NE(twenty, nullptr);
  memset(twenty, 1, size_t{20} << 20);
  const size_t heap_in_use = mallinfo2().arena;
  free(twenty);
  EXPECT_EQ(mallinfo2().arena, heap_in_use)
      << "the freed 20 MiB went back to the kernel";
}
#endif

}  // namespace
}  // namespace ddprun::worker
