#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace ddprun::common {

// Whether a secret file (the token file) is kept private: a file anyone else
// on the host can read is a token anyone can use, and one they can change is
// a token they choose. The rule is PostgreSQL's for its key files:
// - no permission bits for others (mode & 0007 == 0);
// - no group bits, except that a file owned by root may be group-readable
//   (0440/0640): the way Kubernetes shares a mounted secret with a non-root
//   container (fsGroup) and systemd with a service's group.
// Symbolic links are followed (Kubernetes mounts secrets through them): the
// file they name is checked. A file that cannot be examined passes here, so
// that its reader reports it missing or unreadable. `what` names the file in
// the message ("token"). FAILED_PRECONDITION naming the file, its mode and
// the fix otherwise.
absl::Status CheckSecretFilePermissions(const std::string& path,
                                        absl::string_view what);

}  // namespace ddprun::common
