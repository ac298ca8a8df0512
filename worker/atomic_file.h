#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace ddprun::worker {

// Replaces `path` with `contents` so that a reader sees the old file or the
// new one, never a part: writes a temporary file in the same folder, fsyncs
// it, renames it over `path` and fsyncs the folder. On any failure (full
// disk, unwritable folder) the temporary is removed, `path` is untouched,
// and the error names the path, the step and the errno text.
absl::Status WriteFileAtomically(const std::string& path,
                                 absl::string_view contents);

}  // namespace ddprun::worker
