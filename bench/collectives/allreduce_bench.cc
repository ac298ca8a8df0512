// Allreduce latency and bandwidth, run under ddprun on one node:
//   ddprun --standalone --nproc-per-node W ddprun-allreduce-bench \
//       --out results.jsonl [--sizes 4096,...] [--reps 5] [--pin]
// For each size (bytes of floats), each repetition times, in an order that
// rotates per repetition:
// - "libddp": what DataParallel does with a bucket by default: the
//   gradient allocated by LibTorch in the node's shared memory (a
//   GradientArena serves its size there, as it does DataParallel's
//   gradients) and summed where it lies
//   (GradientAllreduce::RunInPlace, each element becoming sum / world);
// - "libddp-copied": the same sum on a gradient in private memory
//   (GradientAllreduce::Run: copied into the node's segment, the average
//   written back in the sum's pass), what DataParallel does across nodes
//   and where a rank's gradients are not in shared memory;
// - ProcessGroupGloo's allreduce (C++), and memcpy of the same bytes by
//   rank 0 alone (the others wait).
// Rank 0 appends one JSON line per measurement: {"impl", "world", "bytes",
// "seconds", "median_call_seconds", "slept"} (seconds per operation, the
// mean over the repetition's iterations, and the median call; slept: the
// operations' waits for a peer that went to sleep on the futex, per
// operation).
// --pin: local rank r runs on CPU r mod (CPUs allowed), so that on a loaded
// machine the scheduler cannot put two ranks on one core (where the
// exchange stays in one L2 and looks faster than any quiet machine gives,
// or waits a whole time slice): what a quiet machine does unpinned.
#include <ATen/ATen.h>
#include <sched.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <fstream>
#include <iostream>
#include <limits>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_format.h"
#include "worker/gradient_allreduce.h"
#include "worker/gradient_arena.h"
#include "worker/process_group.h"
#include "worker/worker_env.h"

namespace {

using Clock = std::chrono::steady_clock;

int Fail(const std::string& what) {
  std::cerr << "ddprun-allreduce-bench: " << what << std::endl;
  return 1;
}

int Run(int argc, char** argv) {
  std::string out_path;
  std::vector<int64_t> sizes = {4 << 10, 64 << 10, 400 << 10, 1 << 20,
                                4 << 20, 16 << 20, 64 << 20,  256 << 20};
  int reps = 5;
  // CLI11, as the project's programs: the flags are checked and named in
  // its errors.
  CLI::App app{
      "libddp's gradient allreduce against ProcessGroupGloo and "
      "memcpy; run under ddprun"};
  app.add_option("--out", out_path, "JSON lines, appended by rank 0")
      ->required();
  app.add_option("--reps", reps, "repetitions")
      ->check(CLI::Range(1, std::numeric_limits<int>::max()));
  app.add_option("--sizes", sizes, "bytes of floats, comma-separated")
      ->delimiter(',')
      ->check(CLI::Range(int64_t{4}, std::numeric_limits<int64_t>::max()));
  bool pin = false;
  app.add_flag("--pin", pin, "one CPU per local rank (see above)");
  CLI11_PARSE(app, argc, argv);
  auto env = ddprun::worker::ReadWorkerEnv();
  if (!env.ok()) return Fail(env.status().ToString());
  if (pin) {
    cpu_set_t allowed;
    if (sched_getaffinity(0, sizeof(allowed), &allowed) != 0) {
      return Fail("--pin: cannot read this process's CPUs");
    }
    std::vector<int> cpus;
    for (int c = 0; c < CPU_SETSIZE; ++c) {
      if (CPU_ISSET(c, &allowed)) cpus.push_back(c);
    }
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(cpus[env->local_rank % cpus.size()], &one);
    if (sched_setaffinity(0, sizeof(one), &one) != 0) {
      return Fail("--pin: cannot pin to a CPU");
    }
  }
  ddprun::worker::ProcessGroupOptions options;
  options.backend = ddprun::worker::BackendKind::kGloo;
  options.force_collectives = true;
  auto group = ddprun::worker::CreateProcessGroup(*env, options);
  if (!group.ok()) return Fail(group.status().ToString());
  if (!group->direct) {
    return Fail("no gradient allreduce here (run under ddprun, world > 1)");
  }
  const int rank = env->rank;
  const int world = env->world_size;
  // One resident buffer: room for libddp's gradient of every size (placed
  // by the arena).
  int64_t arena_floats = 0;
  std::vector<size_t> arena_sizes;
  for (int64_t bytes : sizes) {
    arena_sizes.push_back(static_cast<size_t>(bytes / 4) * sizeof(float));
    arena_floats += (bytes / 4 + 15) / 16 * 16;
  }
  absl::StatusOr<float*> resident = group->direct->MapResident(arena_floats);
  if (!resident.ok()) return Fail(resident.status().ToString());
  std::ofstream out;
  if (rank == 0) {
    out.open(out_path, std::ios::app);
    if (!out) return Fail("cannot write --out " + out_path);
  }
  auto barrier = [&] { group->collectives->barrier()->wait(); };

  for (int64_t bytes : sizes) {
    const int64_t n = bytes / 4;
    at::Tensor data = at::ones({n}, at::kFloat);
    at::Tensor copy = at::empty({n}, at::kFloat);
    // libddp's gradient, allocated while the arena serves its size, as
    // backward allocates DataParallel's; the arena is uninstalled at once
    // (the block stays), so nothing else lands there.
    at::Tensor shared;
    {
      auto arena = ddprun::worker::GradientArena::Install(
          {*resident, static_cast<size_t>(arena_floats) * 4,
           group->direct->resident_keep_alive(), arena_sizes,
           /*backward_only=*/false});
      if (!arena.ok()) return Fail(arena.status().ToString());
      shared = at::ones({n}, at::kFloat);
      if ((*arena)->stats().served != 1) {
        return Fail("the arena did not place libddp's gradient");
      }
    }
    // ~0.3 s of traffic per measurement at a few GB/s; at least 3.
    const int iterations =
        static_cast<int>(std::clamp<int64_t>((1LL << 30) / bytes, 3, 2000));
    const char* impls[] = {"libddp", "libddp-copied", "ProcessGroupGloo",
                           "memcpy"};
    constexpr int kImpls = 4;
    // DataParallel's average: the same bits on every rank, and the values
    // stay 1 however many calls run.
    const float divisor = static_cast<float>(world);
    for (int rep = 0; rep < reps; ++rep) {
      for (int k = 0; k < kImpls; ++k) {
        const std::string impl = impls[(k + rep) % kImpls];
        std::function<void()> op;
        if (impl == "libddp") {
          op = [&] {
            const ddprun::worker::ShmAllreduce::Part part{
                shared.data_ptr<float>(), n};
            group->direct->RunInPlace(absl::MakeConstSpan(&part, 1), divisor);
          };
        } else if (impl == "libddp-copied") {
          op = [&] {
            const ddprun::worker::ShmAllreduce::Part part{
                data.data_ptr<float>(), n};
            group->direct->Run(absl::MakeConstSpan(&part, 1), divisor);
          };
        } else if (impl == "ProcessGroupGloo") {
          op = [&] {
            std::vector<at::Tensor> tensors = {data};
            group->collectives->allreduce(tensors)->wait();
          };
        } else if (rank == 0) {
          op = [&] {
            std::memcpy(copy.data_ptr<float>(), data.data_ptr<float>(), bytes);
          };
        }
        barrier();
        if (op) {
          op();              // warm: page faults, first touch
          data.fill_(1.0f);  // keep the values finite over many sums
          const int64_t slept = group->direct->shm_stats().waits_slept;
          // Each call timed too: the median beside the mean tells a slow
          // tail (a peer preempted, a wait asleep) from a slow call.
          std::vector<double> each(iterations);
          Clock::time_point start = Clock::now();
          Clock::time_point last = start;
          for (int i = 0; i < iterations; ++i) {
            op();
            const Clock::time_point now = Clock::now();
            each[i] = std::chrono::duration<double>(now - last).count();
            last = now;
          }
          double seconds =
              std::chrono::duration<double>(last - start).count() / iterations;
          std::nth_element(each.begin(), each.begin() + iterations / 2,
                           each.end());
          if (rank == 0) {
            out << absl::StrFormat(
                       "{\"impl\": \"%s\", \"world\": %d, \"bytes\": %d, "
                       "\"seconds\": %.9f, \"median_call_seconds\": %.9f, "
                       "\"slept\": %.4f}",
                       impl, world, bytes, seconds, each[iterations / 2],
                       static_cast<double>(
                           group->direct->shm_stats().waits_slept - slept) /
                           iterations)
                << std::endl;
          }
          data.fill_(1.0f);
        }
      }
    }
  }
  barrier();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return Run(argc, argv);
  } catch (const std::exception& e) {
    return Fail(e.what());
  }
}
