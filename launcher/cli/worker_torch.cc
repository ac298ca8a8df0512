#include "launcher/cli/worker_torch.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/unique_fd.h"
#include "spdlog/spdlog.h"

namespace ddprun::launcher {
namespace {

// Finds torch without importing it: its version from the package metadata
// (or torch/version.py), and whether libtorch_cpu.so lies in the package
// (a wheel) or is a link into the system's libraries (a distribution).
constexpr char kProbeScript[] = R"py(
import importlib.util, os
spec = importlib.util.find_spec("torch")
if spec is None or not spec.submodule_search_locations:
    print("none")
else:
    d = list(spec.submodule_search_locations)[0]
    try:
        import importlib.metadata
        v = importlib.metadata.version("torch")
    except Exception:
        ns = {}
        exec(open(os.path.join(d, "version.py")).read(), ns)
        v = ns["__version__"]
    lib = os.path.realpath(os.path.join(d, "lib", "libtorch_cpu.so"))
    print(v)
    print(1 if lib.startswith(os.path.realpath(d) + os.sep) else 0)
)py";

constexpr absl::Duration kProbeTimeout = absl::Seconds(10);

}  // namespace

WorkerTorch ParseWorkerTorch(absl::string_view output) {
  WorkerTorch torch;
  std::vector<absl::string_view> lines =
      absl::StrSplit(output, '\n', absl::SkipWhitespace());
  if (lines.size() < 2) return torch;
  std::vector<absl::string_view> parts = absl::StrSplit(lines[0], '.');
  int major = 0;
  int minor = 0;
  if (parts.size() < 2 || !absl::SimpleAtoi(parts[0], &major) ||
      !absl::SimpleAtoi(parts[1], &minor) || major < 1) {
    return torch;
  }
  torch.major = major;
  torch.minor = minor;
  torch.bundled_libs = lines[1] != "0";
  return torch;
}

WorkerTorch ProbeWorkerTorch(const std::string& python,
                             const std::vector<std::string>& env) {
  absl::StatusOr<common::PipeEnds> pipe = common::MakePipe(O_CLOEXEC);
  if (!pipe.ok()) return {};
  std::vector<char*> argv = {const_cast<char*>(python.c_str()),
                             const_cast<char*>("-c"),
                             const_cast<char*>(kProbeScript), nullptr};
  std::vector<char*> envp;
  for (const std::string& e : env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, pipe->write.get(), STDOUT_FILENO);
  posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, "/dev/null",
                                   O_WRONLY, 0);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  // The agent blocks its signals for its signal thread; the probe must not
  // inherit that mask.
  sigset_t none;
  sigemptyset(&none);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK);
  pid_t pid = -1;
  int rc = posix_spawnp(&pid, python.c_str(), &actions, &attr, argv.data(),
                        envp.data());
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  pipe->write.Reset();
  if (rc != 0) return {};
  std::string output;
  const absl::Time deadline = absl::Now() + kProbeTimeout;
  while (true) {
    int64_t left_ms = absl::ToInt64Milliseconds(deadline - absl::Now());
    if (left_ms <= 0) break;
    pollfd p{pipe->read.get(), POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(left_ms)) <= 0) break;
    char buf[256];
    ssize_t n = read(pipe->read.get(), buf, sizeof(buf));
    if (n <= 0) break;
    output.append(buf, n);
  }
  pipe->read.Reset();
  kill(pid, SIGKILL);  // harmless when it has exited: not reaped yet
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  WorkerTorch torch = ParseWorkerTorch(output);
  if (torch.known()) {
    spdlog::debug(
        "the workers' torch: {}.{} ({})", torch.major, torch.minor,
        torch.bundled_libs ? "its own libraries" : "the system's libraries");
  } else {
    spdlog::debug(
        "{} finds no torch; the workers get both generations' "
        "variables",
        python);
  }
  return torch;
}

}  // namespace ddprun::launcher
