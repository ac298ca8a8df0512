#pragma once

#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/torch_compat.h"

namespace ddprun::worker {

// A process group formed on its first collective and dropped by Release,
// for ranks that need it only now and then: when every rank of a round
// shares one node, gradients go through shared memory (GradientAllreduce)
// and Gloo carries only the start-up broadcasts and a recovery's state
// sync. A formed Gloo group keeps a transport thread that wakes 100 times a
// second (epoll_wait with a 10 ms timeout) and takes the cores the ranks
// train on; released, it holds no thread and no socket.
//
// Every rank must call the collectives and Release in the same order (as
// for any process group): the n-th group is formed by all ranks over
// `store` under the prefix "lazy_<n>/". A failure to form it throws
// c10::Error, as a collective of a broken group does. Thread-safe.
class LazyCollectives final : public Collectives {
 public:
  // The store by value: with a const reference, Debian 13's Abseil fails a
  // static assertion in StatusOr's conversion checks (the 2.6 builds).
  using Factory = std::function<absl::StatusOr<c10::intrusive_ptr<Collectives>>(
      c10::intrusive_ptr<::c10d::Store> store)>;

  LazyCollectives(c10::intrusive_ptr<::c10d::Store> store, int rank, int size,
                  std::string backend_name, Factory make);

  // Drops the group (its threads and sockets) once its pending work is
  // done; the next collective forms a new one. Call on every rank at the
  // same point.
  void Release();
  // Groups formed so far, and whether one is held now.
  int64_t formed() const;
  bool held() const;

  const std::string getBackendName() const override { return backend_name_; }

  c10::intrusive_ptr<::c10d::Work> broadcast(
      std::vector<at::Tensor>& tensors,
      const ::c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> allreduce(
      std::vector<at::Tensor>& tensors,
      const ::c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors,
      const ::c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> reduce(
      std::vector<at::Tensor>& tensors,
      const ::c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> allgather(
      std::vector<std::vector<at::Tensor>>& outputs,
      std::vector<at::Tensor>& inputs,
      const ::c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> _allgather_base(
      at::Tensor& output, at::Tensor& input,
      const ::c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> gather(
      std::vector<std::vector<at::Tensor>>& outputs,
      std::vector<at::Tensor>& inputs,
      const ::c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> scatter(
      std::vector<at::Tensor>& outputs,
      std::vector<std::vector<at::Tensor>>& inputs,
      const ::c10d::ScatterOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> reduce_scatter(
      std::vector<at::Tensor>& outputs,
      std::vector<std::vector<at::Tensor>>& inputs,
      const ::c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> alltoall_base(
      at::Tensor& output, at::Tensor& input,
      std::vector<int64_t>& output_split_sizes,
      std::vector<int64_t>& input_split_sizes,
      const ::c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> alltoall(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const ::c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> send(std::vector<at::Tensor>& tensors,
                                        int dst_rank, int tag) override;
  c10::intrusive_ptr<::c10d::Work> recv(std::vector<at::Tensor>& tensors,
                                        int src_rank, int tag) override;
  c10::intrusive_ptr<::c10d::Work> barrier(
      const ::c10d::BarrierOptions& opts) override;

 private:
  // The group, formed when none is held.
  c10::intrusive_ptr<Collectives> Group();

  const c10::intrusive_ptr<::c10d::Store> store_;
  const std::string backend_name_;
  const Factory make_;
  mutable std::mutex mu_;
  c10::intrusive_ptr<Collectives> group_;  // guarded by mu_
  int64_t formed_ = 0;                     // guarded by mu_
};

}  // namespace ddprun::worker
