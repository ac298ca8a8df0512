#pragma once

#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/unique_fd.h"
#include "launcher/posix/control_channel.h"
#include "launcher/posix/process_control.h"
#include "launcher/posix/progress_channel.h"
#include "launcher/posix/worker_slot.h"

namespace ddprun::launcher {

// Workers started ahead of their round (--prewarm), so that a restart does
// not wait for an interpreter and LibTorch to start: a standby runs up to
// the point where it needs its round's environment (for Python, the shim of
// python_standby.h imports torch), then blocks reading the descriptor named
// by DDPRUN_STANDBY_FD. Activate writes the worker's complete environment
// there (a JSON object of strings) and closes it; the standby then becomes
// the worker. Where the agent may move them back (ProcessControl::
// CanRestoreNormalPriority), standbys start under SCHED_IDLE, so that their
// start-up (~0.9 CPU-s of LibTorch) takes only CPU time the training beside
// them leaves; Activate puts each back under the normal policy before it is
// told its round, and PromoteLate does after StandbyPoolOptions::idle_grace
// (a machine with no idle CPU would otherwise never let it get ready).
//
// The zygote. For a program that is not Python (a libddp program), where
// the agent adopts orphans (ProcessControl::AdoptsOrphans), the pool starts
// one more process of the program, with DDPRUN_ZYGOTE_FD: it runs to
// AwaitActivation as a standby would and from then on forks each standby
// the pool asks for (common/zygote_protocol.h), copy-on-write in a few ms,
// instead of the pool starting a process (~0.9 CPU-s for ddprun-mnist,
// beside the training, after every in-place activation). The zygote is
// moved to the normal policy once it serves, before the pool asks it for
// standbys: a fork is not delayed, and a standby (which inherits the
// policy) does not work idle. A forked standby is the agent's child (the zygote
// double-forks; the agent, a subreaper, adopts it): it is reaped, signalled by
// process group and killed with the agent as any other. Answers arrive on the
// socket; PromoteLate and Fill collect them (a standby counts in size()
// once its pid is known). When the zygote refuses (it runs threads), a fork
// fails or the zygote ends, the pool logs why and starts standbys by exec
// from then on, as before.
//
// The seed (StandbyPoolOptions::seed, ddprun's default). The pool starts no
// zygote: PlantSeed gives a worker the socket, and the worker forks the
// zygote where it waits for its round (worker/standby.h), which then says
// "ready PID" as one started by exec would. Nothing is started by exec.
// Owned and used by the agent's thread (it forks).
struct StandbyPoolOptions {
  // How long a standby may start under SCHED_IDLE before PromoteLate moves
  // it to the normal policy.
  absl::Duration idle_grace = absl::Seconds(5);
  // Fork standbys from a zygote where possible (above); false: exec each.
  bool zygote = true;
  // Start standbys by exec where no zygote serves (it refused, failed, or
  // cannot be used); false: then there are none (ddprun's default
  // prewarming, which is on only where it is cheap).
  bool exec = true;
  // The zygote is forked by a worker (PlantSeed), not started by exec:
  // ddprun's default, where a zygote of its own would cost a program start
  // beside the training.
  bool seed = false;
};

class StandbyPool {
 public:
  // `argv` runs a standby; `env` is its environment before activation.
  StandbyPool(ProcessControl& control, const common::Clock& clock,
              std::vector<std::string> argv, std::vector<std::string> env,
              StandbyPoolOptions options = {});
  // Kills the standbys still waiting.
  ~StandbyPool();
  StandbyPool(const StandbyPool&) = delete;
  StandbyPool& operator=(const StandbyPool&) = delete;

  // Makes `count` standbys wait (starting the missing ones, or asking the
  // zygote for them). A standby that cannot be started is logged and left
  // out.
  void Fill(int count);
  // The standbys that can be activated now (a forked one once the zygote
  // told its pid).
  int size() const { return static_cast<int>(standbys_.size()); }
  // Standbys forked by the zygote so far, and started by exec.
  int forked() const { return forked_; }
  int execed() const { return execed_; }
  // The zygote's pid; -1 when none runs.
  pid_t zygote_pid() const { return zygote_ ? zygote_->pid : -1; }
  // Whether standbys start under SCHED_IDLE.
  bool idle_start() const { return idle_start_; }
  // The progress descriptor standby `i` inherited (for DDPRUN_PROGRESS_FD).
  int progress_fd(int i) const;
  // The control descriptor standby `i` inherited (for DDPRUN_CONTROL_FD:
  // the rounds after its first, in-place recovery).
  int control_fd(int i) const;

  // Turns the first envs.size() standbys into workers: each gets envs[i].
  // Returns their slots (pid, progress and control channels), for
  // WorkerGroup to adopt. When one cannot be told (it died), every standby
  // is killed and the error returned; the caller then starts workers the
  // ordinary way.
  absl::StatusOr<std::vector<WorkerSlot>> Activate(
      const std::vector<std::vector<std::string>>& envs);

  // With StandbyPoolOptions::seed: the descriptor that a worker started
  // now inherits as DDPRUN_ZYGOTE_SEED_FD, to fork the node's zygote where
  // it waits for its round (worker/standby.h); -1 when none is wanted (a
  // zygote serves or is on its way, or the program refused to seed). Call
  // SeedPlanted once the worker was started (or could not be).
  int PlantSeed();
  // Closes the agent's copy of the worker's end of the seed.
  void SeedPlanted() { seed_.Reset(); }

  // Kills every waiting standby.
  void Clear();

  // Moves the standbys that started idle more than idle_grace ago to the
  // normal policy (once each), and collects the zygote's answers (standbys
  // it forked; starting by exec what it could not). Cheap: call it often.
  void PromoteLate();

 private:
  struct Standby {
    pid_t pid = -1;
    common::UniqueFd control_fd;  // write end; the standby reads the other
    // Their child_fd() is the descriptor's number in the standby.
    ProgressChannel progress;
    ControlChannel control;  // the rounds after activation
    absl::Time started;
    bool idle = false;  // still under SCHED_IDLE
  };
  struct Zygote {
    pid_t pid = -1;           // -1 until a seeded zygote says it is ready
    common::UniqueFd socket;  // the agent's end
    bool ready = false;
    bool idle = false;
    absl::Time started;
  };

  // Starts one standby by exec; false when it cannot.
  bool Spawn();
  // Starts the zygote (by exec); false when it cannot.
  bool StartZygote();
  // Asks the zygote for one standby; false when it cannot be asked.
  bool RequestFork();
  // Reads what the zygote said; acts on each message.
  void Collect();
  void OnZygoteMessage(const std::string& message);
  // Stops using the zygote (logged with `why`): it is killed, the pending
  // requests dropped; standbys start by exec from now on.
  // A seed that ended before its zygote was ready (the worker ended
  // first) is planted again (`for_good` false).
  void DropZygote(const std::string& why, bool for_good = true);
  // Starts or requests standbys up to wanted_.
  void TopUp();

  ProcessControl& control_;
  const common::Clock& clock_;
  StandbyPoolOptions options_;
  std::vector<std::string> argv_;
  std::vector<std::string> env_;
  bool idle_start_;
  bool use_zygote_;
  std::vector<Standby> standbys_;
  // Requested from the zygote, in order; their pids come with its answers.
  std::vector<Standby> pending_;
  std::optional<Zygote> zygote_;
  common::UniqueFd seed_;  // the worker's end, until SeedPlanted
  int wanted_ = 0;
  int forked_ = 0;
  int execed_ = 0;
};

}  // namespace ddprun::launcher
