#include "worker/checkpoint.h"

#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>
#include <vector>

#include <ATen/core/Dict.h>
#include <torch/csrc/jit/serialization/pickle.h>

#include "absl/strings/numbers.h"
#include "absl/strings/strip.h"
#include "absl/strings/str_format.h"
#include "spdlog/spdlog.h"
#include "worker/atomic_file.h"

namespace ddprun::worker {

std::map<std::string, at::Tensor> StateDict(const torch::nn::Module& module) {
  std::map<std::string, at::Tensor> out;
  for (const auto& item : module.named_parameters(/*recurse=*/true)) {
    out[item.key()] = item.value().detach().cpu().contiguous();
  }
  for (const auto& item : module.named_buffers(/*recurse=*/true)) {
    out[item.key()] = item.value().detach().cpu().contiguous();
  }
  return out;
}

absl::Status SaveStateDict(const std::string& path,
                           const std::map<std::string, at::Tensor>& tensors) {
  c10::Dict<std::string, at::Tensor> dict;
  for (const auto& [name, tensor] : tensors) dict.insert(name, tensor);
  std::vector<char> bytes;
  try {
    bytes = torch::jit::pickle_save(c10::IValue(dict));
  } catch (const std::exception& e) {
    return absl::InternalError(
        absl::StrFormat("cannot serialize the model for %s: %s", path, e.what()));
  }
  return WriteFileAtomically(path, absl::string_view(bytes.data(), bytes.size()));
}

absl::StatusOr<std::map<std::string, at::Tensor>> LoadStateDict(
    const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(absl::StrFormat(
        "cannot read the model file %s; check the path", path));
  }
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)),
                          std::istreambuf_iterator<char>());
  std::map<std::string, at::Tensor> out;
  try {
    c10::IValue value = torch::jit::pickle_load(bytes);
    for (const auto& entry : value.toGenericDict()) {
      out[entry.key().toStringRef()] = entry.value().toTensor();
    }
  } catch (const std::exception& e) {
    return absl::DataLossError(absl::StrFormat(
        "model file %s is not a saved state dict: %s", path, e.what()));
  }
  return out;
}

namespace {

constexpr char kPrefix[] = "ckpt-";
constexpr char kSuffix[] = ".pt";

// Steps of the checkpoint files in `dir`, newest first.
std::vector<int64_t> ListCheckpoints(const std::string& dir) {
  std::vector<int64_t> steps;
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return steps;
  while (struct dirent* entry = readdir(d)) {
    absl::string_view name = entry->d_name;
    if (!absl::ConsumePrefix(&name, kPrefix) ||
        !absl::ConsumeSuffix(&name, kSuffix)) {
      continue;
    }
    int64_t step = 0;
    if (absl::SimpleAtoi(name, &step)) steps.push_back(step);
  }
  closedir(d);
  std::sort(steps.rbegin(), steps.rend());
  return steps;
}

std::string CheckpointPath(const std::string& dir, int64_t step) {
  return absl::StrFormat("%s/%s%010d%s", dir, kPrefix, step, kSuffix);
}

absl::Status MakeDirs(const std::string& dir) {
  std::string partial;
  for (size_t i = 0; i <= dir.size(); ++i) {
    if (i == dir.size() || (dir[i] == '/' && i > 0)) {
      partial = dir.substr(0, i);
      if (mkdir(partial.c_str(), 0755) != 0 && errno != EEXIST) {
        return absl::PermissionDeniedError(absl::StrFormat(
            "cannot create the checkpoint folder %s: %s; choose a writable "
            "--checkpoint-dir",
            partial, std::strerror(errno)));
      }
    }
  }
  return absl::OkStatus();
}

c10::impl::GenericDict NewDict() {
  return c10::impl::GenericDict(c10::StringType::get(), c10::AnyType::get());
}

absl::StatusOr<TrainingCheckpoint> ReadCheckpoint(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrFormat("cannot read %s", path));
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)),
                          std::istreambuf_iterator<char>());
  TrainingCheckpoint c;
  try {
    c10::impl::GenericDict dict = torch::jit::pickle_load(bytes).toGenericDict();
    for (const auto& entry : dict.at("model").toGenericDict()) {
      c.model[entry.key().toStringRef()] = entry.value().toTensor();
    }
    c10::impl::GenericDict optimizer = dict.at("optimizer").toGenericDict();
    c.lr = optimizer.at("param_groups").toList().get(0).toGenericDict().at("lr").toDouble();
    c.epoch = dict.at("epoch").toInt();
    c.epoch_position = dict.at("epoch_position").toInt();
    c.step = dict.at("step").toInt();
    c.seed = static_cast<uint64_t>(dict.at("seed").toInt());
    c.world_size = static_cast<int>(dict.at("world_size").toInt());
  } catch (const std::exception& e) {
    return absl::DataLossError(absl::StrFormat(
        "checkpoint %s does not read: %s", path, e.what()));
  }
  return c;
}

}  // namespace

absl::Status SaveCheckpoint(const std::string& dir,
                            const TrainingCheckpoint& checkpoint, int keep) {
  absl::Status made = MakeDirs(dir);
  if (!made.ok()) return made;
  c10::impl::GenericDict model = NewDict();
  for (const auto& [name, tensor] : checkpoint.model) model.insert(name, tensor);
  c10::impl::GenericDict group = NewDict();
  group.insert("lr", checkpoint.lr);
  group.insert("momentum", 0.0);
  group.insert("dampening", 0.0);
  group.insert("weight_decay", 0.0);
  group.insert("nesterov", false);
  c10::impl::GenericList groups(c10::AnyType::get());
  groups.push_back(group);
  c10::impl::GenericDict optimizer = NewDict();
  optimizer.insert("state", NewDict());
  optimizer.insert("param_groups", groups);
  c10::impl::GenericDict dict = NewDict();
  dict.insert("model", model);
  dict.insert("optimizer", optimizer);
  dict.insert("epoch", checkpoint.epoch);
  dict.insert("epoch_position", checkpoint.epoch_position);
  dict.insert("step", checkpoint.step);
  dict.insert("seed", static_cast<int64_t>(checkpoint.seed));
  dict.insert("world_size", static_cast<int64_t>(checkpoint.world_size));
  std::vector<char> bytes;
  try {
    bytes = torch::jit::pickle_save(c10::IValue(dict));
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrFormat(
        "cannot serialize the checkpoint of step %d: %s", checkpoint.step, e.what()));
  }
  absl::Status written = WriteFileAtomically(
      CheckpointPath(dir, checkpoint.step), absl::string_view(bytes.data(), bytes.size()));
  if (!written.ok()) return written;
  std::vector<int64_t> steps = ListCheckpoints(dir);
  for (size_t i = std::max(keep, 1); i < steps.size(); ++i) {
    std::remove(CheckpointPath(dir, steps[i]).c_str());
  }
  return absl::OkStatus();
}

absl::StatusOr<std::optional<TrainingCheckpoint>> LoadNewestCheckpoint(
    const std::string& dir) {
  for (int64_t step : ListCheckpoints(dir)) {
    absl::StatusOr<TrainingCheckpoint> c = ReadCheckpoint(CheckpointPath(dir, step));
    if (c.ok()) return std::optional<TrainingCheckpoint>(std::move(*c));
    spdlog::warn("skipping checkpoint: {}", std::string(c.status().message()));
  }
  return std::optional<TrainingCheckpoint>();
}

}  // namespace ddprun::worker
