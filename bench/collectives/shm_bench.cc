// ShmAllreduce alone, without ddprun or torch: W forked local ranks (one
// CPU each, CPU r mod the CPUs allowed) sum `--floats` floats through one
// segment `--ops` times; rank 0 prints per-call percentiles. Small and
// deterministic enough to run under callgrind, where timing under load
// says nothing but instruction counts do:
//   ddprun-shm-allreduce-bench --floats 102400 --ops 3000 [--world 2]
//       [--divisor 2] [--dir /dev/shm] [--resident]
// --resident: the buffer lives in the segment (MapResident; what PyTorch
// DDP's gradient_as_bucket_view would keep there, a path libddp measured
// slower and dropped) and is summed where it lies (AllreduceInPlace): no
// copy in or out.
// --flat: a private buffer is copied into a resident one, summed there in
// place and copied back (PyTorch DDP's default bucket, in shared memory).
// --histogram: the per-call times in log2 buckets. Every line also gives
// the mean and how each wait for a peer ended (spinning, spinning long,
// asleep).
// --step: each timed call also includes what a training step writes before
// the sync, as DataParallel's gradients see it: backward's fresh gradient
// (a private buffer written); with --resident also ZeroGrad's zeroing of
// the resident buffer and AccumulateGrad's addition of the fresh gradient
// into it (gradient views), without it the gradient handed over as is.
//   valgrind --tool=callgrind --callgrind-out-file=cg.%p
//       ddprun-shm-allreduce-bench --floats 102400 --ops 500   (one line)
// (callgrind_annotate --inclusive=yes cg.<pid>: SumInto and memcpy are the
// per-call work; WaitFor's inclusive count is spinning, not work.)
#include <sched.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <limits>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_format.h"
#include "worker/shm_allreduce.h"

namespace {

using ::ddprun::worker::ShmAllreduce;
using ::ddprun::worker::ShmAllreduceOptions;

// data += add, vectorised as LibTorch's add_ is (GCC -O2 leaves the plain
// loop scalar).
void AddInto(float* data, const float* add, int64_t n) {
  typedef float Floats8 __attribute__((vector_size(32), aligned(4)));
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    *reinterpret_cast<Floats8*>(data + i) +=
        *reinterpret_cast<const Floats8*>(add + i);
  }
  for (; i < n; ++i) data[i] += add[i];
}

// data[i] = 1, vectorised (as a matrix product's output is written).
void Fill(float* data, int64_t n) {
  typedef float Floats8 __attribute__((vector_size(32), aligned(4)));
  const Floats8 ones = {1, 1, 1, 1, 1, 1, 1, 1};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) *reinterpret_cast<Floats8*>(data + i) = ones;
  for (; i < n; ++i) data[i] = 1.0f;
}

// One local rank: attaches (after rank 0 created the segment), runs the
// calls, and (rank 0) prints the percentiles. Returns the exit status.
int Rank(const ShmAllreduceOptions& options, int64_t floats, int ops,
         float divisor, bool resident, bool step, bool flat, bool histogram,
         bool in_place) {
  cpu_set_t allowed;
  if (sched_getaffinity(0, sizeof(allowed), &allowed) == 0) {
    std::vector<int> cpus;
    for (int c = 0; c < CPU_SETSIZE; ++c) {
      if (CPU_ISSET(c, &allowed)) cpus.push_back(c);
    }
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(cpus[options.local_rank % cpus.size()], &one);
    (void)sched_setaffinity(0, sizeof(one), &one);  // best effort
  }
  absl::StatusOr<std::unique_ptr<ShmAllreduce>> shm;
  if (options.local_rank == 0) {
    shm = ShmAllreduce::Create(options);
  } else {
    // Forked once rank 0's file exists (see Run).
    shm = ShmAllreduce::Attach(options);
  }
  if (!shm.ok()) {
    std::cerr << "ddprun-shm-allreduce-bench: " << shm.status() << std::endl;
    return 1;
  }
  std::vector<float> own;
  std::vector<float> fresh(step ? floats : 0);
  float* data = nullptr;
  if (resident || flat || in_place) {
    absl::StatusOr<float*> mapped = (*shm)->MapResident(floats);
    if (!mapped.ok()) {
      std::cerr << "ddprun-shm-allreduce-bench: " << mapped.status()
                << std::endl;
      return 1;
    }
    data = *mapped;
  } else {
    own.resize(floats);
    data = own.data();
  }
  std::vector<double> micros;
  micros.reserve(ops);
  // Per call: whether one of its waits slept on the futex.
  std::vector<char> slept(ops, 0);
  std::vector<float> flat_grad(flat ? floats : 0, 1.0f);
  for (int i = 0; i < ops; ++i) {
    const auto start = std::chrono::steady_clock::now();
    if (flat) {
      // What backward does before each sync, untimed: write the gradient.
      std::fill(flat_grad.begin(), flat_grad.end(), 1.0f);
    } else if (!step) {
      // What backward does before each sync, untimed: write the gradients.
      std::fill(data, data + floats, 1.0f);
    } else if (!resident) {
      Fill(data, floats);  // the gradient, handed over
    } else {
      std::memset(data, 0, floats * sizeof(float));  // ZeroGrad
      Fill(fresh.data(), floats);                    // backward's gradient
      AddInto(data, fresh.data(), floats);           // AccumulateGrad
    }
    const auto timed = step ? start : std::chrono::steady_clock::now();
    const int64_t slept_before = (*shm)->stats().waits_slept;
    absl::Status status;
    if (flat) {
      // PyTorch DDP's default on a bucket in shared memory: the flattening
      // copy is the copy in, the sum in place, the unflattening the copy
      // out.
      std::memcpy(data, flat_grad.data(), floats * sizeof(float));
      status = (*shm)->AllreduceInPlace({{data, floats}}, divisor);
      std::memcpy(flat_grad.data(), data, floats * sizeof(float));
    } else {
      const ShmAllreduce::Part part{data, floats};
      status = resident || in_place ? (*shm)->AllreduceInPlace({part}, divisor)
                                    : (*shm)->Allreduce({part}, divisor);
    }
    micros.push_back(std::chrono::duration<double, std::micro>(
                         std::chrono::steady_clock::now() - timed)
                         .count());
    slept[i] = (*shm)->stats().waits_slept != slept_before;
    if (!status.ok()) {
      std::cerr << "ddprun-shm-allreduce-bench: " << status << std::endl;
      return 1;
    }
  }
  const float expected = static_cast<float>(options.local_size) / divisor;
  const float* result = flat ? flat_grad.data() : data;
  for (int64_t i = 0; i < floats; ++i) {
    if (const float v = result[i]; v != expected) {
      std::cerr << "ddprun-shm-allreduce-bench: wrong sum " << v
                << ", expected " << expected << std::endl;
      return 1;
    }
  }
  if (options.local_rank == 0) {
    // The mean next to the percentiles: a few calls that sleep on the
    // futex (or wait out the peer's preemption) move the mean far above
    // the median; the counts say which waits ended how.
    double total = 0, total_slept = 0;
    int calls_slept = 0;
    for (int i = 0; i < ops; ++i) {
      total += micros[i];
      if (slept[i]) {
        total_slept += micros[i];
        ++calls_slept;
      }
    }
    const ShmAllreduce::Stats& st = (*shm)->stats();
    std::vector<double> sorted = micros;
    std::sort(sorted.begin(), sorted.end());
    std::cout
        << absl::StrFormat(
               "world %d, %d floats (%d bytes)%s%s%s%s, %d calls: p10 %.1f "
               "us, p50 %.1f us, p90 %.1f us, p99 %.1f us, max %.1f us, "
               "mean %.1f us; waits per call: %.2f spun, %.2f spun long, "
               "%.3f slept; calls that slept: %d (mean %.1f us)",
               options.local_size, floats, floats * 4,
               resident ? " resident" : "", flat ? " flat" : "",
               in_place ? " in place" : "", step ? " step" : "", ops,
               sorted[ops / 10], sorted[ops / 2], sorted[ops * 9 / 10],
               sorted[std::min(ops - 1, ops * 99 / 100)], sorted.back(),
               total / ops, static_cast<double>(st.waits_spun) / ops,
               static_cast<double>(st.waits_spun_long) / ops,
               static_cast<double>(st.waits_slept) / ops, calls_slept,
               calls_slept ? total_slept / calls_slept : 0.0)
        << std::endl;
    if (histogram) {
      // Log2 buckets of the per-call time.
      std::vector<int> buckets(32, 0);
      for (double us : micros) {
        int b = 0;
        while (b < 31 && us >= static_cast<double>(2 << b)) ++b;
        ++buckets[b];
      }
      for (int b = 0; b < 32; ++b) {
        if (buckets[b] == 0) continue;
        std::cout << absl::StrFormat("  < %7d us: %d\n", 2 << b, buckets[b]);
      }
    }
  }
  return 0;
}

int Run(int argc, char** argv) {
  int64_t floats = 102400;
  int ops = 1000;
  int world = 2;
  float divisor = 1.0f;
  std::string dir = "/dev/shm";
  CLI::App app{"ShmAllreduce alone: forked local ranks, per-call percentiles"};
  app.add_option("--floats", floats, "floats per call")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 32));
  app.add_option("--ops", ops, "calls")->check(CLI::Range(1, 100000000));
  app.add_option("--world", world, "local ranks")->check(CLI::Range(1, 64));
  app.add_option("--divisor", divisor, "each sum is divided by it")
      ->check(CLI::PositiveNumber);
  app.add_option("--dir", dir, "a folder in shared memory")
      ->check(CLI::ExistingDirectory);
  bool step = false;
  app.add_flag("--step", step,
               "time the gradient's writes before each sync too (see above)");
  bool resident = false;
  app.add_flag("--resident", resident,
               "the buffer lives in the segment, summed in place");
  bool flat = false;
  app.add_flag("--flat", flat,
               "a private buffer copied into a resident one, summed there "
               "in place and copied back (PyTorch DDP's default buckets)");
  bool in_place = false;
  app.add_flag("--in-place", in_place,
               "the buffer lives in the segment (as a GradientArena places "
               "DataParallel's gradients), summed by AllreduceInPlace");
  bool histogram = false;
  app.add_flag("--histogram", histogram, "per-call times in log2 buckets");
  bool memcpy_baseline = false;
  app.add_flag("--memcpy", memcpy_baseline,
               "first time a memcpy of the same bytes, one process alone "
               "(the baseline of bench/collectives/compare.py)");
  bool no_pipeline = false;
  app.add_flag("--no-pipeline", no_pipeline,
               "copied calls of several slices copy each slice in just "
               "before its sum (ShmAllreduceOptions::pipeline off)");
  CLI11_PARSE(app, argc, argv);
  if (memcpy_baseline) {
    std::vector<float> from(floats, 1.0f), to(floats, 0.0f);
    std::vector<double> micros;
    for (int i = 0; i < std::max(3, std::min(ops, 1000)); ++i) {
      const auto start = std::chrono::steady_clock::now();
      std::memcpy(to.data(), from.data(), floats * sizeof(float));
      micros.push_back(std::chrono::duration<double, std::micro>(
                           std::chrono::steady_clock::now() - start)
                           .count());
      std::swap(from, to);
    }
    std::sort(micros.begin(), micros.end());
    std::cout << absl::StrFormat(
                     "memcpy of %d bytes alone: p10 %.1f us, p50 %.1f us",
                     floats * 4, micros[micros.size() / 10],
                     micros[micros.size() / 2])
              << std::endl;
  }

  ShmAllreduceOptions options;
  options.dir = dir;
  options.name = absl::StrFormat("ddprun-shm-bench-%d", getpid());
  options.local_size = world;
  options.pipeline = !no_pipeline;
  // Rank 0's segment exists before any other rank starts; it is unlinked
  // once the last rank has attached.
  options.local_rank = 0;
  std::vector<pid_t> children;
  int status = 0;
  pid_t first = fork();
  if (first == 0)
    _exit(Rank(options, floats, ops, divisor, resident, step, flat, histogram,
               in_place));
  children.push_back(first);
  // Rank 0 creates the file; wait until it exists before forking the rest.
  const std::string path = dir + "/" + options.name;
  for (int i = 0; i < 10000 && access(path.c_str(), F_OK) != 0; ++i) {
    usleep(1000);
  }
  for (int r = 1; r < world; ++r) {
    pid_t child = fork();
    if (child == 0) {
      options.local_rank = r;
      _exit(Rank(options, floats, ops, divisor, resident, step, flat, histogram,
                 in_place));
    }
    children.push_back(child);
  }
  for (pid_t child : children) {
    int child_status = 0;
    waitpid(child, &child_status, 0);
    if (!WIFEXITED(child_status) || WEXITSTATUS(child_status) != 0) status = 1;
  }
  return status;
}

}  // namespace

int main(int argc, char** argv) { return Run(argc, argv); }
