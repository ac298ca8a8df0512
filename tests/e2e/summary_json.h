#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace ddprun::testing {

// Reads one numeric field of the flat JSON object ddprun-mnist writes with
// --summary-json; nullopt when the field is missing or not a number.
std::optional<double> SummaryNumber(const std::string& json,
                                    const std::string& field);

// Reads one list field of that object ("epoch_samples": [a, b]); empty when
// the field is missing.
std::vector<int64_t> SummaryList(const std::string& json,
                                 const std::string& field);

// Checks the --summary-json that rank 0 wrote at `path`: it exists, names
// `world_size`, and reports a test accuracy of at least `min_accuracy`.
// Returns the file's text for further checks (empty when it is missing).
std::string ExpectTrainedSummary(const std::string& path, int world_size,
                                 double min_accuracy);

// For the tests that resume: stops `pids` (the workers) with SIGSTOP and
// waits until each is stopped or gone, so that none writes another
// checkpoint (a stopped worker that its agent then signals dies without
// running again). False when one did not stop within the bound.
bool FreezeProcesses(const std::vector<pid_t>& pids);

// Lets processes stopped by FreezeProcesses run on (SIGCONT).
void ThawProcesses(const std::vector<pid_t>& pids);

// The step of the newest ckpt-<step>.pt in `dir`; nullopt when none.
std::optional<int64_t> NewestCheckpointStep(const std::string& dir);

// The run that wrote the summary at `path` resumed from the checkpoint of
// `step` (its resumed_from_step): not from scratch (-1), not from another.
void ExpectResumedFrom(const std::string& path, int64_t step);

}  // namespace ddprun::testing
