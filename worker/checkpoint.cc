#include "worker/checkpoint.h"

#include <fstream>
#include <iterator>
#include <vector>

#include <ATen/core/Dict.h>
#include <torch/csrc/jit/serialization/pickle.h>

#include "absl/strings/str_format.h"
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

}  // namespace ddprun::worker
