#include "common/rendezvous_words.h"

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace ddprun::common {
namespace {

constexpr absl::string_view kCausePrefix = "FAILURE_CAUSE_";
constexpr absl::string_view kStatePrefix = "NODE_STATE_";

// "NODE_STATE_REJOINING" -> "rejoining"; "unspecified" for a value this
// build does not know (a newer peer's).
std::string Word(const std::string& name, absl::string_view prefix) {
  if (!absl::StartsWith(name, prefix)) return "unspecified";
  return absl::AsciiStrToLower(name.substr(prefix.size()));
}

}  // namespace

std::string FailureCauseWord(v1::FailureCause cause) {
  return Word(v1::FailureCause_Name(cause), kCausePrefix);
}

v1::FailureCause FailureCauseFromWord(absl::string_view word) {
  v1::FailureCause cause = v1::FAILURE_CAUSE_UNSPECIFIED;
  if (word.empty()) return cause;
  if (!v1::FailureCause_Parse(
          absl::StrCat(kCausePrefix, absl::AsciiStrToUpper(std::string(word))),
          &cause)) {
    return v1::FAILURE_CAUSE_UNSPECIFIED;
  }
  return cause;
}

std::string NodeStateWord(v1::NodeState state) {
  return Word(v1::NodeState_Name(state), kStatePrefix);
}

void NormalizeFailureCause(v1::WorkerFailure& failure) {
  if (failure.failure_cause() == v1::FAILURE_CAUSE_UNSPECIFIED) {
    failure.set_failure_cause(FailureCauseFromWord(failure.cause()));
  }
  if (failure.cause().empty() &&
      failure.failure_cause() != v1::FAILURE_CAUSE_UNSPECIFIED) {
    failure.set_cause(FailureCauseWord(failure.failure_cause()));
  }
}

}  // namespace ddprun::common
