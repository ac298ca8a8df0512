#include "worker/gradient_arena.h"

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <torch/csrc/autograd/graph_task.h>

#include <atomic>
#include <cstring>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "worker/torch_compat.h"

namespace ddprun::worker {
namespace {

constexpr size_t kAlign = 64;  // as LibTorch's CPU allocator aligns

// The installed arena's allocator, if any (one per process).
std::atomic<GradientArena::Allocator*> installed{nullptr};

// Every arena ever installed (they are never freed, see below), to find the
// one a raw pointer belongs to, and the raw deleter of the allocator that
// was installed before the first of them.
absl::Mutex arenas_mu(absl::kConstInit);
std::vector<GradientArena::Allocator*>* arenas ABSL_GUARDED_BY(arenas_mu) =
    nullptr;
std::atomic<c10::DeleterFnPtr> previous_raw_deleter{nullptr};

}  // namespace

// The allocator object is never freed: LibTorch's allocator registry keeps
// a plain pointer, and blocks it served call back into it when freed, after
// the arena was uninstalled too. Uninstalled, it serves nothing; it keeps
// the buffer mapped until its last block is freed. What stays is a few
// hundred bytes per DataParallel constructed.
//
// A block's DataPtr has the block itself as its context and RawDelete as
// its deleter, as LibTorch's own CPU allocator does: code that takes raw
// allocations (raw_allocate, e.g. oneDNN's convolutions in LibTorch 2.x)
// requires that, and frees them through raw_deleter().
class GradientArena::Allocator final : public c10::Allocator {
 public:
  Allocator(GradientArenaOptions options, c10::Allocator* previous)
      : base_(static_cast<char*>(options.base)),
        bytes_(options.bytes),
        keep_alive_(std::move(options.keep_alive)),
        sizes_(options.sizes.begin(), options.sizes.end()),
        backward_only_(options.backward_only),
        previous_(previous) {}

  c10::DataPtr allocate(size_t n) DDPRUN_ALLOCATE_CONST override {
    // A backward pass runs its nodes with its graph task current on the
    // thread: the check that keeps forward's and the optimizer's tensors
    // of those sizes out.
    if (sizes_.contains(n) &&
        (!backward_only_ ||
         torch::autograd::get_current_graph_task_exec_info() != nullptr)) {
      absl::MutexLock lock(&mu_);
      if (serving_) {
        if (void* data = TakeLocked(n)) {
          return c10::DataPtr(data, data, &RawDelete,
                              c10::Device(c10::DeviceType::CPU));
        }
        ++stats_.declined;
      }
    }
    return previous_->allocate(n);
  }

  c10::DeleterFnPtr raw_deleter() const override { return &RawDelete; }

#if DDPRUN_ALLOCATOR_HAS_COPY_DATA
  void copy_data(void* dest, const void* src,
                 std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
#endif

  // Frees a block of whichever arena holds it, or hands the pointer to the
  // raw deleter of the allocator installed before (a raw allocation this
  // one passed on).
  static void RawDelete(void* data) {
    Allocator* owner = nullptr;
    {
      absl::MutexLock lock(&arenas_mu);
      for (Allocator* arena : *arenas) {
        if (arena->Holds(data)) owner = arena;
      }
    }
    if (owner != nullptr) {
      owner->Give(data);
    } else if (c10::DeleterFnPtr previous = previous_raw_deleter.load()) {
      previous(data);
    }
  }

  // Stops serving; the buffer goes once no block is in use.
  void Retire() {
    absl::MutexLock lock(&mu_);
    serving_ = false;
    free_.clear();
    if (live_.empty()) keep_alive_.reset();
  }

  c10::Allocator* previous() const { return previous_; }

  Stats stats() const {
    absl::MutexLock lock(&mu_);
    return stats_;
  }

 private:
  bool Holds(const void* data) const {
    const char* p = static_cast<const char*>(data);
    return p >= base_ && p < base_ + bytes_;
  }

  void* TakeLocked(size_t n) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto it = free_.find(n);
    void* data = nullptr;
    if (it != free_.end() && !it->second.empty()) {
      data = it->second.back();
      it->second.pop_back();
    } else {
      const size_t rounded = (n + kAlign - 1) / kAlign * kAlign;
      if (rounded > bytes_ - used_) return nullptr;
      data = base_ + used_;
      used_ += rounded;
    }
    live_[data] = n;
    ++stats_.served;
    stats_.in_use_bytes += static_cast<int64_t>(n);
    return data;
  }

  void Give(void* data) const {
    std::shared_ptr<void> last;  // unmapped outside the lock
    absl::MutexLock lock(&mu_);
    auto it = live_.find(data);
    if (it == live_.end()) return;
    const size_t n = it->second;
    live_.erase(it);
    stats_.in_use_bytes -= static_cast<int64_t>(n);
    if (serving_) {
      free_[n].push_back(data);
    } else if (live_.empty()) {
      last = std::move(keep_alive_);
    }
  }

  char* const base_;
  const size_t bytes_;
  // allocate() is const in LibTorch 1.13: the state below changes in it.
  mutable absl::Mutex mu_;
  mutable std::shared_ptr<void> keep_alive_ ABSL_GUARDED_BY(mu_);
  const absl::flat_hash_set<size_t> sizes_;
  const bool backward_only_;
  c10::Allocator* const previous_;
  mutable bool serving_ ABSL_GUARDED_BY(mu_) = true;
  mutable size_t used_ ABSL_GUARDED_BY(mu_) = 0;
  mutable absl::flat_hash_map<size_t, std::vector<void*>> free_
      ABSL_GUARDED_BY(mu_);
  mutable absl::flat_hash_map<void*, size_t> live_ ABSL_GUARDED_BY(mu_);
  mutable Stats stats_ ABSL_GUARDED_BY(mu_);
};

absl::StatusOr<std::unique_ptr<GradientArena>> GradientArena::Install(
    GradientArenaOptions options) {
  if (options.base == nullptr || options.bytes == 0 || options.sizes.empty()) {
    return absl::InvalidArgumentError(
        "gradient arena: no buffer or no sizes to serve");
  }
  if (reinterpret_cast<uintptr_t>(options.base) % kAlign != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "gradient arena: the buffer at %p is not aligned to %d bytes",
        options.base, kAlign));
  }
  c10::Allocator* previous = c10::GetCPUAllocator();
  auto* allocator = new Allocator(std::move(options), previous);
  Allocator* none = nullptr;
  if (!installed.compare_exchange_strong(none, allocator)) {
    allocator->Retire();
    return absl::FailedPreconditionError(
        "gradient arena: another one is installed in this process (one "
        "DataParallel with shared gradients at a time)");
  }
  {
    absl::MutexLock lock(&arenas_mu);
    if (arenas == nullptr) {
      arenas = new std::vector<Allocator*>();
      previous_raw_deleter.store(previous->raw_deleter());
    }
    arenas->push_back(allocator);
  }
  c10::SetCPUAllocator(allocator, /*priority=*/0);
  if (c10::GetCPUAllocator() != allocator) {
    installed.store(nullptr);
    allocator->Retire();
    return absl::FailedPreconditionError(
        "gradient arena: LibTorch kept another CPU allocator (registered at "
        "a higher priority)");
  }
  return std::unique_ptr<GradientArena>(new GradientArena(allocator));
}

GradientArena::~GradientArena() {
  if (c10::GetCPUAllocator() == allocator_) {
    c10::SetCPUAllocator(allocator_->previous(), /*priority=*/0);
  }
  allocator_->Retire();
  installed.store(nullptr);
}

GradientArena::Stats GradientArena::stats() const {
  return allocator_->stats();
}

}  // namespace ddprun::worker
