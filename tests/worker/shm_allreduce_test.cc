// ShmAllreduce on its own: local ranks as threads (each with its own file
// descriptor and lock, as processes have), and a forked process for a peer
// that dies. The whole path under ddprun is gradient_allreduce_test.
#include "worker/shm_allreduce.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "tests/testing/temp_dir.h"

namespace ddprun::worker {
namespace {

using ::ddprun::testing::TempDir;

float IntegerValue(int64_t i, int rank) {
  return static_cast<float>((i * 5 + rank * 3) % 11) - 5.0f;
}
float NoisyValue(int64_t i, int rank) {
  return static_cast<float>(((i + 1) * 2654435761u + rank * 40503u) % 100003) /
         7919.0f;
}

ShmAllreduceOptions Options(const TempDir& dir, int local_rank,
                            int local_size) {
  ShmAllreduceOptions o;
  o.dir = dir.path();
  o.name = "segment";
  o.local_rank = local_rank;
  o.local_size = local_size;
  o.timeout = std::chrono::seconds(20);
  o.slice_floats = 64;      // small, so that buffers span many slices
  o.whole_call_floats = 0;  // slices at 2 ranks too (see WholeCalls below)
  return o;
}

// Runs `body` as every local rank, each on its own thread, after local
// rank 0 created the segment and the others attached.
// Runs `body` on `size` threads as local ranks of one segment, each with
// Options() changed by `tune`.
void AsTunedLocalRanks(const TempDir& dir, int size,
                       const std::function<void(ShmAllreduceOptions&)>& tune,
                       const std::function<void(int, ShmAllreduce&)>& body) {
  absl::Notification created;
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      ShmAllreduceOptions o = Options(dir, r, size);
      tune(o);
      absl::StatusOr<std::unique_ptr<ShmAllreduce>> shm;
      if (r == 0) {
        shm = ShmAllreduce::Create(o);
        created.Notify();
      } else {
        created.WaitForNotification();
        shm = ShmAllreduce::Attach(o);
      }
      ASSERT_TRUE(shm.ok()) << shm.status();
      body(r, **shm);
    });
  }
  for (auto& t : threads) t.join();
}

void AsLocalRanks(const TempDir& dir, int size,
                  const std::function<void(int, ShmAllreduce&)>& body,
                  int64_t slice_floats = 64, int64_t whole_call_floats = 0) {
  AsTunedLocalRanks(
      dir, size,
      [&](ShmAllreduceOptions& o) {
        o.slice_floats = slice_floats;
        o.whole_call_floats = whole_call_floats;
      },
      body);
}

TEST(ShmAllreduceTest, EveryCountAndLocalSizeSumsExactlyWithTheSameBits) {
  // 1 float, less than a chunk, chunk edges, several slices with a ragged end.
  const std::vector<int64_t> counts = {1, 15, 17, 63, 64, 65, 1000, 64 * 7 + 5};
  for (int size : {1, 2, 3, 4, 5, 8}) {
    SCOPED_TRACE(size);
    TempDir dir;
    std::vector<std::vector<std::vector<float>>> noisy(size);
    AsLocalRanks(dir, size, [&](int r, ShmAllreduce& shm) {
      for (int64_t n : counts) {
        std::vector<float> data(n);
        for (int64_t i = 0; i < n; ++i) data[i] = IntegerValue(i, r);
        {
          const absl::Status s = shm.Allreduce(data.data(), n);
          ASSERT_TRUE(s.ok()) << "rank " << r << " count " << n << ": " << s;
        }
        for (int64_t i = 0; i < n; ++i) {
          float sum = 0;
          for (int k = 0; k < size; ++k) sum += IntegerValue(i, k);
          ASSERT_EQ(data[i], sum)
              << "rank " << r << " count " << n << " i " << i;
        }
        for (int64_t i = 0; i < n; ++i) data[i] = NoisyValue(i, r);
        {
          const absl::Status s = shm.Allreduce(data.data(), n);
          ASSERT_TRUE(s.ok()) << "rank " << r << " count " << n << ": " << s;
        }
        noisy[r].push_back(data);
      }
      // Slices of 64 floats are short: every rank sums every input.
      if (size > 1) {
        EXPECT_GT(shm.stats().each_sums_all_slices, 0);
        EXPECT_EQ(shm.stats().scattered_slices, 0);
      }
    });
    for (int r = 1; r < size; ++r) {
      ASSERT_EQ(noisy[r].size(), counts.size());
      for (size_t c = 0; c < counts.size(); ++c) {
        EXPECT_EQ(std::memcmp(noisy[r][c].data(), noisy[0][c].data(),
                              counts[c] * sizeof(float)),
                  0)
            << "rank " << r << " differs from rank 0 at count " << counts[c];
      }
    }
    // The last rank to map it removed its name.
    EXPECT_FALSE(std::filesystem::exists(dir.File("segment")));
  }
}

TEST(ShmAllreduceTest, LongSlicesOfThreeOrMoreRanksAreReducedScattered) {
  // Above 16 K floats per slice and 2 ranks, each rank reduces one chunk
  // and gathers the others (reduce-scatter + all-gather); at 2 ranks every
  // rank still sums all.
  const int64_t slice = 32 * 1024;
  const std::vector<int64_t> counts = {16 * 1024 + 1, slice, 2 * slice + 7};
  for (int size : {2, 3, 4}) {
    SCOPED_TRACE(size);
    TempDir dir;
    std::vector<std::vector<float>> noisy(size);
    AsLocalRanks(
        dir, size,
        [&](int r, ShmAllreduce& shm) {
          for (int64_t n : counts) {
            std::vector<float> data(n);
            for (int64_t i = 0; i < n; ++i) data[i] = IntegerValue(i, r);
            {
              const absl::Status s = shm.Allreduce(data.data(), n);
              ASSERT_TRUE(s.ok())
                  << "rank " << r << " count " << n << ": " << s;
            }
            for (int64_t i = 0; i < n; ++i) {
              float sum = 0;
              for (int k = 0; k < size; ++k) sum += IntegerValue(i, k);
              ASSERT_EQ(data[i], sum) << "rank " << r << " count " << n;
            }
          }
          const int64_t n = counts.back();
          noisy[r].resize(n);
          for (int64_t i = 0; i < n; ++i) noisy[r][i] = NoisyValue(i, r);
          ASSERT_TRUE(shm.Allreduce(noisy[r].data(), n).ok());
          if (size == 2) {
            EXPECT_EQ(shm.stats().scattered_slices, 0);
          } else {
            // 1 + 1 + 2 long slices, and 2 of the last sum; their 7-float
            // tails are summed by all.
            EXPECT_EQ(shm.stats().scattered_slices, 6);
          }
        },
        slice);
    for (int r = 1; r < size; ++r) {
      EXPECT_EQ(std::memcmp(noisy[r].data(), noisy[0].data(),
                            noisy[0].size() * sizeof(float)),
                0)
          << "rank " << r << " differs from rank 0";
    }
  }
}

TEST(ShmAllreduceTest, AtTwoRanksACallOfUpToWholeCallFloatsIsOneSlice) {
  // One wait per call instead of one per slice: calls of up to 1000 floats
  // (here) go through in one slice, in parts cut differently on each rank,
  // summed and divided exactly, with the same bits everywhere; longer calls
  // still go in slices of 64.
  const int64_t whole = 1000;
  const std::vector<int64_t> counts = {1, 65, 999, 1000, 1001, 3000};
  TempDir dir;
  std::vector<std::vector<float>> noisy(2);
  AsLocalRanks(
      dir, 2,
      [&](int r, ShmAllreduce& shm) {
        int64_t whole_calls = 0, slices = 0, pipelined = 0;
        for (int64_t n : counts) {
          std::vector<float> data(n);
          for (int64_t i = 0; i < n; ++i) data[i] = IntegerValue(i, r);
          const int64_t cut = std::min<int64_t>(n, 7 + 300 * r);
          std::vector<ShmAllreduce::Part> parts = {
              {data.data(), cut},
              {data.data() + cut, 0},
              {data.data() + cut, n - cut}};
          ASSERT_TRUE(shm.Allreduce(parts, 2.0f).ok());
          for (int64_t i = 0; i < n; ++i) {
            ASSERT_EQ(data[i], (IntegerValue(i, 0) + IntegerValue(i, 1)) / 2.0f)
                << "rank " << r << " count " << n << " i " << i;
          }
          whole_calls += n <= whole ? 1 : 0;
          slices += n <= whole ? 1 : (n + 63) / 64;
          // Longer calls copy each slice in one slice ahead of its sum.
          pipelined += n <= whole ? 0 : (n + 63) / 64;
          EXPECT_EQ(shm.stats().whole_calls, whole_calls) << "count " << n;
          EXPECT_EQ(shm.stats().each_sums_all_slices, slices) << "count " << n;
          EXPECT_EQ(shm.stats().pipelined_slices, pipelined) << "count " << n;
        }
        noisy[r].resize(whole);
        for (int64_t i = 0; i < whole; ++i) noisy[r][i] = NoisyValue(i, r);
        ASSERT_TRUE(shm.Allreduce(noisy[r].data(), whole).ok());
        EXPECT_EQ(shm.stats().whole_calls, whole_calls + 1);
        EXPECT_EQ(shm.stats().scattered_slices, 0);
      },
      /*slice_floats=*/64, whole);
  EXPECT_EQ(
      std::memcmp(noisy[0].data(), noisy[1].data(), whole * sizeof(float)), 0);
  for (int64_t i = 0; i < whole; ++i) {
    ASSERT_EQ(noisy[0][i], NoisyValue(i, 0) + NoisyValue(i, 1)) << i;
  }
}

TEST(ShmAllreduceTest, PipelinedSlicesGiveTheBitsOfLockstepOnes) {
  // At 2 ranks a call of several slices copies slice s+1 in before it sums
  // slice s; off (ShmAllreduceOptions::pipeline), each slice is copied in
  // just before its sum. Both give the same bits, for parts cut
  // differently on each rank and a ragged last slice.
  const int64_t n = 64 * 9 + 5;
  std::vector<std::vector<float>> results;
  for (bool pipeline : {true, false}) {
    SCOPED_TRACE(pipeline);
    TempDir dir;
    std::vector<std::vector<float>> noisy(2, std::vector<float>(n));
    AsTunedLocalRanks(
        dir, 2, [&](ShmAllreduceOptions& o) { o.pipeline = pipeline; },
        [&](int r, ShmAllreduce& shm) {
          for (int64_t i = 0; i < n; ++i) noisy[r][i] = NoisyValue(i, r);
          const int64_t cut = 100 + 77 * r;
          std::vector<ShmAllreduce::Part> parts = {
              {noisy[r].data(), cut}, {noisy[r].data() + cut, n - cut}};
          ASSERT_TRUE(shm.Allreduce(parts, 2.0f).ok());
          EXPECT_EQ(shm.stats().each_sums_all_slices, 10);
          EXPECT_EQ(shm.stats().pipelined_slices, pipeline ? 10 : 0);
        });
    EXPECT_EQ(std::memcmp(noisy[0].data(), noisy[1].data(), n * sizeof(float)),
              0);
    results.push_back(noisy[0]);
  }
  EXPECT_EQ(
      std::memcmp(results[0].data(), results[1].data(), n * sizeof(float)), 0);
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(results[0][i], (NoisyValue(i, 0) + NoisyValue(i, 1)) / 2.0f) << i;
  }
}

TEST(ShmAllreduceTest, WholeCallsAreForTwoRanksOnly) {
  // At 3 ranks (where slices let the ranks' reduce-scatter steps overlap)
  // and under a between-nodes step (one Gloo call per slice, of the same
  // size on every node), calls still go in slices.
  for (int size : {2, 3}) {
    for (bool hierarchical : {false, true}) {
      if (size == 2 && !hierarchical) continue;
      SCOPED_TRACE(absl::StrCat(size, hierarchical ? " hierarchical" : ""));
      TempDir dir;
      AsLocalRanks(
          dir, size,
          [&](int r, ShmAllreduce& shm) {
            std::vector<float> data(500, 1.0f);
            ShmAllreduce::BetweenNodes between;
            if (hierarchical) {
              between = [](float*, int64_t) { return absl::OkStatus(); };
            }
            ASSERT_TRUE(shm.Allreduce(data.data(), 500, between).ok());
            for (float v : data) ASSERT_EQ(v, static_cast<float>(size));
            EXPECT_EQ(shm.stats().whole_calls, 0);
            EXPECT_EQ(
                shm.stats().each_sums_all_slices + shm.stats().scattered_slices,
                8);  // 500 floats in slices of 64
          },
          /*slice_floats=*/64, /*whole_call_floats=*/1000);
    }
  }
}

TEST(ShmAllreduceTest, PartsWithDifferentBoundariesAreSummedAndDividedInPlace) {
  // A model's gradients, reduced where they lie: each rank cuts the same
  // 300 floats differently (an empty part too); every element becomes
  // sum / divisor, with the bits of summing in local-rank order, then
  // dividing. Slices of 64 cross the parts' boundaries; both schedules
  // (every rank sums all; reduce-scatter under a between-nodes step) run.
  const int64_t total = 300;
  for (int size : {2, 3}) {
    for (bool hierarchical : {false, true}) {
      SCOPED_TRACE(absl::StrCat(size, hierarchical ? " hierarchical" : ""));
      TempDir dir;
      AsLocalRanks(dir, size, [&](int r, ShmAllreduce& shm) {
        std::vector<float> data(total);
        for (int64_t i = 0; i < total; ++i) data[i] = NoisyValue(i, r);
        const std::vector<int64_t> cuts = {0,  7 + 13 * r, 64,
                                           64, 200 - r,    total};
        std::vector<ShmAllreduce::Part> parts;
        for (size_t k = 0; k + 1 < cuts.size(); ++k) {
          parts.push_back({data.data() + cuts[k], cuts[k + 1] - cuts[k]});
        }
        ShmAllreduce::BetweenNodes between;
        if (hierarchical) {
          between = [](float*, int64_t) { return absl::OkStatus(); };
        }
        const float divisor = static_cast<float>(size);
        ASSERT_TRUE(shm.Allreduce(parts, divisor, between).ok());
        for (int64_t i = 0; i < total; ++i) {
          float sum = NoisyValue(i, 0);
          for (int k = 1; k < size; ++k) sum += NoisyValue(i, k);
          ASSERT_EQ(data[i], sum / divisor) << "rank " << r << " i " << i;
        }
        if (hierarchical) {
          EXPECT_GT(shm.stats().scattered_slices, 0);
        } else {
          EXPECT_GT(shm.stats().each_sums_all_slices, 0);
        }
      });
    }
  }
}

TEST(ShmAllreduceTest, EveryDivisorGivesTheBitsOfSumThenDivide) {
  // Powers of two multiply by their reciprocal (exact), the others divide:
  // either way each element is bit for bit sum / divisor, subnormal
  // results, infinities and NaNs included, at both vector and scalar
  // positions (1000 floats: 31 blocks of 32, then a tail of 8).
  const int64_t n = 1000;
  auto value = [](int64_t i, int r) {
    switch (i % 7) {
      case 0:
        return 1e-38f * static_cast<float>(r + 1);  // subnormal / 2^k
      case 1:
        return -3e38f;  // overflows to -inf
      case 2:
        return i == 2 && r == 1 ? std::nanf("") : 1.0f;
      default:
        return NoisyValue(i, r);
    }
  };
  for (float divisor : {2.0f, 4.0f, 1024.0f, 0.5f, 3.0f, -2.0f, 1.0f}) {
    SCOPED_TRACE(divisor);
    TempDir dir;
    AsLocalRanks(
        dir, 2,
        [&](int r, ShmAllreduce& shm) {
          std::vector<float> data(n);
          for (int64_t i = 0; i < n; ++i) data[i] = value(i, r);
          ShmAllreduce::Part part{data.data(), n};
          ASSERT_TRUE(shm.Allreduce({part}, divisor).ok());
          for (int64_t i = 0; i < n; ++i) {
            const float expected = (value(i, 0) + value(i, 1)) / divisor;
            ASSERT_EQ(std::memcmp(&data[i], &expected, sizeof(float)), 0)
                << "rank " << r << " i " << i << ": " << data[i] << " against "
                << expected;
          }
          EXPECT_EQ(shm.stats().whole_calls, 1);
        },
        /*slice_floats=*/64, /*whole_call_floats=*/n);
  }
}

TEST(ShmAllreduceTest, LocalRankZeroBringsEachSliceFromTheOtherNodes) {
  TempDir dir;
  AsLocalRanks(dir, 3, [](int r, ShmAllreduce& shm) {
    // "Another node" contributes 100 per element; only local rank 0 calls it.
    int calls = 0;
    ShmAllreduce::BetweenNodes between = [&](float* data, int64_t n) {
      ++calls;
      for (int64_t i = 0; i < n; ++i) data[i] += 100;
      return absl::OkStatus();
    };
    std::vector<float> data(200, static_cast<float>(r + 1));
    ASSERT_TRUE(shm.Allreduce(data.data(), 200, between).ok());
    for (float v : data) ASSERT_EQ(v, 106.0f);
    EXPECT_EQ(calls, r == 0 ? 4 : 0);  // 200 floats in slices of 64
  });
}

TEST(ShmAllreduceTest, AFailureBetweenNodesReachesEveryLocalRank) {
  TempDir dir;
  AsLocalRanks(dir, 2, [](int r, ShmAllreduce& shm) {
    ShmAllreduce::BetweenNodes between = [](float*, int64_t) {
      return absl::UnavailableError("the other node's leader is gone");
    };
    std::vector<float> data(10, 1.0f);
    absl::Status status = shm.Allreduce(data.data(), 10, between);
    EXPECT_FALSE(status.ok());
    EXPECT_TRUE(
        absl::StrContains(status.message(), "the other node's leader is gone"))
        << "rank " << r << ": " << status;
    // Sticky: later calls fail at once.
    EXPECT_FALSE(shm.Allreduce(data.data(), 10, between).ok());
  });
}

// Where rank r places part p of a call in its resident buffer: each rank
// its own order and gaps, so that no two ranks share an offset.
std::vector<int64_t> PartOffsets(const std::vector<int64_t>& lengths, int r) {
  std::vector<int64_t> offsets(lengths.size());
  int64_t at = 3 * r + 1;
  for (size_t k = 0; k < lengths.size(); ++k) {
    const size_t p = (k + r) % lengths.size();
    offsets[p] = at;
    at += lengths[p] + 5 + r;
  }
  return offsets;
}

// Writes IntegerValue(element, r) into `parts`, the elements numbered
// across the parts in order.
void FillParts(const std::vector<ShmAllreduce::Part>& parts, int r) {
  int64_t at = 0;
  for (const ShmAllreduce::Part& part : parts) {
    for (int64_t i = 0; i < part.count; ++i)
      part.data[i] = IntegerValue(at + i, r);
    at += part.count;
  }
}

// Checks that `parts` hold the exact sum of FillParts over `size` ranks.
void ExpectSummedParts(const std::vector<ShmAllreduce::Part>& parts, int size,
                       int r) {
  int64_t at = 0;
  for (const ShmAllreduce::Part& part : parts) {
    for (int64_t i = 0; i < part.count; ++i) {
      float sum = 0;
      for (int k = 0; k < size; ++k) sum += IntegerValue(at + i, k);
      ASSERT_EQ(part.data[i], sum) << "rank " << r << " element " << at + i;
    }
    at += part.count;
  }
}

TEST(ShmAllreduceTest, PartsInResidentBuffersAreSummedWhereTheyLie) {
  // DataParallel's shared gradients: every rank's parts lie in its own
  // resident buffer, each at a place of its own, and are summed there (no
  // copy in or out). 1 to 8 ranks, one part or several with ragged sizes:
  // exact integer sums, the bits of the copied path on every rank, nothing
  // outside the parts touched, and only the in-place counter moved.
  const std::vector<std::vector<int64_t>> layouts = {
      {1}, {15}, {64 * 9 + 5}, {3, 64, 1, 200}, {100, 0, 17, 64 * 4}};
  for (int size : {2, 3, 4, 5, 8}) {
    SCOPED_TRACE(size);
    TempDir dir;
    std::vector<std::vector<std::vector<float>>> noisy(size), copied(size);
    AsLocalRanks(dir, size, [&](int r, ShmAllreduce& shm) {
      const int64_t room = 4096;
      absl::StatusOr<float*> mapped = shm.MapResident(room);
      ASSERT_TRUE(mapped.ok()) << mapped.status();
      float* buffer = *mapped;
      for (const std::vector<int64_t>& lengths : layouts) {
        const std::vector<int64_t> offsets = PartOffsets(lengths, r);
        std::vector<ShmAllreduce::Part> parts;
        for (size_t p = 0; p < lengths.size(); ++p) {
          parts.push_back(
              {lengths[p] == 0 ? nullptr : buffer + offsets[p], lengths[p]});
        }
        std::fill(buffer, buffer + room, -99.0f);
        FillParts(parts, r);
        ASSERT_TRUE(shm.AllreduceInPlace(parts, 1.0f).ok());
        ASSERT_NO_FATAL_FAILURE(ExpectSummedParts(parts, size, r));
        for (const ShmAllreduce::Part& part : parts) {
          std::fill(part.data, part.data + part.count, -99.0f);
        }
        for (int64_t i = 0; i < room; ++i) ASSERT_EQ(buffer[i], -99.0f) << i;
        // Noisy values divided by the world: the bits of the copied path.
        std::vector<float> mine, reference;
        int64_t at = 0;  // the element's index in the call
        for (const ShmAllreduce::Part& part : parts) {
          for (int64_t i = 0; i < part.count; ++i) {
            part.data[i] = NoisyValue(at + i, r);
            reference.push_back(part.data[i]);
          }
          at += part.count;
        }
        ASSERT_TRUE(shm.AllreduceInPlace(parts, static_cast<float>(size)).ok());
        for (const ShmAllreduce::Part& part : parts) {
          mine.insert(mine.end(), part.data, part.data + part.count);
        }
        ASSERT_TRUE(shm.Allreduce({{reference.data(),
                                    static_cast<int64_t>(reference.size())}},
                                  static_cast<float>(size))
                        .ok());
        noisy[r].push_back(mine);
        copied[r].push_back(reference);
      }
      EXPECT_EQ(shm.stats().in_place_calls,
                2 * static_cast<int64_t>(layouts.size()));
      EXPECT_EQ(shm.stats().in_place_fallbacks, 0);
    });
    for (int r = 0; r < size; ++r) {
      ASSERT_EQ(noisy[r].size(), layouts.size()) << r;
      for (size_t c = 0; c < layouts.size(); ++c) {
        EXPECT_EQ(noisy[r][c], noisy[0][c]) << "rank " << r << " layout " << c;
        EXPECT_EQ(noisy[r][c], copied[r][c])
            << "rank " << r << " layout " << c
            << ": the in-place sum differs from the copied one";
      }
    }
  }
}

TEST(ShmAllreduceTest, InPlaceCallsCopyWhenAnyRanksPartsAreNotResident) {
  // Every rank decides the same from the tables: when one rank's part lies
  // elsewhere, or the ranks cut the call into different parts, or there
  // are more parts than a table holds, every rank copies (counted), with
  // the right sums, and the next call is in place again.
  TempDir dir;
  const int size = 3;
  AsLocalRanks(dir, size, [&](int r, ShmAllreduce& shm) {
    absl::StatusOr<float*> mapped = shm.MapResident(4096);
    ASSERT_TRUE(mapped.ok()) << mapped.status();
    float* buffer = *mapped;
    std::vector<float> outside(100);
    auto fill = [r](const std::vector<ShmAllreduce::Part>& parts) {
      FillParts(parts, r);
    };
    auto expect_sums = [r](const std::vector<ShmAllreduce::Part>& parts) {
      ExpectSummedParts(parts, size, r);
    };
    // Rank 1's part is private memory.
    std::vector<ShmAllreduce::Part> parts = {
        {r == 1 ? outside.data() : buffer + 8 * r, 100}};
    fill(parts);
    ASSERT_TRUE(shm.AllreduceInPlace(parts, 1.0f).ok());
    expect_sums(parts);
    EXPECT_EQ(shm.stats().in_place_fallbacks, 1);
    // Different boundaries: rank 0 cuts 100 floats as 40 + 60.
    parts = r == 0 ? std::vector<ShmAllreduce::Part>{{buffer, 40},
                                                     {buffer + 50, 60}}
                   : std::vector<ShmAllreduce::Part>{{buffer + 16, 100}};
    fill(parts);
    ASSERT_TRUE(shm.AllreduceInPlace(parts, 1.0f).ok());
    expect_sums(parts);
    EXPECT_EQ(shm.stats().in_place_fallbacks, 2);
    // More parts than a table holds.
    parts.clear();
    for (int p = 0; p <= ShmAllreduce::kMaxTableParts; ++p) {
      parts.push_back({buffer + 2 * p, 1});
    }
    fill(parts);
    ASSERT_TRUE(shm.AllreduceInPlace(parts, 1.0f).ok());
    expect_sums(parts);
    EXPECT_EQ(shm.stats().in_place_fallbacks, 3);
    EXPECT_EQ(shm.stats().in_place_calls, 0);
    // All resident again: in place, after the copies' slices.
    parts = {{buffer + 32 * r, 100}};
    fill(parts);
    ASSERT_TRUE(shm.AllreduceInPlace(parts, 1.0f).ok());
    expect_sums(parts);
    EXPECT_EQ(shm.stats().in_place_calls, 1);
    EXPECT_EQ(shm.stats().in_place_fallbacks, 3);
  });
}

TEST(ShmAllreduceTest,
     AResidentBufferOneRankCannotReserveLeavesTheGroupUsable) {
  // Local rank 1 cannot create its resident buffer's file (a directory
  // holds its name; a full tmpfs fails the same way): every rank gets an
  // error naming it instead of a failed group, copied and in-place calls
  // still sum (copying), and a second MapResident is refused.
  TempDir dir;
  std::filesystem::create_directory(dir.File("segment.r1"));
  AsLocalRanks(dir, 2, [&](int r, ShmAllreduce& shm) {
    absl::StatusOr<float*> mapped = shm.MapResident(1000);
    ASSERT_FALSE(mapped.ok());
    if (r == 0) {
      EXPECT_EQ(mapped.status().code(), absl::StatusCode::kResourceExhausted)
          << mapped.status();
      EXPECT_TRUE(absl::StrContains(mapped.status().message(), "local rank 1"))
          << mapped.status();
    } else {
      EXPECT_TRUE(absl::StrContains(mapped.status().message(), "segment.r1"))
          << mapped.status();
    }
    std::vector<float> data(100, 1.0f);
    ASSERT_TRUE(shm.Allreduce(data.data(), 100).ok());
    ASSERT_TRUE(shm.AllreduceInPlace({{data.data(), 100}}, 1.0f).ok());
    EXPECT_EQ(data[0], 4.0f);
    EXPECT_EQ(shm.stats().in_place_calls, 0);
    EXPECT_EQ(shm.MapResident(1000).status().code(),
              absl::StatusCode::kFailedPrecondition);
  });
  std::filesystem::remove(dir.File("segment.r1"));
  for (const auto& entry : std::filesystem::directory_iterator(dir.path())) {
    ADD_FAILURE() << "left behind: " << entry.path();
  }
}

// Local rank 1 maps its resident buffer of 1000 floats and dies (as with
// kill -9) before the sum; then `call` runs on local rank 0 with its own
// buffer, filled with ones. It must name rank 1 long before the timeout,
// and no file may be left.
void ExpectADeadPeerNamedIn(
    const std::function<absl::Status(ShmAllreduce&, float*)>& call) {
  TempDir dir;
  ShmAllreduceOptions o = Options(dir, 0, 2);
  o.timeout = std::chrono::seconds(60);
  auto shm = ShmAllreduce::Create(o);
  ASSERT_TRUE(shm.ok()) << shm.status();
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    auto peer = ShmAllreduce::Attach(Options(dir, 1, 2));
    if (!peer.ok() || !(*peer)->MapResident(1000).ok()) _exit(1);
    _exit(0);
  }
  absl::StatusOr<float*> mapped = (*shm)->MapResident(1000);
  ASSERT_TRUE(mapped.ok()) << mapped.status();
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  std::fill(*mapped, *mapped + 1000, 1.0f);
  absl::Time start = absl::Now();
  absl::Status result = call(**shm, *mapped);
  EXPECT_EQ(result.code(), absl::StatusCode::kUnavailable) << result;
  EXPECT_TRUE(absl::StrContains(result.message(), "local rank 1")) << result;
  EXPECT_TRUE(absl::StrContains(result.message(), "died")) << result;
  EXPECT_LT(absl::Now() - start, absl::Seconds(30));
  for (const auto& entry : std::filesystem::directory_iterator(dir.path())) {
    ADD_FAILURE() << "left behind: " << entry.path();
  }
}

TEST(ShmAllreduceTest, ADeadPeerEndsAnInPlaceCall) {
  ExpectADeadPeerNamedIn([](ShmAllreduce& shm, float* buffer) {
    return shm.AllreduceInPlace({{buffer, 1000}}, 2.0f);
  });
}

TEST(ShmAllreduceTest, ARankThatNeverComesIsATimeoutThatNamesIt) {
  TempDir dir;
  ShmAllreduceOptions o = Options(dir, 0, 2);
  o.timeout = std::chrono::milliseconds(300);
  auto shm = ShmAllreduce::Create(o);
  ASSERT_TRUE(shm.ok()) << shm.status();
  std::vector<float> data(10, 1.0f);
  absl::Time start = absl::Now();
  absl::Status status = (*shm)->Allreduce(data.data(), 10);
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
  EXPECT_TRUE(absl::StrContains(status.message(), "local rank 1")) << status;
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
}

TEST(ShmAllreduceTest, ADeadPeerIsNamedLongBeforeTheTimeout) {
  TempDir dir;
  ShmAllreduceOptions o = Options(dir, 0, 2);
  o.timeout = std::chrono::seconds(60);
  auto shm = ShmAllreduce::Create(o);
  ASSERT_TRUE(shm.ok()) << shm.status();
  // Local rank 1 maps the segment and dies without a word (as with kill -9).
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    auto peer = ShmAllreduce::Attach(Options(dir, 1, 2));
    _exit(peer.ok() ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  std::vector<float> data(10, 1.0f);
  absl::Time start = absl::Now();
  absl::Status result = (*shm)->Allreduce(data.data(), 10);
  EXPECT_EQ(result.code(), absl::StatusCode::kUnavailable) << result;
  EXPECT_TRUE(absl::StrContains(result.message(), "local rank 1")) << result;
  EXPECT_TRUE(absl::StrContains(result.message(), "died")) << result;
  EXPECT_LT(absl::Now() - start, absl::Seconds(30));
}

TEST(ShmAllreduceTest, BadOptionsAreClearErrors) {
  TempDir dir;
  ShmAllreduceOptions o = Options(dir, 2, 2);
  auto bad_rank = ShmAllreduce::Create(o);
  ASSERT_FALSE(bad_rank.ok());
  EXPECT_TRUE(
      absl::StrContains(bad_rank.status().message(), "local rank 2 of 2"));
  o = Options(dir, 0, 2);
  o.dir = dir.File("missing");
  auto no_dir = ShmAllreduce::Create(o);
  ASSERT_FALSE(no_dir.ok());
  EXPECT_TRUE(
      absl::StrContains(no_dir.status().message(), dir.File("missing")));
}

}  // namespace
}  // namespace ddprun::worker
