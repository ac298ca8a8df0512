#include "common/secret_file.h"

#include <sys/stat.h>

#include "absl/strings/str_format.h"

namespace ddprun::common {

absl::Status CheckSecretFilePermissions(const std::string& path,
                                        absl::string_view what) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return absl::OkStatus();
  const mode_t mode = st.st_mode & 07777;
  const bool root_group_read = st.st_uid == 0 && (mode & 0070) == 0040;
  const bool others = (mode & 0007) != 0;
  const bool group = (mode & 0070) != 0 && !root_group_read;
  if (!others && !group) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrFormat(
      "the %s file '%s' has mode %04o: %s can read or change it, so anyone "
      "there can use the token; make it private: chmod 600 '%s' (Kubernetes: "
      "defaultMode 0400 on the secret volume, or 0440 with fsGroup)",
      what, path, mode, others ? "every user of this host" : "its group",
      path));
}

}  // namespace ddprun::common
