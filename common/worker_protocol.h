#pragma once

#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/progress_record.h"

namespace ddprun::common {

// The agent↔worker protocol, one home for both directions:
//   - the environment (common/worker_env.h names the variables);
//   - worker → agent, on DDPRUN_PROGRESS_FD: progress records, one line each
//     (common/progress_record.h: phases, steps, the in-place declaration
//     kInPlaceLine);
//   - agent → worker, on DDPRUN_STANDBY_FD (a prewarmed standby's one
//     activation) and DDPRUN_CONTROL_FD (each new round of a worker that
//     recovers in place): the worker's complete environment, encoded by
//     EncodeWorkerEnv, one JSON object of string values (one line on the
//     control pipe). ddprun's Python standby shim reads it with json.loads.

// A worker's environment ("NAME=value" entries) as one JSON object of
// strings. An entry without '=' is left out; of a name given twice, the
// last value counts (as setenv in order would make it).
std::string EncodeWorkerEnv(const std::vector<std::string>& env);

// The inverse: the (name, value) pairs of a JSON object of strings, sorted
// by name. Errors (InvalidArgument) say what is wrong and that ddprun
// writes this text.
absl::StatusOr<std::vector<std::pair<std::string, std::string>>>
DecodeWorkerEnv(absl::string_view json);

}  // namespace ddprun::common
