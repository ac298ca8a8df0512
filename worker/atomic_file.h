#pragma once

#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace ddprun::worker {

// How files and folders are made durable. The default is the system's
// fsync; tests put a failing one here to see the failure handled.
struct SyncOptions {
  std::function<int(int fd)> fsync;  // null: ::fsync
};

// Replaces `path` with `contents` so that a reader sees the old file or the
// new one, never a part: writes a temporary file in the same folder, fsyncs
// it, renames it over `path` and fsyncs the folder. The file's mode is
// 0666 less the umask, as for any file the program creates. On a failure
// before the rename (full disk, unwritable folder, a failed fsync) the
// temporary is removed, `path` is untouched, and the error names the path,
// the step and the errno text; a failed fsync of the folder after the rename
// is an error too (the new file is in place but may not survive a crash).
absl::Status WriteFileAtomically(const std::string& path,
                                 absl::string_view contents,
                                 const SyncOptions& sync = {});

// fsync of the folder `dir` (opened read-only), so that the entries made in
// it (a rename, a new file or folder) survive a crash. Errors name the
// folder and the errno text.
absl::Status SyncFolder(const std::string& dir, const SyncOptions& sync = {});

}  // namespace ddprun::worker
