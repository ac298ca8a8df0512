#include "worker/gradient_allreduce.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/from_blob.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <thread>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "spdlog/spdlog.h"
#include "worker/abortable.h"
#include "worker/exception_text.h"

namespace ddprun::worker {
namespace {

constexpr char kPrefix[] = "ddp_grad/";

std::vector<uint8_t> Bytes(const std::string& s) {
  return std::vector<uint8_t>(s.begin(), s.end());
}
std::string String(const std::vector<uint8_t>& b) {
  return std::string(b.begin(), b.end());
}

// Segments of earlier rounds of this agent's job whose ranks died before
// every rank mapped them (otherwise their names are gone already): nobody
// can attach to them any more.
void RemoveStaleSegments(const std::string& dir, const std::string& current) {
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (absl::StartsWith(name, "allreduce-") && name != current) {
      std::filesystem::remove(entry.path(), ec);
    }
  }
}

}  // namespace

std::string GradientPathName(GradientPath path) {
  switch (path) {
    case GradientPath::kProcessGroup:
      return "process-group";
    case GradientPath::kSharedMemory:
      return "shared-memory";
    case GradientPath::kHierarchical:
      return "hierarchical";
  }
  return "?";
}

GradientAllreduce::~GradientAllreduce() {
  if (!abandoned_) return;
  // Destroying the group now would wait for its pending work (up to its
  // timeout), and the work may still write into the segment.
  std::thread([work = std::move(abandoned_), leaders = std::move(leaders_),
               shm = std::move(shm_)] {
    try {
      work->wait();
    } catch (const std::exception&) {
      // Expected: the peer is gone or the group timed out.
    }
  }).detach();
}

absl::StatusOr<std::unique_ptr<GradientAllreduce>> GradientAllreduce::Create(
    const GradientAllreduceOptions& options) {
  const auto& store = options.store;
  const int world = options.world_size;
  // Nodes: ranks that name the same host and folder, in order of their
  // first rank. Every rank reads every rank's entry, so all derive the same.
  std::vector<std::vector<int>> nodes;
  int my_node = -1;
  try {
    store->set(absl::StrCat(kPrefix, "node/", options.rank),
               Bytes(options.shm_dir.empty()
                         ? std::string()
                         : absl::StrCat(options.host, "|", options.shm_dir)));
    std::map<std::string, int> node_of_key;
    for (int r = 0; r < world; ++r) {
      std::string key = String(store->get(absl::StrCat(kPrefix, "node/", r)));
      int node;
      if (key.empty()) {
        node = static_cast<int>(nodes.size());
        nodes.emplace_back();
      } else if (auto it = node_of_key.find(key); it != node_of_key.end()) {
        node = it->second;
      } else {
        node = static_cast<int>(nodes.size());
        node_of_key[key] = node;
        nodes.emplace_back();
      }
      nodes[node].push_back(r);
      if (r == options.rank) my_node = node;
    }
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrFormat(
        "gradient allreduce: rank %d cannot exchange node layouts through "
        "the store: %s; check that every rank started",
        options.rank, ExceptionText(e)));
  }
  size_t largest = 0;
  for (const auto& node : nodes) largest = std::max(largest, node.size());
  if (largest < 2) {
    if (options.rank == 0) {
      spdlog::info(
          "gradient allreduce: process group (no two ranks share a node's "
          "DDPRUN_SHM_DIR{})",
          options.shm_dir.empty() ? "; it is unset, e.g. under torchrun" : "");
    }
    return nullptr;
  }

  std::unique_ptr<GradientAllreduce> made(new GradientAllreduce());
  const std::vector<int>& mine = nodes[my_node];
  const int local_size = static_cast<int>(mine.size());
  const int local_rank = static_cast<int>(
      std::find(mine.begin(), mine.end(), options.rank) - mine.begin());
  const int node_count = static_cast<int>(nodes.size());
  made->hierarchical_ = node_count > 1;
  made->slice_floats_ = made->hierarchical_ ? options.hierarchical_slice_floats
                                            : options.slice_floats;
  made->path_ = made->hierarchical_ ? GradientPath::kHierarchical
                                    : GradientPath::kSharedMemory;

  if (local_size > 1) {
    ShmAllreduceOptions shm;
    shm.dir = options.shm_dir;
    shm.name = options.segment_name;
    shm.local_rank = local_rank;
    shm.local_size = local_size;
    shm.timeout = options.timeout;
    shm.slice_floats = made->slice_floats_;
    const std::string ready = absl::StrCat(kPrefix, "segment/", my_node);
    absl::StatusOr<std::unique_ptr<ShmAllreduce>> segment;
    try {
      if (local_rank == 0) {
        RemoveStaleSegments(options.shm_dir, options.segment_name);
        segment = ShmAllreduce::Create(shm);
        // The others attach only once it exists; a failure reaches them too.
        store->set(ready, Bytes(segment.ok() ? std::string("ok")
                                             : segment.status().ToString()));
      } else {
        std::string state = String(store->get(ready));
        segment = state == "ok"
                      ? ShmAllreduce::Attach(shm)
                      : absl::UnavailableError(absl::StrCat(
                            "local rank 0 could not create it: ", state));
      }
    } catch (const std::exception& e) {
      segment = absl::UnavailableError(absl::StrCat(
          "cannot coordinate through the store: ", ExceptionText(e)));
    }
    if (!segment.ok()) {
      return absl::Status(
          segment.status().code(),
          absl::StrFormat(
              "gradient allreduce: rank %d cannot share a segment in %s: %s; "
              "free space there, or set ProcessGroupOptions::gradient_sync "
              "to GradientSync::kProcessGroup to use the process group",
              options.rank, options.shm_dir, segment.status().message()));
    }
    made->shm_ = std::move(*segment);
  }
  if (made->hierarchical_ && local_rank == 0) {
    auto leaders_store = c10::make_intrusive<::c10d::PrefixStore>(
        absl::StrCat(kPrefix, "leaders"), store);
    absl::StatusOr<c10::intrusive_ptr<Collectives>> leaders =
        options.make_leaders(leaders_store, my_node, node_count);
    if (!leaders.ok()) {
      if (made->shm_)
        made->shm_->Abort(std::string(leaders.status().message()));
      return leaders.status();
    }
    made->leaders_ = *leaders;
  }
  made->description_ =
      made->hierarchical_
          ? absl::StrFormat(
                "hierarchical: %d nodes, shared memory inside each (this "
                "one: %d local ranks), Gloo between the node leaders",
                node_count, local_size)
          : absl::StrFormat("shared memory: %d local ranks through %s",
                            local_size, made->shm_->path());
  auto log = options.rank == 0 ? spdlog::level::info : spdlog::level::debug;
  spdlog::log(log, "gradient allreduce: {}", made->description_);
  return made;
}

absl::Status GradientAllreduce::BetweenNodes(float* data, int64_t count) {
  if (abandoned_) {
    return absl::AbortedError(
        "gradient allreduce between the node leaders: an earlier one was "
        "given up when the round ended");
  }
  try {
    std::vector<at::Tensor> tensors = {
        at::from_blob(data, {count}, at::kFloat)};
    c10::intrusive_ptr<::c10d::Work> work = leaders_->allreduce(tensors);
    if (!WaitUnlessAborted(work)) {
      abandoned_ = std::move(work);
      return absl::AbortedError(
          "gradient allreduce between the node leaders given up: the round "
          "ended (a peer stopped, died or moved on)");
    }
    return absl::OkStatus();
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat(
        "gradient allreduce between the node leaders failed: ",
        ExceptionText(e),
        "; a rank on another node has probably died (its log says why)"));
  }
}

absl::StatusOr<float*> GradientAllreduce::MapResident(int64_t floats) {
  if (resident_ != nullptr || !in_place_capable()) {
    return absl::FailedPreconditionError(
        "gradient allreduce: MapResident is for one node whose ranks share "
        "memory, once per group");
  }
  absl::StatusOr<float*> mapped = shm_->MapResident(floats);
  if (!mapped.ok()) {
    return absl::Status(
        mapped.status().code(),
        absl::StrCat("gradient allreduce: ", mapped.status().message(),
                     "; free space in DDPRUN_SHM_DIR (the gradients are "
                     "copied through the segment meanwhile)"));
  }
  resident_ = *mapped;
  return resident_;
}

void GradientAllreduce::RunInPlace(absl::Span<const ShmAllreduce::Part> parts,
                                   float divisor) {
  if (!in_place_capable()) {
    Run(parts, divisor);
    return;
  }
  int64_t count = 0;
  for (const ShmAllreduce::Part& p : parts) count += p.count;
  if (count <= 0) return;  // the same on every rank
  absl::Status status = shm_->AllreduceInPlace(parts, divisor);
  TORCH_CHECK(status.ok(), status.message());
  runs_.fetch_add(1);
}

void GradientAllreduce::Run(float* data, int64_t count) {
  const ShmAllreduce::Part whole{data, count};
  Run(absl::MakeConstSpan(&whole, 1), 1.0f);
}

void GradientAllreduce::Run(absl::Span<const ShmAllreduce::Part> parts,
                            float divisor) {
  int64_t count = 0;
  for (const ShmAllreduce::Part& p : parts) count += p.count;
  if (count <= 0) return;  // the same on every rank
  absl::Status status;
  if (shm_) {
    ShmAllreduce::BetweenNodes between;
    if (hierarchical_) {
      between = [this](float* d, int64_t n) { return BetweenNodes(d, n); };
    }
    status = shm_->Allreduce(parts, divisor, between);
  } else {
    // The only rank of its node: in the slices the other leaders use, so
    // that every leader's Gloo call has the same size. Parts go through
    // one contiguous buffer (a rare layout: no node shares memory with it).
    float* data = parts.size() == 1 ? parts[0].data : nullptr;
    std::vector<float> gathered;
    if (data == nullptr) {
      gathered.reserve(count);
      for (const ShmAllreduce::Part& p : parts) {
        gathered.insert(gathered.end(), p.data, p.data + p.count);
      }
      data = gathered.data();
    }
    for (int64_t offset = 0; offset < count && status.ok();
         offset += slice_floats_) {
      status =
          BetweenNodes(data + offset, std::min(slice_floats_, count - offset));
    }
    if (divisor != 1.0f || !gathered.empty()) {
      int64_t at = 0;
      for (const ShmAllreduce::Part& p : parts) {
        for (int64_t i = 0; i < p.count; ++i)
          p.data[i] = data[at + i] / divisor;
        at += p.count;
      }
    }
  }
  TORCH_CHECK(status.ok(), status.message());
  runs_.fetch_add(1);
}

}  // namespace ddprun::worker
