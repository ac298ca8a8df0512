// A worker for the gradient-allreduce tests, run under ddprun (or with
// ddprun's environment): builds the process group as ddprun-mnist does
// (GradientAllreduce where it applies), then
//   --mode check: for each of --sizes (floats), sums integer-valued floats
//     through the gradient path, compares with the exact sum and with
//     ProcessGroupGloo's (the reference), then sums non-integer floats
//     (rounding differs by order) and prints a hash of the result's bits;
//   --mode loop: sums --sizes' first size forever, one line per iteration
//     (the peer-failure tests kill or stop a rank meanwhile); with
//     --in-place, "in_place_calls N in_place_fallbacks F" before each;
//   --in-place (check, loop): the buffers are allocated by LibTorch while a
//     GradientArena serves their sizes from the resident buffer (as
//     DataParallel's shared gradients are) and summed where they lie
//     (GradientAllreduce::RunInPlace); check prints "in_place_calls",
//     "in_place_fallbacks" and "arena_served", loop the first two;
//   --mode ddp-shared: DataParallel with its defaults (the group's path)
//     against DataParallel on the process group, over a few steps (dropped
//     grads, a NoSync accumulation) plus one whose gradients a program
//     placed itself; prints "ddp_equal", "in_place_calls",
//     "in_place_fallbacks" and DataParallel::GradientStats ("buckets_in_place",
//     "buckets_copied", "buckets_process_group").
// Writes <out-dir>/rank_<R>.txt: "path <name>", "size N exact E reference F
// bits H" per size, "runs N", "pipelined_slices N" (slices copied in one
// slice ahead of their sum: 2 local ranks, one node). Exits 1 with one line on
// stderr on any error.
#include <ATen/ATen.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "worker/ddp.h"
#include "worker/gradient_allreduce.h"
#include "worker/gradient_arena.h"
#include "worker/lazy_collectives.h"
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

// The two tests' model: a weight and a bias, integer-valued.
std::vector<at::Tensor> TestParameters() {
  std::vector<at::Tensor> params = {
      at::arange(64 * 300, at::kFloat).remainder(5).sub(2).reshape({64, 300}),
      at::arange(64, at::kFloat).remainder(3)};
  for (auto& p : params) p.set_requires_grad(true);
  return params;
}

// Its backward on rank `rank`'s inputs of `step`: integer-valued gradients.
void TestBackward(const std::vector<at::Tensor>& p, int rank, int step) {
  at::Tensor x = at::arange(300 * 4, at::kFloat)
                     .add(rank * 7 + step)
                     .remainder(9)
                     .sub(4)
                     .reshape({300, 4});
  (p[0].matmul(x).sum() + p[1].sum() * (rank + step)).backward();
}

// A DataParallel under test (`options`, on the group's gradient path)
// beside a reference DataParallel on the process group, over the same
// parameters and inputs (integer-valued: every order of summing is exact,
// so the two must agree bit for bit).
class AgainstReference {
 public:
  AgainstReference(const ddprun::worker::ProcessGroup& group,
                   const ddprun::worker::DataParallelOptions& options)
      : rank_(group.rank), params(TestParameters()), plain_(TestParameters()) {
    ddp.emplace(params, group, options);
    ddprun::worker::ProcessGroup reference_group = group;
    reference_group.direct.reset();
    reference_.emplace(plain_, reference_group, options);
  }

  // ZeroGrad on both, or (set_to_none) the tested grads dropped by hand.
  void ZeroGrad(bool set_to_none = false) {
    if (set_to_none) {
      for (auto& p : params) p.mutable_grad() = at::Tensor();
    } else {
      ddp->ZeroGrad();
    }
    reference_->ZeroGrad();
  }
  void Backward(int step) {
    TestBackward(params, rank_, step);
    TestBackward(plain_, rank_, step);
  }
  void SyncAndCompare() {
    ddp->FinishGradientSync();
    reference_->FinishGradientSync();
    Compare();
  }
  // Three synced steps, then two backwards accumulated under NoSync and
  // one sync: what both checks run first.
  void CommonSteps() {
    for (int step = 0; step < 3; ++step) {
      ZeroGrad();
      Backward(step);
      SyncAndCompare();
    }
    ZeroGrad();
    {
      ddprun::worker::DataParallel::NoSync a(*ddp), b(*reference_);
      Backward(5);
    }
    Backward(6);
    SyncAndCompare();
  }
  // Whether the tested grads equal the reference's (and are defined).
  void Compare() {
    for (size_t i = 0; i < params.size(); ++i) {
      equal &= params[i].grad().defined() &&
               params[i].grad().equal(plain_[i].grad());
    }
  }
  const at::Tensor& reference_grad(int i) const { return plain_[i].grad(); }

  std::vector<at::Tensor> params;
  std::optional<ddprun::worker::DataParallel> ddp;
  bool equal = true;

 private:
  int rank_;
  std::vector<at::Tensor> plain_;
  std::optional<ddprun::worker::DataParallel> reference_;
};

// DataParallel with its defaults (shared gradients where it shares a node)
// against the reference: grads dropped by ZeroGrad (placed anew), a NoSync
// accumulation, and a grad a program assigned itself.
int CheckSharedDataParallel(const ddprun::worker::ProcessGroup& group,
                            std::ofstream& out) {
  ddprun::worker::DataParallelOptions options;
  options.bucket_mb = 0.0001;  // two buckets: the bias, then the weight
  AgainstReference check(group, options);
  check.CommonSteps();
  // A program sets rank 0's weight gradient itself, from a tensor it made
  // before DataParallel existed (not in shared memory): that bucket's sum
  // is copied on every rank, the other still summed in place.
  check.ZeroGrad();
  check.Backward(7);
  if (group.rank == 0) {
    check.params[0].mutable_grad() = check.reference_grad(0).clone();
  }
  check.SyncAndCompare();
  const ddprun::worker::DataParallel& ddp = *check.ddp;
  out << "buckets_in_place " << ddp.gradient_stats().in_place << std::endl;
  out << "buckets_copied " << ddp.gradient_stats().copied << std::endl;
  out << "buckets_process_group " << ddp.gradient_stats().process_group
      << std::endl;
  // The group's shared-memory allreduce is the one DataParallel used.
  const ddprun::worker::ShmAllreduce::Stats shm =
      group.direct ? group.direct->shm_stats()
                   : ddprun::worker::ShmAllreduce::Stats();
  out << "in_place_calls " << shm.in_place_calls << std::endl;
  out << "in_place_fallbacks " << shm.in_place_fallbacks << std::endl;
  // The arena goes with its DataParallel: the grads in it keep their
  // values (the buffer stays mapped while they live), and later
  // allocations are LibTorch's own again.
  check.ddp.reset();
  check.Compare();
  at::Tensor after = at::ones({64});
  check.equal &= after.sum().item<float>() == 64.0f;
  out << "ddp_equal " << (check.equal ? 1 : 0) << std::endl;
  return out.good() ? 0 : Fail("cannot write the result file");
}

int Run(int argc, char** argv) {
  std::string mode = "check";
  std::string out_dir = ".";
  std::vector<int64_t> sizes = {1, 1024};
  int64_t timeout_ms = 30000;
  CLI::App app{"a worker for the gradient-allreduce tests"};
  app.add_option("--mode", mode, "check, loop or ddp-shared")
      ->check(CLI::IsMember({"check", "loop", "ddp-shared"}));
  bool in_place = false;
  app.add_flag("--in-place", in_place,
               "allocate the buffers in a GradientArena, sum them in place");
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
  // Gloo groups formed before any collective ran: none where it is formed
  // on demand (one node, shared memory).
  out << "gloo_formed_at_start " << (group->lazy ? group->lazy->formed() : 1)
      << std::endl;
  // What DataParallel does: GradientAllreduce where there is one, else the
  // process group.
  // Tensors of the sizes asked for come from the node's shared memory while
  // `arena` is installed, as DataParallel's gradients do.
  std::unique_ptr<ddprun::worker::GradientArena> arena;
  if (in_place && group->direct && group->direct->in_place_capable()) {
    std::vector<size_t> bytes;
    int64_t floats = 0;
    for (int64_t n : sizes) {
      bytes.push_back(static_cast<size_t>(n) * sizeof(float));
      floats += 2 * ((n + 15) / 16 * 16);  // data and expected may match
    }
    auto mapped = group->direct->MapResident(floats);
    if (!mapped.ok()) return Fail(mapped.status().ToString());
    // Plain allocations, not a backward's: served too.
    auto installed = ddprun::worker::GradientArena::Install(
        {*mapped, static_cast<size_t>(floats) * sizeof(float),
         group->direct->resident_keep_alive(), bytes,
         /*backward_only=*/false});
    if (!installed.ok()) return Fail(installed.status().ToString());
    arena = std::move(*installed);
  }
  auto reduce = [&](float* data, int64_t n) {
    if (in_place && group->direct) {
      const ddprun::worker::ShmAllreduce::Part part{data, n};
      group->direct->RunInPlace(absl::MakeConstSpan(&part, 1), 1.0f);
    } else if (group->direct) {
      group->direct->Run(data, n);
    } else {
      std::vector<at::Tensor> tensors = {at::from_blob(data, {n}, at::kFloat)};
      group->collectives->allreduce(tensors)->wait();
    }
  };

  if (mode == "loop") {
    at::Tensor tensor = at::empty({sizes[0]}, at::kFloat);
    float* data = tensor.data_ptr<float>();
    for (int64_t iteration = 1;; ++iteration) {
      for (int64_t i = 0; i < sizes[0]; ++i) data[i] = IntegerValue(i, rank);
      reduce(data, sizes[0]);
      if (in_place && group->direct) {
        const auto& stats = group->direct->shm_stats();
        out << "in_place_calls " << stats.in_place_calls
            << " in_place_fallbacks " << stats.in_place_fallbacks << "\n";
      }
      out << "iteration " << iteration << std::endl;
    }
  }
  if (mode == "ddp-shared") return CheckSharedDataParallel(*group, out);
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
  // Released, the group is formed again by its next collective (a
  // recovery's state sync) and still right.
  ddprun::worker::ReleaseIdleCollectives(*group);
  std::vector<at::Tensor> after = {at::full({3}, rank + 1.0f)};
  group->collectives->allreduce(after)->wait();
  out << "after_release_sum_ok "
      << (after[0].eq(world * (world + 1) / 2.0f).all().item<bool>() ? 1 : 0)
      << std::endl;
  out << "gloo_formed " << (group->lazy ? group->lazy->formed() : 1)
      << std::endl;
  out << "runs " << (group->direct ? group->direct->runs() : 0) << std::endl;
  out << "pipelined_slices "
      << (group->direct ? group->direct->shm_stats().pipelined_slices : 0)
      << std::endl;
  out << "in_place_calls "
      << (group->direct ? group->direct->shm_stats().in_place_calls : 0)
      << std::endl;
  out << "in_place_fallbacks "
      << (group->direct ? group->direct->shm_stats().in_place_fallbacks : 0)
      << std::endl;
  out << "arena_served " << (arena ? arena->stats().served : 0) << std::endl;
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
