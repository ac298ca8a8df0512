// A worker for the gradient-allreduce tests, run under ddprun (or with
// ddprun's environment): builds the process group as ddprun-mnist does
// (GradientAllreduce where it applies), then
//   --mode check: for each of --sizes (floats), sums integer-valued floats
//     through the gradient path, compares with the exact sum and with
//     ProcessGroupGloo's (the reference), then sums non-integer floats
//     (rounding differs by order) and prints a hash of the result's bits;
//   --mode loop: sums --sizes' first size forever, one line per iteration
//     (the peer-failure tests kill or stop a rank meanwhile).
// Writes <out-dir>/rank_<R>.txt: "path <name>", "size N exact E reference F
// bits H" per size, "runs N". Exits 1 with one line on stderr on any error.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <limits>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "worker/process_group.h"
#include "worker/worker_env.h"

namespace {

int Fail(const std::string& what) {
  std::cerr << "allreduce_helper: " << what << std::endl;
  return 1;
}

// Small integers: any order of summing them is exact.
float IntegerValue(int64_t i, int rank) {
  return static_cast<float>((i * 7 + rank * 13) % 17) - 8.0f;
}

// Reproducible non-integers in [-1, 1): the sum's bits depend on the order.
float NoisyValue(int64_t i, int rank) {
  uint64_t x = static_cast<uint64_t>(i) * 0x9E3779B97F4A7C15ULL +
               static_cast<uint64_t>(rank + 1) * 0xBF58476D1CE4E5B9ULL;
  x ^= x >> 31;
  x *= 0x94D049BB133111EBULL;
  x ^= x >> 29;
  return static_cast<float>(x >> 40) / static_cast<float>(1 << 23) - 1.0f;
}

uint64_t Fnv1a(const float* data, int64_t count) {
  const auto* bytes = reinterpret_cast<const unsigned char*>(data);
  uint64_t hash = 1469598103934665603ULL;
  for (int64_t i = 0; i < count * static_cast<int64_t>(sizeof(float)); ++i) {
    hash = (hash ^ bytes[i]) * 1099511628211ULL;
  }
  return hash;
}

int Run(int argc, char** argv) {
  std::string mode = "check";
  std::string out_dir = ".";
  std::vector<int64_t> sizes = {1, 1024};
  int64_t timeout_ms = 30000;
  CLI::App app{"a worker for the gradient-allreduce tests"};
  app.add_option("--mode", mode, "check or loop")
      ->check(CLI::IsMember({"check", "loop"}));
  app.add_option("--out-dir", out_dir, "where rank_<R>.txt goes");
  app.add_option("--timeout-ms", timeout_ms, "the gradient allreduce's timeout")
      ->check(CLI::Range(int64_t{1}, std::numeric_limits<int64_t>::max()));
  app.add_option("--sizes", sizes, "floats, comma-separated")
      ->delimiter(',')
      ->check(CLI::Range(int64_t{1}, std::numeric_limits<int64_t>::max()));
  CLI11_PARSE(app, argc, argv);
  auto env = ddprun::worker::ReadWorkerEnv();
  if (!env.ok()) return Fail(env.status().ToString());
  ddprun::worker::ProcessGroupOptions options;
  options.backend = ddprun::worker::BackendKind::kGloo;
  options.direct_allreduce = true;  // as ddprun-mnist's default
  options.timeout = std::chrono::minutes(1);  // forming the group
  options.gradient_timeout = std::chrono::milliseconds(timeout_ms);
  auto group = ddprun::worker::CreateProcessGroup(*env, options);
  if (!group.ok()) return Fail(group.status().ToString());
  const int rank = env->rank;
  const int world = env->world_size;
  std::ofstream out(absl::StrCat(out_dir, "/rank_", rank, ".txt"));
  out << "path " << ddprun::worker::GradientPathName(group->gradient_path)
      << std::endl;
  out << "pid " << getpid() << std::endl;
  // What DataParallel does: GradientAllreduce where there is one, else the
  // process group.
  auto reduce = [&](float* data, int64_t n) {
    if (group->direct) {
      group->direct->Run(data, n);
    } else {
      std::vector<at::Tensor> tensors = {at::from_blob(data, {n}, at::kFloat)};
      group->collectives->allreduce(tensors)->wait();
    }
  };

  if (mode == "loop") {
    std::vector<float> data(sizes[0]);
    for (int64_t iteration = 1;; ++iteration) {
      for (int64_t i = 0; i < sizes[0]; ++i) data[i] = IntegerValue(i, rank);
      reduce(data.data(), sizes[0]);
      out << "iteration " << iteration << std::endl;
    }
  }
  if (mode != "check") return Fail("unknown --mode " + mode);

  for (int64_t n : sizes) {
    at::Tensor data = at::empty({n}, at::kFloat);
    at::Tensor expected = at::empty({n}, at::kFloat);
    float* d = data.data_ptr<float>();
    float* e = expected.data_ptr<float>();
    for (int64_t i = 0; i < n; ++i) {
      d[i] = IntegerValue(i, rank);
      float sum = 0;
      for (int r = 0; r < world; ++r) sum += IntegerValue(i, r);
      e[i] = sum;
    }
    at::Tensor reference = data.clone();
    reduce(d, n);
    const bool exact = data.equal(expected);
    std::vector<at::Tensor> tensors = {reference};
    group->collectives->allreduce(tensors)->wait();
    const bool same_as_reference = data.equal(reference);

    for (int64_t i = 0; i < n; ++i) d[i] = NoisyValue(i, rank);
    reduce(d, n);
    out << absl::StrFormat("size %d exact %d reference %d bits %016x", n,
                           exact ? 1 : 0, same_as_reference ? 1 : 0,
                           Fnv1a(d, n))
        << std::endl;
  }
  out << "runs " << (group->direct ? group->direct->runs() : 0) << std::endl;
  return out.good() ? 0 : Fail("cannot write the result file");
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return Run(argc, argv);
  } catch (const std::exception& e) {
    return Fail(e.what());
  }
}
