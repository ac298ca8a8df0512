#pragma once

#include <string>

namespace ddprun::launcher {

// The error message a worker left in its TORCHELASTIC_ERROR_FILE: torchrun's
// JSON ({"message": {"message": "...", "extraInfo": {...}}}), a flat
// {"message": "..."}, or plain text. Empty when there is no file.
std::string ReadWorkerErrorMessage(const std::string& path);

}  // namespace ddprun::launcher
