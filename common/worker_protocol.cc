#include "common/worker_protocol.h"

#include <algorithm>

#include "absl/strings/str_format.h"
#include "common/worker_env.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"

namespace ddprun::common {

std::string EncodeWorkerEnv(const std::vector<std::string>& env) {
  google::protobuf::Struct object;
  for (const std::string& entry : env) {
    const size_t eq = entry.find('=');
    if (eq == std::string::npos) continue;
    (*object.mutable_fields())[entry.substr(0, eq)].set_string_value(
        entry.substr(eq + 1));
  }
  std::string json;
  // A Struct of strings always prints.
  (void)google::protobuf::util::MessageToJsonString(object, &json);
  return json;
}

absl::StatusOr<std::vector<std::pair<std::string, std::string>>>
DecodeWorkerEnv(absl::string_view json) {
  auto error = [&](absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "the environment from ddprun (%s or %s) is not a JSON object of "
        "strings: %s; start this program with ddprun, which writes it",
        env::kStandbyFd, env::kControlFd, what));
  };
  const size_t first = json.find_first_not_of(" \t\r\n");
  if (first == absl::string_view::npos || json[first] != '{') {
    return error("expected '{'");
  }
  google::protobuf::Struct object;
  // A std::string: protobuf's string type for this argument differs
  // between versions (StringPiece, absl::string_view).
  const auto parsed =
      google::protobuf::util::JsonStringToMessage(std::string(json), &object);
  if (!parsed.ok()) return error(parsed.ToString());
  std::vector<std::pair<std::string, std::string>> vars;
  for (const auto& [name, value] : object.fields()) {
    if (value.kind_case() != google::protobuf::Value::kStringValue) {
      return error(absl::StrFormat("the value of %s is not a string", name));
    }
    vars.emplace_back(name, value.string_value());
  }
  std::sort(vars.begin(), vars.end());
  return vars;
}

}  // namespace ddprun::common
