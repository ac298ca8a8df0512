#include "worker/ddp.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>

#include <chrono>
#include <cstring>

#include "spdlog/spdlog.h"
#include "worker/abortable.h"
#include "worker/gradient_allreduce.h"
#include "worker/gradient_arena.h"
#include "worker/malloc_tuning.h"
#include "worker/phase.h"

namespace ddprun::worker {
namespace {

at::Tensor Flatten(const std::vector<at::Tensor>& tensors) {
  std::vector<at::Tensor> flat;
  flat.reserve(tensors.size());
  for (const auto& t : tensors) flat.push_back(t.detach().reshape({-1}));
  return at::cat(flat);
}

}  // namespace

DataParallel::DataParallel(std::vector<at::Tensor> parameters,
                           const ProcessGroup& group,
                           const DataParallelOptions& options)
    : parameters_(std::move(parameters)),
      collectives_(group.collectives),
      direct_(group.direct),
      world_size_(group.world_size),
      progress_fd_(group.progress_fd),
      options_(options) {
  ReportPhase(progress_fd_, common::Phase::kStep);
  if (options_.tune_malloc) TuneMallocForTraining();
  TORCH_CHECK(!parameters_.empty(),
              "DataParallel: the model has no parameters");
  const int n = static_cast<int>(parameters_.size());
  bucket_of_.assign(n, -1);
  slot_of_.assign(n, -1);
  {
    absl::MutexLock lock(&mu_);
    ready_.assign(n, 0);
  }
  if (direct_ && !(parameters_[0].device().is_cpu() &&
                   parameters_[0].scalar_type() == at::kFloat)) {
    direct_.reset();  // it binds float buffers in host memory only
  }
  const int64_t cap_bytes = std::max<int64_t>(
      1, static_cast<int64_t>(options_.bucket_mb * 1024 * 1024));
  // Reverse order: the last layers' gradients are computed first.
  Bucket current;
  int64_t numel = 0;
  auto close = [&] {
    if (current.params.empty()) return;
    if (!direct_) {  // the direct path reduces the gradients where they lie
      current.flat = at::zeros(
          {numel},
          parameters_[current.params[0]].options().requires_grad(false));
    }
    current.pending = static_cast<int>(current.params.size());
    for (size_t slot = 0; slot < current.params.size(); ++slot) {
      bucket_of_[current.params[slot]] = static_cast<int>(buckets_.size());
      slot_of_[current.params[slot]] = static_cast<int>(slot);
    }
    buckets_.push_back(std::move(current));
    current = Bucket();
    numel = 0;
  };
  for (int i = n - 1; i >= 0; --i) {
    const at::Tensor& p = parameters_[i];
    TORCH_CHECK(p.dtype() == parameters_[0].dtype() &&
                    p.device() == parameters_[0].device(),
                "DataParallel: parameter ", i, " is ", p.dtype(), " on ",
                p.device(), " but parameter 0 is ", parameters_[0].dtype(),
                " on ", parameters_[0].device(),
                "; move the model to one device and dtype first");
    current.params.push_back(i);
    current.offsets.push_back(numel);
    numel += p.numel();
    if (numel * static_cast<int64_t>(p.element_size()) >= cap_bytes) close();
  }
  close();

  if (direct_ && direct_->in_place_capable()) ShareGradients(group.rank);

  if (collectives_ && group.rank == 0) {
    // What carries this model's gradients, as the tests check it.
    spdlog::info(
        "gradient sync: {} bucket(s) through {}{}", buckets_.size(),
        GradientPathName(gradient_path()),
        arena_ != nullptr ? ", gradients allocated in shared memory" : "");
  }
  if (collectives_ && !direct_) {
    hooks_.reserve(n);
    for (int i = 0; i < n; ++i) {
      TORCH_CHECK(parameters_[i].requires_grad(), "DataParallel: parameter ", i,
                  " does not require grad; pass only trained parameters");
      hooks_.push_back(parameters_[i].register_hook(
          [this, i](const at::Tensor& grad) { OnGradient(i, grad); }));
    }
  }
}

void DataParallel::ShareGradients(int rank) {
  // Room for every gradient twice (this step's, and a same-sized temporary
  // such as AccumulateGrad's when it adds into a kept grad), each block
  // aligned as the arena aligns it.
  std::vector<size_t> sizes;
  int64_t floats = 0;
  for (const at::Tensor& p : parameters_) {
    sizes.push_back(static_cast<size_t>(p.numel()) * sizeof(float));
    floats += 2 * ((p.numel() + 15) / 16 * 16);
  }
  // Collective over the node's ranks, which all construct this now; a rank
  // that cannot reserve its buffer makes every rank go without.
  absl::StatusOr<float*> mapped = direct_->MapResident(floats);
  absl::StatusOr<std::unique_ptr<GradientArena>> arena =
      mapped.ok() ? GradientArena::Install(GradientArenaOptions{
                        *mapped, static_cast<size_t>(floats) * sizeof(float),
                        direct_->resident_keep_alive(), std::move(sizes)})
                  : mapped.status();
  if (!arena.ok()) {
    // Correct either way: the gradients are copied into the segment.
    spdlog::warn(
        "gradient sync: rank {} keeps its gradients in private memory and "
        "copies them for the allreduce: {}",
        rank, std::string(arena.status().message()));
    return;
  }
  arena_ = std::move(*arena);
}

DataParallel::~DataParallel() {
  for (size_t i = 0; i < hooks_.size(); ++i) {
    parameters_[i].remove_hook(hooks_[i]);
  }
}

void DataParallel::ZeroGrad() {
  for (at::Tensor& p : parameters_) p.mutable_grad() = at::Tensor();
}

void DataParallel::Broadcast(const std::vector<at::Tensor>& tensors) {
  if (!collectives_ || tensors.empty()) return;
  std::vector<at::Tensor> flat = {Flatten(tensors)};
  ::c10d::BroadcastOptions options;
  options.rootRank = 0;
  WaitOrAbandon(collectives_, collectives_->broadcast(flat, options));
  at::NoGradGuard no_grad;
  int64_t offset = 0;
  for (const at::Tensor& t : tensors) {
    at::Tensor(t).copy_(flat[0].narrow(0, offset, t.numel()).view_as(t));
    offset += t.numel();
  }
}

void DataParallel::BroadcastParameters(const std::vector<at::Tensor>& extra) {
  std::vector<at::Tensor> all = parameters_;
  all.insert(all.end(), extra.begin(), extra.end());
  Broadcast(all);
}

void DataParallel::BroadcastBuffers(const std::vector<at::Tensor>& buffers) {
  Broadcast(buffers);
}

void DataParallel::CopyIn(int param, const at::Tensor& grad,
                          bool add_existing) {
  Bucket& bucket = buckets_[bucket_of_[param]];
  const int slot = slot_of_[param];
  const at::Tensor& p = parameters_[param];
  at::Tensor view =
      bucket.flat.narrow(0, bucket.offsets[slot], p.numel()).view_as(p);
  if (grad.defined()) {
    view.copy_(grad);
    if (add_existing && p.grad().defined()) view.add_(p.grad());
  } else if (p.grad().defined()) {
    view.copy_(p.grad());
  } else {
    view.zero_();
  }
  ready_[param] = 1;
  --bucket.pending;
}

void DataParallel::OnGradient(int param, const at::Tensor& grad) {
  if (!sync_) return;
  absl::MutexLock lock(&mu_);
  TORCH_CHECK(!ready_[param], "DataParallel: parameter ", param,
              " got a second gradient before FinishGradientSync; call "
              "FinishGradientSync after every backward, or wrap the "
              "accumulating backwards in DataParallel::NoSync");
  // The hook runs before AccumulateGrad: grad is this backward's part only,
  // p.grad() what earlier NoSync steps accumulated.
  CopyIn(param, grad, /*add_existing=*/true);
  LaunchReady();
}

void DataParallel::LaunchReady() {
  while (next_launch_ < buckets_.size() &&
         buckets_[next_launch_].pending == 0) {
    std::vector<at::Tensor> tensors = {buckets_[next_launch_].flat};
    buckets_[next_launch_].work = collectives_->allreduce(tensors);
    ++next_launch_;
  }
}

void DataParallel::FinishGradientSync() {
  // The step's compute is done: the agent's sign of life for this rank,
  // with the time this rank computed since its last sync ended (its wait
  // for the slowest peer left out: the straggler figure).
  auto start = std::chrono::steady_clock::now();
  if (sync_) {
    const double compute_seconds =
        last_sync_end_.has_value()
            ? std::chrono::duration<double>(start - *last_sync_end_).count()
            : -1;
    ReportStep(progress_fd_, compute_seconds);
  }
  if (!sync_) return;
  if (collectives_) {
    if (direct_) {
      ReduceGradientsInPlace();
    } else {
      ReduceBuckets();
    }
  }
  const auto end = std::chrono::steady_clock::now();
  if (collectives_) {
    sync_seconds_ += std::chrono::duration<double>(end - start).count();
  }
  last_sync_end_ = end;
}

void DataParallel::ReduceBuckets() {
  {
    absl::MutexLock lock(&mu_);
    // Parameters no hook saw (unused in this step, or a NoSync step's
    // backward): their grad now holds everything backward produced.
    for (size_t i = 0; i < parameters_.size(); ++i) {
      if (!ready_[i]) CopyIn(static_cast<int>(i), at::Tensor(), false);
    }
    LaunchReady();
  }
  for (Bucket& bucket : buckets_) {
    WaitOrAbandon(collectives_, bucket.work);
    bucket.work.reset();
    ++gradient_stats_.process_group;
    bucket.flat.div_(world_size_);
    for (size_t slot = 0; slot < bucket.params.size(); ++slot) {
      at::Tensor& p = parameters_[bucket.params[slot]];
      at::Tensor view =
          bucket.flat.narrow(0, bucket.offsets[slot], p.numel()).view_as(p);
      if (p.grad().defined()) {
        p.mutable_grad().copy_(view);
      } else {
        p.mutable_grad() = view.clone();
      }
    }
  }
  ResetStep();
}

void DataParallel::ReduceGradientsInPlace() {
  // No hooks ran (this path registers none): each grad holds everything
  // backward produced since the last sync. Bucket by bucket, in the same
  // order on every rank, the gradients are averaged where they lie: the
  // shared-memory allreduce reads them, and writes sum / world back into
  // them, in one pass; no bucket buffer, no copies.
  at::NoGradGuard no_grad;
  std::vector<ShmAllreduce::Part> parts;
  for (const Bucket& bucket : buckets_) {
    parts.clear();
    for (int index : bucket.params) {
      at::Tensor& p = parameters_[index];
      at::Tensor& grad = p.mutable_grad();
      if (!grad.defined()) {
        grad = at::zeros_like(p);  // unused in this step: counts as zero
      } else if (!grad.is_contiguous() || grad.is_sparse()) {
        grad = grad.to_dense().contiguous();
      }
      parts.push_back({grad.data_ptr<float>(), grad.numel()});
    }
    const int64_t fallbacks = direct_->shm_stats().in_place_fallbacks;
    if (arena_ == nullptr) {
      direct_->Run(parts, static_cast<float>(world_size_));
      ++gradient_stats_.copied;
      continue;
    }
    direct_->RunInPlace(parts, static_cast<float>(world_size_));
    if (direct_->shm_stats().in_place_fallbacks == fallbacks) {
      ++gradient_stats_.in_place;
      continue;
    }
    ++gradient_stats_.copied;
    if (!warned_fallback_) {
      // Once: correct, but the copies this path exists to avoid.
      warned_fallback_ = true;
      const GradientArena::Stats arena = arena_->stats();
      spdlog::warn(
          "gradient sync: a bucket's gradients were copied, not summed in "
          "shared memory, because some rank's were not all there ({} "
          "tensors of gradient sizes placed, {} refused for want of room "
          "on this rank; gradients a program assigns itself are never "
          "there); further such steps are not logged",
          arena.served, arena.declined);
    }
  }
}

GradientPath DataParallel::gradient_path() const {
  return direct_ ? direct_->path() : GradientPath::kProcessGroup;
}

void DataParallel::ResetStep() {
  absl::MutexLock lock(&mu_);
  std::fill(ready_.begin(), ready_.end(), 0);
  for (Bucket& bucket : buckets_) {
    bucket.pending = static_cast<int>(bucket.params.size());
  }
  next_launch_ = 0;
}

}  // namespace ddprun::worker
