// GradientArena as LibTorch's CPU allocator, over a plain buffer (what
// DataParallel gives it is the node's shared memory; the allreduce side is
// shm_allreduce_test and gradient_allreduce_test).
#include "worker/gradient_arena.h"

#include <ATen/ATen.h>
#include <c10/core/CPUAllocator.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <memory>

#include "absl/strings/match.h"

namespace ddprun::worker {
namespace {

// A 64-byte aligned buffer and a flag that says when it was let go.
struct Buffer {
  explicit Buffer(size_t size) : bytes(size) {
    void* memory = std::aligned_alloc(64, size);
    keep_alive = std::shared_ptr<void>(memory, [this](void* m) {
      released = true;
      std::free(m);
    });
    base = memory;
  }
  bool Holds(const at::Tensor& t) const {
    auto* p = static_cast<const char*>(t.data_ptr());
    auto* b = static_cast<const char*>(base);
    return p >= b && p < b + bytes;
  }
  void* base = nullptr;
  size_t bytes = 0;
  std::shared_ptr<void> keep_alive;
  bool released = false;
};

constexpr int64_t kFloats = 1000;  // the size the arena serves
constexpr size_t kBytes = kFloats * sizeof(float);
// GradientArenaOptions::backward_only off: the tests below allocate
// directly, outside any backward.
constexpr bool kAnyTime = false;

TEST(GradientArenaTest, ByDefaultOnlyABackwardPassesAllocationsAreServed) {
  // What keeps the process-wide allocator from touching other tensors:
  // forward's and the optimizer's of a gradient's size stay LibTorch's.
  Buffer buffer(1 << 20);
  auto arena = GradientArena::Install(
      {buffer.base, buffer.bytes, buffer.keep_alive, {kBytes}});
  ASSERT_TRUE(arena.ok()) << arena.status();
  at::Tensor weight = at::ones({kFloats}).requires_grad_(true);
  at::Tensor outside = at::empty({kFloats});
  EXPECT_FALSE(buffer.Holds(outside));
  (weight * 3.0f).sum().backward();
  ASSERT_TRUE(weight.grad().defined());
  EXPECT_TRUE(buffer.Holds(weight.grad()));
  EXPECT_EQ(weight.grad().sum().item<float>(), 3.0f * kFloats);
  EXPECT_FALSE(buffer.Holds(at::empty({kFloats})));
}

TEST(GradientArenaTest, ServesItsSizesFromTheBufferAndReusesFreedBlocks) {
  Buffer buffer(1 << 20);
  auto arena = GradientArena::Install(
      {buffer.base, buffer.bytes, buffer.keep_alive, {kBytes}, kAnyTime});
  ASSERT_TRUE(arena.ok()) << arena.status();
  void* first = nullptr;
  {
    at::Tensor served = at::empty({kFloats});
    at::Tensor other = at::empty({kFloats - 1});
    EXPECT_TRUE(buffer.Holds(served));
    EXPECT_FALSE(buffer.Holds(other));
    EXPECT_EQ(reinterpret_cast<uintptr_t>(served.data_ptr()) % 64, 0u);
    served.fill_(2.0f);  // usable memory
    EXPECT_EQ(served.sum().item<float>(), 2.0f * kFloats);
    first = served.data_ptr();
    EXPECT_EQ((*arena)->stats().in_use_bytes, static_cast<int64_t>(kBytes));
  }
  EXPECT_EQ((*arena)->stats().in_use_bytes, 0);
  // The next one of that size takes the freed block (a training loop
  // allocates the same gradients every step).
  at::Tensor again = at::empty({kFloats});
  EXPECT_EQ(again.data_ptr(), first);
  EXPECT_EQ((*arena)->stats().served, 2);
  EXPECT_EQ((*arena)->stats().declined, 0);
}

TEST(GradientArenaTest, RawAllocationsComeAndGoThroughItsRawDeleter) {
  // LibTorch 2.x's oneDNN convolutions take raw allocations from the CPU
  // allocator (raw_allocate) and free them through raw_deallocate: a block
  // of a served size, and any other size passed on, must both work.
  Buffer buffer(1 << 20);
  auto arena = GradientArena::Install(
      {buffer.base, buffer.bytes, buffer.keep_alive, {kBytes}, kAnyTime});
  ASSERT_TRUE(arena.ok()) << arena.status();
  c10::Allocator* cpu = c10::GetCPUAllocator();
  void* served = cpu->raw_allocate(kBytes);
  void* other = cpu->raw_allocate(kBytes + 4);
  auto* b = static_cast<char*>(buffer.base);
  EXPECT_TRUE(served >= b && served < b + buffer.bytes);
  EXPECT_FALSE(other >= b && other < b + buffer.bytes);
  std::memset(other, 1, kBytes + 4);
  cpu->raw_deallocate(other);
  cpu->raw_deallocate(served);
  EXPECT_EQ((*arena)->stats().in_use_bytes, 0);
  EXPECT_EQ(cpu->raw_allocate(kBytes), served);  // the freed block again
  cpu->raw_deallocate(served);
}

TEST(GradientArenaTest, AFullArenaLeavesTheRestToLibTorch) {
  // Room for two blocks: the third tensor of the size is LibTorch's own.
  Buffer buffer(2 * 4096);
  auto arena = GradientArena::Install(
      {buffer.base, buffer.bytes, buffer.keep_alive, {kBytes}, kAnyTime});
  ASSERT_TRUE(arena.ok()) << arena.status();
  at::Tensor a = at::empty({kFloats});
  at::Tensor b = at::empty({kFloats});
  at::Tensor c = at::empty({kFloats});
  EXPECT_TRUE(buffer.Holds(a));
  EXPECT_TRUE(buffer.Holds(b));
  EXPECT_FALSE(buffer.Holds(c));
  EXPECT_EQ((*arena)->stats().served, 2);
  EXPECT_EQ((*arena)->stats().declined, 1);
}

TEST(GradientArenaTest, UninstalledItsBlocksStayValidAndKeepTheBufferMapped) {
  Buffer buffer(1 << 20);
  c10::Allocator* before = c10::GetCPUAllocator();
  auto arena = GradientArena::Install(
      {buffer.base, buffer.bytes, buffer.keep_alive, {kBytes}, kAnyTime});
  ASSERT_TRUE(arena.ok()) << arena.status();
  EXPECT_NE(c10::GetCPUAllocator(), before);
  buffer.keep_alive.reset();  // only the arena and its blocks hold it now
  at::Tensor grad = at::full({kFloats}, 3.0f);
  ASSERT_TRUE(buffer.Holds(grad));
  arena->reset();
  EXPECT_EQ(c10::GetCPUAllocator(), before);
  // LibTorch's allocator serves the size again, and the block the arena
  // served still holds its values while its tensor lives.
  at::Tensor later = at::empty({kFloats});
  EXPECT_FALSE(buffer.Holds(later));
  EXPECT_FALSE(buffer.released);
  EXPECT_EQ(grad.sum().item<float>(), 3.0f * kFloats);
  grad = at::Tensor();
  EXPECT_TRUE(buffer.released);
}

TEST(GradientArenaTest, OneArenaAtATimeAndBadBuffersAreClearErrors) {
  Buffer buffer(1 << 20);
  auto arena = GradientArena::Install(
      {buffer.base, buffer.bytes, buffer.keep_alive, {kBytes}, kAnyTime});
  ASSERT_TRUE(arena.ok()) << arena.status();
  c10::Allocator* installed = c10::GetCPUAllocator();
  auto second = GradientArena::Install(
      {buffer.base, buffer.bytes, buffer.keep_alive, {kBytes}, kAnyTime});
  EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(second.status().message(), "another"))
      << second.status();
  EXPECT_EQ(c10::GetCPUAllocator(), installed);
  arena->reset();

  auto misaligned = GradientArena::Install(
      {static_cast<char*>(buffer.base) + 4, 4096, buffer.keep_alive, {kBytes}});
  EXPECT_EQ(misaligned.status().code(), absl::StatusCode::kInvalidArgument);
  auto no_sizes = GradientArena::Install(
      {buffer.base, buffer.bytes, buffer.keep_alive, {}});
  EXPECT_EQ(no_sizes.status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace ddprun::worker
