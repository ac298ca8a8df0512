// A worker for the multi-process tests: builds the process group from its
// environment (as ddprun sets it), then allreduces and broadcasts known
// values and checks them. Exit 0 only when every check held; otherwise one
// line on stderr says which.
#include <ATen/ATen.h>

#include <cstdlib>
#include <iostream>

#include "worker/grpc_store.h"
#include "worker/process_group.h"
#include "worker/worker_env.h"

namespace {

int Fail(const std::string& what) {
  std::cerr << "pg_helper: " << what << std::endl;
  return 1;
}

int Run() {
  auto env = ddprun::worker::ReadWorkerEnv();
  if (!env.ok()) return Fail(env.status().ToString());
  ddprun::worker::ProcessGroupOptions options;
  // PG_HELPER_BACKEND: gloo (default) or nccl (tests/gpu/run.sh).
  const char* backend = std::getenv("PG_HELPER_BACKEND");
  auto kind = ddprun::worker::ParseBackend(backend ? backend : "gloo");
  if (!kind.ok()) return Fail(kind.status().ToString());
  options.backend = *kind;
  options.force_collectives = true;  // world 1 too: checks NCCL on one GPU
  options.timeout = std::chrono::seconds(30);
  if (const char* ms = std::getenv("PG_HELPER_TIMEOUT_MS")) {
    options.timeout = std::chrono::milliseconds(std::atoll(ms));
  }
  auto group = ddprun::worker::CreateProcessGroup(*env, options);
  if (!group.ok()) return Fail(group.status().ToString());
  const int rank = env->rank;
  const int world = env->world_size;
  // The store's keys once the group is made and after the collectives (NCCL
  // sends its unique ID through the store at its first collective).
  // PG_HELPER_EXPECT_STORE=1 (tests/gpu/run.sh): the group must have used
  // the rendezvous's gRPC store, even in a world of one.
  const bool expect_store = std::getenv("PG_HELPER_EXPECT_STORE") != nullptr;
  if (expect_store &&
      dynamic_cast<ddprun::worker::GrpcStore*>(group->store.get()) == nullptr) {
    return Fail(
        "the group's store is not the gRPC store (DDPRUN_STORE_ENDPOINT "
        "unset?)");
  }
  const int64_t keys_made = group->store ? group->store->getNumKeys() : 0;

  // allreduce(sum) of rank+1 everywhere: 1 + 2 + ... + world.
  const at::TensorOptions on =
      at::TensorOptions(at::kFloat).device(group->device);
  std::vector<at::Tensor> sum = {at::full({1000}, rank + 1.0f, on)};
  group->collectives->allreduce(sum)->wait();
  const float expected = world * (world + 1) / 2.0f;
  if (!sum[0].eq(expected).all().item<bool>()) {
    return Fail("allreduce gave " + std::to_string(sum[0][0].item<float>()) +
                ", expected " + std::to_string(expected));
  }
  // broadcast from rank 0 of 0, 1, 2, ...
  std::vector<at::Tensor> data = {rank == 0 ? at::arange(257, on)
                                            : at::zeros({257}, on)};
  ::c10d::BroadcastOptions broadcast;
  broadcast.rootRank = 0;
  group->collectives->broadcast(data, broadcast)->wait();
  if (!data[0].cpu().equal(at::arange(257, at::kFloat))) {
    return Fail("broadcast did not deliver rank 0's values");
  }
  const int64_t keys_used = group->store ? group->store->getNumKeys() : 0;
  if (expect_store && keys_used == 0) {
    return Fail("the store holds no key after the collectives");
  }
  if (group->store) {
    std::cout << "rank " << rank << " store keys: " << keys_made
              << " after the group was made, " << keys_used
              << " after the collectives" << std::endl;
  }
  std::cout << "rank " << rank << " ok ("
            << ddprun::worker::BackendName(group->backend) << ")" << std::endl;
  return 0;
}

}  // namespace

int main() {
  try {
    return Run();
  } catch (const std::exception& e) {
    return Fail(e.what());
  }
}
