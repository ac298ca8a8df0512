#pragma once

#include <string>

namespace ddprun::launcher {

// What ReadWorkerErrorMessage puts between the error message and torch's
// Python traceback (extraInfo.py_callstack) when the file has one.
inline constexpr char kTracebackMarker[] = "\ntraceback:\n";

// The error message a worker left in its TORCHELASTIC_ERROR_FILE: torchrun's
// JSON ({"message": {"message": "...", "extraInfo": {...}}}), a flat
// {"message": "..."}, or plain text. Empty when there is no file.
std::string ReadWorkerErrorMessage(const std::string& path);

}  // namespace ddprun::launcher
