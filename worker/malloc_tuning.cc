#include "worker/malloc_tuning.h"

#include <malloc.h>

#include <cstdlib>
#include <mutex>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"

namespace ddprun::worker {

std::optional<MallocTuning> ChooseMallocTuning(
    const std::function<const char*(const char*)>& lookup,
    std::string* why_not) {
  auto set = [&](const char* name) {
    const char* value = lookup(name);
    return value != nullptr && value[0] != '\0';
  };
  if (const char* tunables = lookup("GLIBC_TUNABLES");
      tunables != nullptr && absl::StrContains(tunables, "glibc.malloc.")) {
    *why_not = "GLIBC_TUNABLES sets glibc.malloc.*";
    return std::nullopt;
  }
  for (const char* name : {"MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_",
                           "MALLOC_TOP_PAD_", "MALLOC_MMAP_MAX_"}) {
    if (set(name)) {
      *why_not = absl::StrCat(name, " is set");
      return std::nullopt;
    }
  }
  if (set("LD_PRELOAD")) {
    *why_not = "LD_PRELOAD is set (another allocator, perhaps)";
    return std::nullopt;
  }
  return MallocTuning{};
}

bool TuneMallocForTraining() {
  static std::once_flag once;
  static bool tuned = false;
  std::call_once(once, [] {
    std::string why_not;
    std::optional<MallocTuning> tuning = ChooseMallocTuning(
        [](const char* name) { return std::getenv(name); }, &why_not);
    if (!tuning.has_value()) {
      spdlog::debug("malloc's thresholds left as they are: {}", why_not);
      return;
    }
#ifdef __GLIBC__
    tuned = mallopt(M_MMAP_THRESHOLD,
                    static_cast<int>(tuning->mmap_threshold)) == 1 &&
            mallopt(M_TRIM_THRESHOLD,
                    static_cast<int>(tuning->trim_threshold)) == 1;
#endif
    spdlog::debug("malloc's thresholds {}: mmap {} B, trim {} B",
                  tuned ? "set" : "not set", tuning->mmap_threshold,
                  tuning->trim_threshold);
  });
  return tuned;
}

}  // namespace ddprun::worker
