#include "worker/lazy_collectives.h"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <utility>

#include "absl/strings/str_format.h"

namespace ddprun::worker {

LazyCollectives::LazyCollectives(c10::intrusive_ptr<::c10d::Store> store,
                                 int rank, int size, std::string backend_name,
                                 Factory make)
    : Collectives(rank, size),
      store_(std::move(store)),
      backend_name_(std::move(backend_name)),
      make_(std::move(make)) {}

c10::intrusive_ptr<Collectives> LazyCollectives::Group() {
  std::lock_guard<std::mutex> lock(mu_);
  if (group_) return group_;
  // Each group its own keys: a released group's never meet the next one's.
  auto prefixed = c10::make_intrusive<::c10d::PrefixStore>(
      absl::StrFormat("lazy_%d", formed_), store_);
  absl::StatusOr<c10::intrusive_ptr<Collectives>> group = make_(prefixed);
  TORCH_CHECK(group.ok(), std::string(group.status().message()));
  group_ = *std::move(group);
  ++formed_;
  return group_;
}

void LazyCollectives::Release() {
  c10::intrusive_ptr<Collectives> group;
  {
    std::lock_guard<std::mutex> lock(mu_);
    group = std::move(group_);
  }
  // The last reference: ProcessGroupGloo's destructor waits for its work
  // queue, then closes its pairs and stops the transport thread.
}

int64_t LazyCollectives::formed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return formed_;
}

bool LazyCollectives::held() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<bool>(group_);
}

c10::intrusive_ptr<::c10d::Work> LazyCollectives::broadcast(
    std::vector<at::Tensor>& tensors, const ::c10d::BroadcastOptions& opts) {
  return Group()->broadcast(tensors, opts);
}

c10::intrusive_ptr<::c10d::Work> LazyCollectives::allreduce(
    std::vector<at::Tensor>& tensors, const ::c10d::AllreduceOptions& opts) {
  return Group()->allreduce(tensors, opts);
}

c10::intrusive_ptr<::c10d::Work> LazyCollectives::allreduce_coalesced(
    std::vector<at::Tensor>& tensors,
    const ::c10d::AllreduceCoalescedOptions& opts) {
  return Group()->allreduce_coalesced(tensors, opts);
}

c10::intrusive_ptr<::c10d::Work> LazyCollectives::reduce(
    std::vector<at::Tensor>& tensors, const ::c10d::ReduceOptions& opts) {
  return Group()->reduce(tensors, opts);
}

c10::intrusive_ptr<::c10d::Work> LazyCollectives::allgather(
    std::vector<std::vector<at::Tensor>>& outputs,
    std::vector<at::Tensor>& inputs, const ::c10d::AllgatherOptions& opts) {
  return Group()->allgather(outputs, inputs, opts);
}

c10::intrusive_ptr<::c10d::Work> LazyCollectives::_allgather_base(
    at::Tensor& output, at::Tensor& input,
    const ::c10d::AllgatherOptions& opts) {
  return Group()->_allgather_base(output, input, opts);
}

c10::intrusive_ptr<::c10d::Work> LazyCollectives::gather(
    std::vector<std::vector<at::Tensor>>& outputs,
    std::vector<at::Tensor>& inputs, const ::c10d::GatherOptions& opts) {
  return Group()->gather(outputs, inputs, opts);
}

c10::intrusive_ptr<::c10d::Work> LazyCollectives::scatter(
    std::vector<at::Tensor>& outputs,
    std::vector<std::vector<at::Tensor>>& inputs,
    const ::c10d::ScatterOptions& opts) {
  return Group()->scatter(outputs, inputs, opts);
}

c10::intrusive_ptr<::c10d::Work> LazyCollectives::reduce_scatter(
    std::vector<at::Tensor>& outputs,
    std::vector<std::vector<at::Tensor>>& inputs,
    const ::c10d::ReduceScatterOptions& opts) {
  return Group()->reduce_scatter(outputs, inputs, opts);
}

c10::intrusive_ptr<::c10d::Work> LazyCollectives::alltoall_base(
    at::Tensor& output, at::Tensor& input,
    std::vector<int64_t>& output_split_sizes,
    std::vector<int64_t>& input_split_sizes,
    const ::c10d::AllToAllOptions& opts) {
  return Group()->alltoall_base(output, input, output_split_sizes,
                                input_split_sizes, opts);
}

c10::intrusive_ptr<::c10d::Work> LazyCollectives::alltoall(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const ::c10d::AllToAllOptions& opts) {
  return Group()->alltoall(outputs, inputs, opts);
}

c10::intrusive_ptr<::c10d::Work> LazyCollectives::send(
    std::vector<at::Tensor>& tensors, int dst_rank, int tag) {
  return Group()->send(tensors, dst_rank, tag);
}

c10::intrusive_ptr<::c10d::Work> LazyCollectives::recv(
    std::vector<at::Tensor>& tensors, int src_rank, int tag) {
  return Group()->recv(tensors, src_rank, tag);
}

c10::intrusive_ptr<::c10d::Work> LazyCollectives::barrier(
    const ::c10d::BarrierOptions& opts) {
  return Group()->barrier(opts);
}

}  // namespace ddprun::worker
