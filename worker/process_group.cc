#include "worker/process_group.h"

#include <fcntl.h>
#include <torch/version.h>
#include <unistd.h>

#include <cstdlib>
#include <memory>
#include <string>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "spdlog/spdlog.h"
#include "worker/abortable.h"
#include "worker/broken_pipes.h"
#include "worker/exception_text.h"
#include "worker/gradient_allreduce.h"
#include "worker/grpc_store.h"
#include "worker/lazy_collectives.h"
#include "worker/nccl_group.h"
#include "worker/phase.h"
#include "worker/process_start.h"

namespace ddprun::worker {
namespace {

// torch's TCPStore. LibTorch >= 2.4 asks for its libuv backend by default,
// and one built without libuv (Debian 13's 2.6) refuses ("use_libuv was
// requested but PyTorch was build without libuv support"): there the classic
// backend, which speaks the same protocol to torchrun's store, serves instead.
c10::intrusive_ptr<::c10d::TCPStore> OpenTcpStore(
    const std::string& host, ::c10d::TCPStoreOptions options) {
#if TORCH_VERSION_MAJOR > 2 || \
    (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 2)
  try {
    return c10::make_intrusive<::c10d::TCPStore>(host, options);
  } catch (const c10::Error& e) {
    if (!options.useLibUV ||
        std::string(e.what_without_backtrace()).find("libuv") ==
            std::string::npos) {
      throw;
    }
    options.useLibUV = false;
  }
#endif
  return c10::make_intrusive<::c10d::TCPStore>(host, options);
}

absl::StatusOr<c10::intrusive_ptr<::c10d::Store>> CreateStore(
    const WorkerEnv& env, const ProcessGroupOptions& options) {
  try {
    if (!env.distributed() && env.store_endpoint.empty() &&
        env.master_addr.empty()) {
      return c10::intrusive_ptr<::c10d::Store>(
          c10::make_intrusive<::c10d::HashStore>());
    }
    if (!env.store_endpoint.empty()) {
      // The scope is (run, round): Gloo writes the same keys every round, and
      // a stale worker must never read the next round's addresses.
      StoreClientOptions store_options;
      store_options.endpoint = env.store_endpoint;
      store_options.run_id = env.store_run_id;
      store_options.round = env.round;
      store_options.credentials = env.credentials;
      return c10::intrusive_ptr<::c10d::Store>(
          c10::make_intrusive<GrpcStore>(store_options, options.timeout));
    }
    // Under torchrun: its agent (or rank 0) serves a TCPStore there.
    ::c10d::TCPStoreOptions tcp;
    tcp.port = static_cast<uint16_t>(env.master_port);
    tcp.isServer = env.rank == 0 && !env.use_agent_store;
    tcp.numWorkers = env.world_size;
    tcp.waitWorkers = false;
    tcp.timeout = options.timeout;
    auto tcp_store = OpenTcpStore(env.master_addr, tcp);
    return c10::intrusive_ptr<::c10d::Store>(
        c10::make_intrusive<::c10d::PrefixStore>(
            absl::StrFormat("ddprun/attempt_%d", env.restart_count),
            tcp_store));
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrFormat(
        "cannot reach the store (%s): %s",
        env.store_endpoint.empty()
            ? absl::StrFormat("MASTER_ADDR %s:%d", env.master_addr,
                              env.master_port)
            : absl::StrFormat("DDPRUN_STORE_ENDPOINT %s", env.store_endpoint),
        ExceptionText(e)));
  }
}

absl::StatusOr<c10::intrusive_ptr<Collectives>> CreateGloo(
    const c10::intrusive_ptr<::c10d::Store>& store, const WorkerEnv& env,
    const ProcessGroupOptions& options) {
  auto gloo_options =
      ::c10d::ProcessGroupGloo::Options::create(options.timeout);
  std::string where;
  try {
    const char* ifname = env.gloo_socket_ifname.c_str();
    if (ifname[0] != '\0') {
      where = absl::StrFormat("GLOO_SOCKET_IFNAME=%s", ifname);
      for (absl::string_view name :
           absl::StrSplit(ifname, ',', absl::SkipEmpty())) {
        gloo_options->devices.push_back(
            ::c10d::ProcessGroupGloo::createDeviceForInterface(
                std::string(name)));
      }
    } else {
      std::string host = env.local_addr.empty() ? "127.0.0.1" : env.local_addr;
      where = absl::StrFormat("address %s", host);
      gloo_options->devices.push_back(
          ::c10d::ProcessGroupGloo::createDeviceForHostname(host));
    }
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "Gloo cannot bind to %s: %s; set DDPRUN_LOCAL_ADDR to an address of "
        "this host or GLOO_SOCKET_IFNAME to an interface",
        where, ExceptionText(e)));
  }
  // Abortable: a round that ends while its group connects (a peer stopped
  // or killed in the middle) must not hold this worker past it.
  absl::StatusOr<c10::intrusive_ptr<Collectives>> formed = FormAbortably(
      [store, rank = env.rank, size = env.world_size, gloo_options] {
        return c10::intrusive_ptr<Collectives>(
            c10::make_intrusive<::c10d::ProcessGroupGloo>(store, rank, size,
                                                          gloo_options));
      });
  if (formed.ok() || formed.status().code() != absl::StatusCode::kUnavailable) {
    return formed;
  }
  return absl::UnavailableError(absl::StrFormat(
      "cannot form the Gloo group (%s, bound to %s): %s; check that every "
      "rank started and can reach the others",
      env.Describe(), where, formed.status().message()));
}

absl::StatusOr<std::unique_ptr<GradientAllreduce>> CreateGradientAllreduce(
    const c10::intrusive_ptr<::c10d::Store>& store, const WorkerEnv& env,
    const ProcessGroupOptions& options) {
  GradientAllreduceOptions gradient;
  gradient.store = store;
  gradient.rank = env.rank;
  gradient.world_size = env.world_size;
  gradient.shm_dir = ReadShmDir();
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  gradient.host = host;
  // Unique per run and round: a stale worker never meets the next round's.
  gradient.segment_name = absl::StrFormat(
      "allreduce-%s-%d.shm",
      absl::StrReplaceAll(env.store_run_id.empty() ? "job" : env.store_run_id,
                          {{"/", "_"}}),
      env.round);
  gradient.timeout = options.gradient_timeout.count() > 0
                         ? options.gradient_timeout
                         : options.timeout;
  gradient.make_leaders = [&env, &options](
                              const c10::intrusive_ptr<::c10d::Store>& leaders,
                              int node, int nodes) {
    WorkerEnv leader_env = env;
    leader_env.rank = node;
    leader_env.world_size = nodes;
    return CreateGloo(leaders, leader_env, options);
  };
  return GradientAllreduce::Create(gradient);
}

}  // namespace

absl::StatusOr<BackendKind> ParseBackend(const std::string& name) {
  if (name == "auto") return BackendKind::kAuto;
  if (name == "gloo") return BackendKind::kGloo;
  if (name == "nccl") return BackendKind::kNccl;
  return absl::InvalidArgumentError(
      absl::StrFormat("unknown backend '%s'; use auto, gloo or nccl", name));
}

std::string BackendName(BackendKind kind) {
  switch (kind) {
    case BackendKind::kAuto:
      return "auto";
    case BackendKind::kGloo:
      return "gloo";
    case BackendKind::kNccl:
      return "nccl";
  }
  return "?";
}

absl::StatusOr<ProcessGroup> CreateProcessGroup(
    const WorkerEnv& env, const ProcessGroupOptions& options) {
  IgnoreBrokenPipes();
  if (env.progress_fd >= 0) {
    // A step never waits for the agent to read its records (ddprun makes
    // the pipe non-blocking too; another parent may not).
    const int flags = fcntl(env.progress_fd, F_GETFL);
    if (flags >= 0) fcntl(env.progress_fd, F_SETFL, flags | O_NONBLOCK);
  }
  ReportPhase(env.progress_fd, common::Phase::kJoin);
  ProcessGroup group;
  group.rank = env.rank;
  group.world_size = env.world_size;
  group.progress_fd = env.progress_fd;
  group.backend = options.backend;
  if (group.backend == BackendKind::kAuto) {
    group.backend = NcclUsable() ? BackendKind::kNccl : BackendKind::kGloo;
  }
  if (group.backend == BackendKind::kNccl) {
    if (!NcclUsable()) {
      // The stub's message says why (no CUDA build or no GPU).
      absl::StatusOr<c10::intrusive_ptr<Collectives>> none =
          CreateNcclCollectives({}, env, options.timeout);
      if (!none.ok()) return none.status();
      return absl::FailedPreconditionError(
          "ProcessGroupOptions::backend is BackendKind::kNccl but no GPU is "
          "visible; use BackendKind::kAuto or kGloo");
    }
    group.device =
        c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(env.local_rank));
  }
  if (!env.distributed() && !options.force_collectives) return group;

  absl::StatusOr<c10::intrusive_ptr<::c10d::Store>> store =
      CreateStore(env, options);
  if (!store.ok()) return store.status();
  group.store = *store;
  spdlog::debug("{:.3f} s after start: store client made",
                SecondsSinceProcessStart());
  // The gradient path first: where it is shared memory alone, Gloo is
  // formed only when a collective needs it (LazyCollectives says why).
  if (group.backend == BackendKind::kGloo) {
    if (options.gradient_sync == GradientSync::kProcessGroup) {
      if (env.rank == 0) {
        spdlog::info(
            "gradient allreduce: process group (GradientSync::kProcessGroup)");
      }
    } else {
      absl::StatusOr<std::unique_ptr<GradientAllreduce>> gradient =
          CreateGradientAllreduce(group.store, env, options);
      if (!gradient.ok()) return gradient.status();
      group.direct = std::move(*gradient);
      if (group.direct) group.gradient_path = group.direct->path();
    }
  }
  if (group.gradient_path == GradientPath::kSharedMemory) {
    auto lazy = c10::make_intrusive<LazyCollectives>(
        group.store, env.rank, env.world_size, "gloo",
        [env, options](c10::intrusive_ptr<::c10d::Store> store) {
          return CreateGloo(store, env, options);
        });
    group.lazy = lazy.get();
    group.collectives = std::move(lazy);
    return group;
  }
  absl::StatusOr<c10::intrusive_ptr<Collectives>> collectives =
      group.backend == BackendKind::kNccl
          ? CreateNcclCollectives(group.store, env, options.timeout)
          : CreateGloo(group.store, env, options);
  if (!collectives.ok()) return collectives.status();
  group.collectives = *collectives;
  spdlog::debug("{:.3f} s after start: {} group formed",
                SecondsSinceProcessStart(), BackendName(group.backend));
  return group;
}

void ReleaseIdleCollectives(ProcessGroup& group) {
  // Only while `collectives` still owns it (a program may have replaced it).
  if (group.lazy && group.collectives.get() == group.lazy) {
    group.lazy->Release();
  }
}

}  // namespace ddprun::worker
