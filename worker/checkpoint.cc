#include "worker/checkpoint.h"

#include <ATen/core/Dict.h>
#include <ATen/ops/scalar_tensor.h>
#include <ATen/ops/tensor.h>
#include <caffe2/serialize/inline_container.h>
#include <dirent.h>
#include <sys/stat.h>
#include <torch/csrc/jit/serialization/pickle.h>
#include <torch/csrc/jit/serialization/pickler.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "spdlog/spdlog.h"
#include "worker/atomic_file.h"
#include "worker/exception_text.h"

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

std::vector<char> PickleForTorchLoad(const c10::IValue& value) {
  std::vector<char> pickled;
  torch::jit::Pickler pickler(
      [&](const char* data, size_t size) {
        pickled.insert(pickled.end(), data, data + size);
      },
      /*tensor_table=*/nullptr, /*type_renamer=*/nullptr,
      /*memoized_class_types=*/nullptr, /*get_tensor_id=*/nullptr,
      /*tag_aggregates=*/false);
  pickler.protocol();
  pickler.pushIValue(value);
  pickler.stop();

  std::vector<char> archive;
  caffe2::serialize::PyTorchStreamWriter writer(
      [&](const void* data, size_t size) {
        const char* bytes = static_cast<const char*>(data);
        archive.insert(archive.end(), bytes, bytes + size);
        return size;
      });
  // The layout of torch.save and pickle_save: data/<n> for the n-th
  // tensor's storage (the pickle names them "0", "1", ...), then data.pkl.
  const std::vector<at::Tensor>& tensors = pickler.tensorData();
  for (size_t i = 0; i < tensors.size(); ++i) {
    torch::jit::WriteableTensorData storage =
        torch::jit::getWriteableTensorData(tensors[i]);
    writer.writeRecord(absl::StrFormat("data/%d", i), storage.data(),
                       storage.sizeInBytes());
  }
  writer.writeRecord("data.pkl", pickled.data(), pickled.size());
  writer.writeEndOfFile();
  return archive;
}

absl::Status SaveStateDict(const std::string& path,
                           const std::map<std::string, at::Tensor>& tensors) {
  c10::Dict<std::string, at::Tensor> dict;
  for (const auto& [name, tensor] : tensors) dict.insert(name, tensor);
  std::vector<char> bytes;
  try {
    bytes = PickleForTorchLoad(c10::IValue(dict));
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrFormat(
        "cannot serialize the model for %s: %s", path, ExceptionText(e)));
  }
  return WriteFileAtomically(path,
                             absl::string_view(bytes.data(), bytes.size()));
}

absl::StatusOr<std::map<std::string, at::Tensor>> LoadStateDict(
    const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(
        absl::StrFormat("cannot read the model file %s; check the path", path));
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
        "model file %s is not a saved state dict: %s", path, ExceptionText(e)));
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

// Creates `dir` and its missing parents (mode 0777 less the umask) and
// syncs the parent of each folder it creates, so that a checkpoint in a new
// folder survives a crash as well as one in an old folder does.
absl::Status MakeDirs(const std::string& dir, const SyncOptions& sync) {
  for (size_t i = 0; i <= dir.size(); ++i) {
    if (i == dir.size() || (dir[i] == '/' && i > 0)) {
      const std::string partial = dir.substr(0, i);
      if (mkdir(partial.c_str(), 0777) != 0) {
        if (errno == EEXIST) continue;
        return absl::PermissionDeniedError(absl::StrFormat(
            "cannot create the checkpoint folder %s: %s; pass SaveCheckpoint "
            "a folder this process can write",
            partial, std::strerror(errno)));
      }
      const size_t slash = partial.rfind('/');
      std::string parent = ".";
      if (slash != std::string::npos) {
        parent = slash == 0 ? "/" : partial.substr(0, slash);
      }
      if (absl::Status synced = SyncFolder(parent, sync); !synced.ok()) {
        return absl::DataLossError(
            absl::StrFormat("created the checkpoint folder %s, but %s", partial,
                            synced.message()));
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
    c10::impl::GenericDict dict =
        torch::jit::pickle_load(bytes).toGenericDict();
    for (const auto& entry : dict.at("model").toGenericDict()) {
      c.model[entry.key().toStringRef()] = entry.value().toTensor();
    }
    c10::impl::GenericDict optimizer = dict.at("optimizer").toGenericDict();
    c10::IValue lr =
        optimizer.at("param_groups").toList().get(0).toGenericDict().at("lr");
    // A tensor since PickleForTorchLoad, a float before.
    c.lr = lr.isTensor() ? lr.toTensor().item<double>() : lr.toDouble();
    c.epoch = dict.at("epoch").toInt();
    c.epoch_position = dict.at("epoch_position").toInt();
    c.step = dict.at("step").toInt();
    c.seed = static_cast<uint64_t>(dict.at("seed").toInt());
    c.world_size = static_cast<int>(dict.at("world_size").toInt());
    if (dict.contains("epoch_samples")) {
      at::Tensor samples =
          dict.at("epoch_samples").toTensor().to(at::kLong).contiguous();
      const int64_t* v = samples.data_ptr<int64_t>();
      c.epoch_samples.assign(v, v + samples.numel());
    }
  } catch (const std::exception& e) {
    return absl::DataLossError(absl::StrFormat(
        "checkpoint %s does not read: %s", path, ExceptionText(e)));
  }
  return c;
}

}  // namespace

absl::Status SaveCheckpoint(const std::string& dir,
                            const TrainingCheckpoint& checkpoint, int keep,
                            const SyncOptions& sync) {
  absl::Status made = MakeDirs(dir, sync);
  if (!made.ok()) return made;
  c10::impl::GenericDict model = NewDict();
  for (const auto& [name, tensor] : checkpoint.model)
    model.insert(name, tensor);
  // Floats as 0-dim float64 tensors: the weights_only unpickler of PyTorch
  // 1.13 knows no float opcode (2.x reads either).
  auto real = [](double value) {
    return at::scalar_tensor(value, at::kDouble);
  };
  c10::impl::GenericDict group = NewDict();
  group.insert("lr", real(checkpoint.lr));
  group.insert("momentum", real(0.0));
  group.insert("dampening", real(0.0));
  group.insert("weight_decay", real(0.0));
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
  if (!checkpoint.epoch_samples.empty()) {
    // A tensor, as the floats above: read under weights_only everywhere.
    dict.insert("epoch_samples",
                at::tensor(checkpoint.epoch_samples, at::kLong));
  }
  std::vector<char> bytes;
  try {
    bytes = PickleForTorchLoad(c10::IValue(dict));
  } catch (const std::exception& e) {
    return absl::InternalError(
        absl::StrFormat("cannot serialize the checkpoint of step %d: %s",
                        checkpoint.step, ExceptionText(e)));
  }
  absl::Status written =
      WriteFileAtomically(CheckpointPath(dir, checkpoint.step),
                          absl::string_view(bytes.data(), bytes.size()), sync);
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
    absl::StatusOr<TrainingCheckpoint> c =
        ReadCheckpoint(CheckpointPath(dir, step));
    if (c.ok()) return std::optional<TrainingCheckpoint>(std::move(*c));
    spdlog::warn("skipping checkpoint: {}", std::string(c.status().message()));
  }
  return std::optional<TrainingCheckpoint>();
}

}  // namespace ddprun::worker
