#include "mnist/mnist_trainer.h"

#include <ATen/ATen.h>
#include <fcntl.h>
#include <signal.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/optim/sgd.h>
#include <torch/utils.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <future>
#include <memory>
#include <optional>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/worker_env.h"
#include "mnist/mnist_data.h"
#include "mnist/mnist_model.h"
#include "mnist/train_summary.h"
#include "spdlog/spdlog.h"
#include "worker/abortable.h"
#include "worker/checkpoint.h"
#include "worker/ddp.h"
#include "worker/distributed_sampler.h"
#include "worker/nccl_group.h"
#include "worker/phase.h"
#include "worker/process_group.h"
#include "worker/process_start.h"
#include "worker/progress.h"
#include "worker/recovery.h"
#include "worker/standby.h"
#include "worker/worker_env.h"

namespace ddprun::worker {
namespace {

using Clock = std::chrono::steady_clock;
using common::Phase;

double Since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Share of `split` the model classifies right, in [0, 1].
double Accuracy(torch::nn::Sequential& model, const MnistSplit& split,
                const c10::Device& device) {
  at::NoGradGuard no_grad;
  constexpr int64_t kChunk = 2000;
  int64_t correct = 0;
  for (int64_t start = 0; start < split.size(); start += kChunk) {
    int64_t n = std::min(kChunk, split.size() - start);
    at::Tensor x = split.images.narrow(0, start, n).to(device);
    at::Tensor y = split.labels.narrow(0, start, n).to(device);
    correct += model->forward(x).argmax(1).eq(y).sum().item<int64_t>();
  }
  return split.size() == 0 ? 0.0 : static_cast<double>(correct) / split.size();
}

// Where training starts: fresh, or from the newest checkpoint.
struct StartPoint {
  int64_t epoch = 0;
  int64_t epoch_position = 0;
  int64_t step = 0;
  int64_t resumed_from = -1;
  // The checkpoint's accounting of each epoch's samples (empty: none).
  std::vector<int64_t> epoch_samples;
};

// Loads the newest checkpoint into `model` (every rank that can read it;
// parameters are broadcast from rank 0 afterwards anyway) and agrees on
// where to continue with rank 0.
absl::StatusOr<StartPoint> Resume(const MnistTrainOptions& options,
                                  const WorkerEnv& env,
                                  const ProcessGroup& group,
                                  torch::nn::Sequential& model) {
  StartPoint start;
  if (!options.checkpoint_dir.empty()) {
    auto newest = LoadNewestCheckpoint(options.checkpoint_dir);
    if (!newest.ok()) return newest.status();
    if (newest->has_value()) {
      const TrainingCheckpoint& c = **newest;
      at::NoGradGuard no_grad;
      for (auto& item : model->named_parameters()) {
        auto it = c.model.find(item.key());
        if (it == c.model.end() ||
            !it->second.sizes().equals(item.value().sizes())) {
          return absl::FailedPreconditionError(absl::StrFormat(
              "checkpoint in %s does not fit --model %s%s (parameter %s); "
              "use another --checkpoint-dir",
              options.checkpoint_dir, options.model,
              options.model == "mlp"
                  ? absl::StrFormat(" --hidden %d", options.hidden)
                  : std::string(),
              item.key()));
        }
        item.value().copy_(it->second);
      }
      start.epoch = c.epoch;
      start.epoch_position = c.epoch_position;
      start.step = c.step;
      start.resumed_from = c.step;
      start.epoch_samples = c.epoch_samples;
      if (c.seed != options.seed) {
        spdlog::warn(
            "checkpoint was written with --seed {}, now {}; the "
            "sample order changes",
            c.seed, options.seed);
      }
      if (c.world_size != env.world_size && env.rank == 0) {
        spdlog::info(
            "checkpoint was written by {} ranks, now {}: the epoch continues "
            "after the {} samples already trained, split over the new ranks",
            c.world_size, env.world_size, c.epoch_position);
      }
    }
  }
  if (group.collectives) {
    // Rank 0's view wins, so that ranks that could not read the folder
    // (no shared file system) still agree.
    // On the group's device: NCCL broadcasts CUDA tensors only.
    std::vector<at::Tensor> counters = {
        at::tensor(
            {start.epoch, start.epoch_position, start.step, start.resumed_from,
             static_cast<int64_t>(start.epoch_samples.size())},
            at::kLong)
            .to(group.device)};
    ::c10d::BroadcastOptions root0;
    root0.rootRank = 0;
    WaitOrAbandon(group.collectives,
                  group.collectives->broadcast(counters, root0));
    at::Tensor on_host = counters[0].cpu();
    const int64_t* v = on_host.data_ptr<int64_t>();
    std::vector<int64_t> accounted = std::move(start.epoch_samples);
    accounted.resize(static_cast<size_t>(v[4]), 0);
    start = {v[0], v[1], v[2], v[3], {}};
    if (!accounted.empty()) {
      // Rank 0's accounting too, so that any rank can hand it on.
      std::vector<at::Tensor> samples = {
          at::tensor(accounted, at::kLong).to(group.device)};
      WaitOrAbandon(group.collectives,
                    group.collectives->broadcast(samples, root0));
      at::Tensor samples_on_host = samples[0].cpu();
      const int64_t* s = samples_on_host.data_ptr<int64_t>();
      start.epoch_samples.assign(s, s + accounted.size());
    }
  }
  return start;
}

absl::Status ValidateOptions(const MnistTrainOptions& o) {
  auto check_hook = [](const char* flag, const std::string& hook) {
    if (hook.empty() || absl::StartsWith(hook, "source:") ||
        absl::StartsWith(hook, "receiver:")) {
      return absl::OkStatus();
    }
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s '%s': want source:PATH or receiver:PATH", flag, hook));
  };
  if (absl::Status s = check_hook("--test-die-in-sync", o.test_die_in_sync);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = check_hook("--test-stop-in-sync", o.test_stop_in_sync);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = check_hook("--test-block-in-sync", o.test_block_in_sync);
      !s.ok()) {
    return s;
  }
  if (o.batch_size < 1 || o.epochs < 1 || o.lr <= 0 || o.accumulate < 1 ||
      o.bucket_mb <= 0 || o.max_steps < 0 || o.checkpoint_every < 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--batch-size %d, --epochs %d, --lr %g, --accumulate %d and "
        "--bucket-mb %g must be positive; --max-steps %d and "
        "--checkpoint-every %d must not be negative",
        o.batch_size, o.epochs, o.lr, o.accumulate, o.bucket_mb, o.max_steps,
        o.checkpoint_every));
  }
  return absl::OkStatus();
}

// Everything one run holds from set-up to finish. Built in place by SetUp
// (DataParallel keeps a reference to the group, the optimizer to the
// model's parameters).
struct Training {
  explicit Training(const MnistTrainOptions& o) : options(o) {}
  ~Training() {
    if (step_times_fd >= 0) close(step_times_fd);
  }
  const MnistTrainOptions& options;
  int step_times_fd = -1;  // --step-times, opened for appending
  WorkerEnv env;
  bool lead = false;
  int world = 1;
  ProcessGroup group;
  MnistData data;
  torch::nn::Sequential model{nullptr};
  StartPoint start;
  std::optional<DataParallel> ddp;
  std::optional<torch::optim::SGD> optimizer;
  std::optional<DistributedSampler> sampler;
  std::optional<ProgressReporter> progress;
  int64_t per_step = 0;  // samples per optimizer step and rank
  int64_t steps_per_epoch = 0;
  BackendKind backend = BackendKind::kAuto;
  // In-place recovery (worker/recovery.h): a new round replaces failed
  // ranks while this process keeps its state.
  std::unique_ptr<Membership> membership;
  bool recover = false;        // the step loop stopped for a new round
  absl::Status recover_cause;  // the collective error, if one stopped it

  // Where training stands.
  TrainSummary summary;
  int64_t step = 0;
  int64_t samples_trained = 0;  // by this rank, this run
  // Steps this rank took part in without samples of its own (TrainStep).
  int64_t shadow_steps = 0;
  double train_seconds = 0;
  double loss_value = 0;
  bool stop = false;
  // Where the last step completed on this rank left the epoch: what a new
  // member of the group continues from.
  int64_t cur_epoch = 0;
  int64_t cur_position = 0;
  // Samples (all ranks) of the completed steps of each epoch, and the steps
  // in-place recoveries resumed at; carried to new members.
  std::vector<int64_t> epoch_samples;
  std::vector<int64_t> resumed_at_steps;
  // When the first step after each of those completed (Unix microseconds;
  // 0 until it did), for "kill -9 -> next completed step".
  std::vector<int64_t> resumed_step_micros;
};

int64_t UnixMicros() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// Notes an in-place recovery that resumes at the current step.
void NoteRecovery(Training& t) {
  t.resumed_at_steps.push_back(t.step);
  t.resumed_step_micros.push_back(0);
}

// The small record a survivor hands to new members with the model:
// [epoch, position, step, resumed_from, epochs reached, n, epoch_samples...,
//  m, resumed_at_steps..., resumed_step_micros...].
std::vector<int64_t> EncodeState(const Training& t) {
  std::vector<int64_t> r = {
      t.cur_epoch,      t.cur_position,
      t.step,           t.summary.resumed_from_step,
      t.summary.epochs, static_cast<int64_t>(t.epoch_samples.size())};
  r.insert(r.end(), t.epoch_samples.begin(), t.epoch_samples.end());
  r.push_back(static_cast<int64_t>(t.resumed_at_steps.size()));
  r.insert(r.end(), t.resumed_at_steps.begin(), t.resumed_at_steps.end());
  r.insert(r.end(), t.resumed_step_micros.begin(), t.resumed_step_micros.end());
  return r;
}

absl::Status DecodeState(const std::vector<int64_t>& r, Training& t) {
  auto bad = [&] {
    return absl::InternalError(absl::StrFormat(
        "in-place recovery: the survivor's state record (%d values) is "
        "malformed; the workers run different versions of ddprun-mnist",
        r.size()));
  };
  if (r.size() < 7) return bad();
  const size_t n = static_cast<size_t>(r[5]);
  if (r.size() < 7 + n) return bad();
  const size_t m = static_cast<size_t>(r[6 + n]);
  if (r.size() != 7 + n + 2 * m) return bad();
  t.start = {r[0], r[1], r[2], r[3], {}};
  t.cur_epoch = r[0];
  t.cur_position = r[1];
  t.step = r[2];
  t.summary.resumed_from_step = r[3];
  t.summary.epochs = static_cast<int>(r[4]);
  t.epoch_samples.assign(r.begin() + 6, r.begin() + 6 + n);
  t.resumed_at_steps.assign(r.begin() + 7 + n, r.begin() + 7 + n + m);
  t.resumed_step_micros.assign(r.begin() + 7 + n + m, r.end());
  return absl::OkStatus();
}

// --test-die-in-sync (SIGKILL), --test-stop-in-sync (SIGSTOP) and
// --test-block-in-sync (a wait that never ends): this worker dies, stops or
// blocks here when its role matches and it is the first of the job to
// create the marker file.
enum class SyncFault { kDie, kStop, kBlock };

void FaultInSync(const Training& t, const std::string& hook, SyncFault fault,
                 bool has_state, int source) {
  if (hook.empty()) return;
  const size_t colon = hook.find(':');
  const std::string role = hook.substr(0, colon);
  const std::string path = hook.substr(colon + 1);
  const bool sending = has_state && source == t.group.rank;
  if (!(role == "source" ? sending : !has_state)) return;
  const int fd =
      open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return;  // another worker died there already
  const std::string step = std::to_string(t.step) + "\n";
  (void)!write(fd, step.data(), step.size());
  close(fd);
  static constexpr const char* kFlag[] = {"die", "stop", "block"};
  static constexpr const char* kDoes[] = {"kills itself", "stops itself",
                                          "blocks for good"};
  const int i = static_cast<int>(fault);
  spdlog::warn("--test-{}-in-sync: rank {} ({} of the state sync, step {}) {}",
               kFlag[i], t.group.rank, role, t.step, kDoes[i]);
  if (fault == SyncFault::kBlock) {
    for (;;) pause();
  }
  raise(fault == SyncFault::kDie ? SIGKILL : SIGSTOP);
}

// --test-block-on-sigusr2 and --test-spin-on-sigusr2: SIGUSR2 asks the
// worker to hang; it does so after its current step, where a deadlock
// leaves it asleep without using CPU, and a loop that never ends leaves it
// running. A deadlock also comes at the end of a checkpoint write or an
// evaluation, still in its phase, when the signal came there; a spin too,
// when this process went through that phase before: its agent bounds a
// spin there by what the phase cost the rank in CPU, and the first time,
// only by the phase's own bound (minutes), so a spin then waits for the
// next step's end. A deadlock also comes in the middle of a state sync
// (before its tensors), when the signal came before that: its agent finds
// it by a local peer past it there, or by the round's furthest in the sync
// that the server answers (a node's only rank); a spin does not (a
// receiver's CPU while it receives is no spin). --test-block-in-checkpoint-
// on-sigusr2 and --test-spin-in-checkpoint-on-sigusr2 wait for a
// checkpoint's end.
enum class HangPoint { kStep, kCheckpoint, kEval, kSync };
std::atomic<bool> block_requested{false};

void RequestBlock(int) { block_requested.store(true); }

void InstallBlockHook(bool enabled) {
  if (!enabled) return;
  struct sigaction action = {};
  action.sa_handler = RequestBlock;
  action.sa_flags = SA_RESTART;  // a read or write it lands in goes on
  sigemptyset(&action.sa_mask);
  sigaction(SIGUSR2, &action, nullptr);
}

// How often this process came to each HangPoint (BlockIfRequested).
std::array<int, 4> hang_points_reached{};

void BlockIfRequested(const Training& t, HangPoint at) {
  const int reached_before = hang_points_reached[static_cast<int>(at)]++;
  if (!block_requested.load()) return;
  if ((t.options.test_block_in_checkpoint_on_sigusr2 ||
       t.options.test_spin_in_checkpoint_on_sigusr2) &&
      at != HangPoint::kCheckpoint) {
    return;
  }
  static constexpr const char* kWhere[] = {"after", "in its checkpoint after",
                                           "in its evaluation after",
                                           "in its state sync at"};
  if (t.options.test_spin_on_sigusr2 ||
      t.options.test_spin_in_checkpoint_on_sigusr2) {
    if (at == HangPoint::kSync ||
        (at != HangPoint::kStep && reached_before == 0)) {
      return;
    }
    spdlog::warn("--test-spin-on-sigusr2: rank {} spins for good {} step {}",
                 t.group.rank, kWhere[static_cast<int>(at)], t.step);
    // A volatile counter, so the loop is not optimised away.
    for (volatile uint64_t i = 0;; i = i + 1) {
    }
  }
  spdlog::warn("--test-block-on-sigusr2: rank {} blocks for good {} step {}",
               t.group.rank, kWhere[static_cast<int>(at)], t.step);
  for (;;) pause();
}

// Collective: the rank with the newest state (a survivor) hands its model
// and record to every rank of the group. Returns the source rank, -1 when
// no rank has state (a fresh start). SGD without momentum keeps no
// optimizer state; an optimizer that does would add its buffers here.
absl::StatusOr<int> SyncState(Training& t, bool has_state) {
  std::vector<int64_t> record = EncodeState(t);
  std::vector<at::Tensor> tensors = t.model->parameters();
  StateSyncOptions sync_options;
  if (!t.options.test_die_in_sync.empty() ||
      !t.options.test_stop_in_sync.empty() ||
      !t.options.test_block_in_sync.empty() ||
      t.options.test_block_on_sigusr2) {
    sync_options.before_tensors = [&t, has_state](int source) {
      const MnistTrainOptions& o = t.options;
      FaultInSync(t, o.test_die_in_sync, SyncFault::kDie, has_state, source);
      FaultInSync(t, o.test_stop_in_sync, SyncFault::kStop, has_state, source);
      FaultInSync(t, o.test_block_in_sync, SyncFault::kBlock, has_state,
                  source);
      BlockIfRequested(t, HangPoint::kSync);
    };
  }
  absl::StatusOr<int> source = SyncFromSurvivor(t.group, has_state, t.step,
                                                record, tensors, sync_options);
  if (!source.ok() || *source < 0) return source;
  if (absl::Status s = DecodeState(record, t); !s.ok()) return s;
  return source;
}

GradientSync GradientSyncOf(const MnistTrainOptions& options) {
  return options.gradient_sync == "process-group" ? GradientSync::kProcessGroup
                                                  : GradientSync::kAuto;
}

ProcessGroupOptions GroupOptions(const Training& t) {
  ProcessGroupOptions options;
  options.backend = t.backend;
  options.gradient_sync = GradientSyncOf(t.options);
  return options;
}

// Forms the group of round `next` and syncs the state over it (a step of
// Membership::JoinNextRound): the source rank, or -1. A failure (an error,
// or an exception of the group) leaves no group behind.
absl::Status JoinRound(Training& t, const WorkerEnv& next, bool has_state,
                       int& source) {
  absl::StatusOr<ProcessGroup> group =
      CreateProcessGroup(next, GroupOptions(t));
  if (!group.ok()) return group.status();
  t.group = *std::move(group);
  spdlog::debug("in-place recovery: process group formed");
  absl::Cleanup drop = [&t] { t.group = ProcessGroup(); };
  absl::StatusOr<int> synced = SyncState(t, has_state);
  if (!synced.ok()) return synced.status();
  std::move(drop).Cancel();
  spdlog::debug("in-place recovery: state synced");
  source = *synced;
  return absl::OkStatus();
}

// A new member's first sync, over the group it formed in SetUp: it takes a
// survivor's state. When the sync fails (a member died in it: the survivor
// sending, or another new member), this process goes on as survivors do:
// it drops the group and joins the next round, where it syncs again, from
// a survivor that still holds the state or from nobody (then the job
// resumes from its checkpoint, or from scratch). Returns the source rank.
absl::StatusOr<int> FirstSync(Training& t) {
  absl::Status failed;
  try {
    absl::StatusOr<int> synced = SyncState(t, /*has_state=*/false);
    if (synced.ok() || synced.status().code() == absl::StatusCode::kInternal) {
      return synced;
    }
    failed = synced.status();
  } catch (const std::exception& e) {
    failed = absl::UnavailableError(e.what());
  }
  spdlog::warn(
      "rank {}: the state sync of round {} failed ({}); waiting for "
      "the next round",
      t.env.rank, t.env.round, std::string(failed.message()));
  t.group = ProcessGroup();
  int source = -1;
  absl::StatusOr<WorkerEnv> env =
      t.membership->JoinNextRound(failed, [&](const WorkerEnv& next) {
        return JoinRound(t, next, /*has_state=*/false, source);
      });
  if (!env.ok()) return env.status();
  t.env = *env;
  t.lead = env->rank == 0;
  t.world = env->world_size;
  return source;
}

// What needs no round: the options checked, the model built, the data
// checked and loading on a thread of its own.
struct BeforeRound {
  BackendKind backend = BackendKind::kAuto;
  torch::nn::Sequential model{nullptr};
  std::future<absl::StatusOr<MnistData>> loading;
};

absl::StatusOr<BeforeRound> PrepareBeforeRound(
    const MnistTrainOptions& options) {
  // Intra-op threads: LibTorch's own choice, OMP_NUM_THREADS when set (ddprun
  // sets 1 when a node runs several workers and the user set none).
  if (absl::Status valid = ValidateOptions(options); !valid.ok()) return valid;
  spdlog::debug("{:.3f} s after start: main", SecondsSinceProcessStart());
  absl::StatusOr<DatasetKind> dataset = ParseDataset(options.dataset);
  if (!dataset.ok()) return dataset.status();
  BeforeRound prepared;
  absl::StatusOr<BackendKind> backend = ParseBackend(options.backend);
  if (!backend.ok()) return backend.status();
  prepared.backend = *backend;
  torch::manual_seed(options.seed);
  absl::StatusOr<torch::nn::Sequential> made =
      MakeMnistModel(options.model, options.hidden);
  if (!made.ok()) return made.status();
  prepared.model = *made;

  MnistOptions data_options;
  data_options.data_dir = options.data_dir;
  data_options.dataset = *dataset;
  data_options.train_limit = options.train_limit;
  data_options.test_limit = options.test_limit;
  // The node's workers decode the set once (prewarmed ones too: ddprun sets
  // this before their round).
  data_options.cache_dir = ReadShmDir();
  // Bad files fail here at once; the loading itself overlaps the wait for
  // the round and the forming of the process group (CPU and memory against
  // mostly waiting on peers).
  if (absl::Status files = CheckMnistFiles(data_options); !files.ok()) {
    return files;
  }
  // The standbys' zygote (ddprun --prewarm) forks them from
  // AwaitActivation with the data loaded, and must run no thread there:
  // it loads on this one.
  const bool zygote = ServesStandbys();
  prepared.loading = std::async(
      zygote ? std::launch::deferred : std::launch::async, [data_options] {
        absl::StatusOr<MnistData> loaded = LoadMnist(data_options);
        spdlog::debug("{:.3f} s after start: data loaded",
                      SecondsSinceProcessStart());
        return loaded;
      });
  if (zygote) prepared.loading.wait();  // runs it now
  // CUDA's runtime starts in the first device query (a large part of a
  // GPU worker's start): done here, it is done before the round too. Not
  // in the zygote: CUDA's threads would stop it forking (its standbys
  // start CUDA after their fork, which is safe).
  if (*backend != BackendKind::kGloo && !zygote) (void)NcclUsable();
  return prepared;
}

// The sampler of this rank in the current world.
void MakeSampler(Training& t) {
  DistributedSamplerOptions sampler_options;
  sampler_options.dataset_size = t.data.train.size();
  sampler_options.rank = t.env.rank;
  sampler_options.world_size = t.world;
  sampler_options.seed = t.options.seed;
  t.sampler.emplace(sampler_options);
  t.per_step =
      static_cast<int64_t>(t.options.batch_size) * t.options.accumulate;
  t.steps_per_epoch = (t.sampler->num_samples() + t.per_step - 1) / t.per_step;
}

int64_t ParameterCount(torch::nn::Sequential& model) {
  int64_t n = 0;
  for (const at::Tensor& p : model->parameters()) n += p.numel();
  return n;
}

// Set-up: everything before the first step. A prewarmed process (ddprun
// --prewarm) does what needs no round before its round starts.
absl::StatusOr<std::unique_ptr<Training>> SetUp(
    const MnistTrainOptions& options) {
  absl::StatusOr<BeforeRound> prepared = PrepareBeforeRound(options);
  if (!prepared.ok()) return prepared.status();
  if (absl::Status activated = AwaitActivation(); !activated.ok()) {
    return activated;
  }
  spdlog::debug("{:.3f} s after start: round's environment",
                SecondsSinceProcessStart());
  absl::StatusOr<WorkerEnv> env = ReadWorkerEnv();
  if (!env.ok()) return env.status();
  auto t = std::make_unique<Training>(options);
  t->env = *env;
  // It reports its checkpoints and evaluations (SaveProgress, Evaluate).
  DeclareReportsBetweenSteps(t->env.progress_fd);
  t->lead = env->rank == 0;
  t->world = env->world_size;
  t->model = prepared->model;

  // --no-in-place: a Membership that never changes (restart everything).
  // Started before the first group forms, so that ddprun hears at once that
  // this process recovers in place.
  WorkerEnv membership_env = *env;
  if (!options.in_place) membership_env.control_fd = -1;
  absl::StatusOr<std::unique_ptr<Membership>> membership =
      Membership::Start(membership_env);
  if (!membership.ok()) return membership.status();
  t->membership = *std::move(membership);
  t->backend = prepared->backend;
  ProcessGroupOptions group_options = GroupOptions(*t);
  absl::StatusOr<ProcessGroup> group;
  absl::StatusOr<WorkerEnv> joined = t->membership->JoinFirstRound(
      *env, [&group, &group_options](const WorkerEnv& round) {
        group = CreateProcessGroup(round, group_options);
        return group.status();
      });
  absl::StatusOr<MnistData> data = prepared->loading.get();
  if (!data.ok()) return data.status();
  if (!joined.ok()) return joined.status();
  t->env = *joined;
  t->lead = joined->rank == 0;
  t->world = joined->world_size;
  t->group = *std::move(group);
  t->data = *std::move(data);
  const c10::Device device = t->group.device;
  spdlog::debug("{:.3f} s after start: process group formed",
                SecondsSinceProcessStart());

  t->model->to(device);
  if (!device.is_cpu()) {
    // Once, not per step: the whole set fits in GPU memory (~220 MB).
    for (MnistSplit* split : {&t->data.train, &t->data.test}) {
      split->images = split->images.to(device);
      split->labels = split->labels.to(device);
    }
  }
  // A member that joins a running job (in-place recovery) takes the state
  // of a survivor; only when nobody has one does the job start (fresh or
  // from a checkpoint).
  int source = -1;
  if (t->membership->enabled()) {
    absl::StatusOr<int> synced = FirstSync(*t);
    if (!synced.ok()) return synced.status();
    source = *synced;
  }
  if (source < 0) {
    absl::StatusOr<StartPoint> resumed =
        Resume(options, t->env, t->group, t->model);
    if (!resumed.ok()) return resumed.status();
    t->start = *resumed;
    t->step = t->start.step;
    t->cur_epoch = t->start.epoch;
    t->cur_position = t->start.epoch_position;
    t->summary.resumed_from_step = t->start.resumed_from;
    // The samples the checkpoint's steps trained count as trained.
    t->epoch_samples = t->start.epoch_samples;
    t->summary.epochs = static_cast<int>(t->start.epoch);
  } else {
    NoteRecovery(*t);
    spdlog::info(
        "rank {} joined the running job in place: state of rank {} "
        "at step {} (epoch {}, sample {})",
        t->env.rank, source, t->step, t->start.epoch + 1,
        t->start.epoch_position);
  }
  const StartPoint* start = &t->start;
  spdlog::debug("{:.3f} s after start: resume point agreed",
                SecondsSinceProcessStart());
  DataParallelOptions ddp_options;
  ddp_options.bucket_mb = options.bucket_mb;
  t->ddp.emplace(t->model->parameters(), t->group, ddp_options);
  if (source < 0) t->ddp->BroadcastParameters();
  // The steps' gradients go through shared memory when the round is one
  // node: its Gloo group's transport thread would only take the ranks'
  // cores until a recovery needs it again.
  ReleaseIdleCollectives(t->group);
  spdlog::debug("{:.3f} s after start: parameters broadcast",
                SecondsSinceProcessStart());
  t->optimizer.emplace(t->model->parameters(),
                       torch::optim::SGDOptions(options.lr));

  MakeSampler(*t);

  const int64_t parameters = ParameterCount(t->model);
  if (t->lead) {
    spdlog::info(
        "training {} ({} parameters) on {} train / {} test samples, world "
        "size {}, backend {}{}, batch {} per rank, {} gradient bucket(s){}",
        options.model, parameters, t->data.train.size(), t->data.test.size(),
        t->world, BackendName(t->group.backend),
        t->group.direct ? " (direct allreduce)" : "", options.batch_size,
        t->ddp->num_buckets(),
        start->resumed_from >= 0
            ? absl::StrFormat(", resuming from step %d (epoch %d, sample %d)",
                              start->step, start->epoch + 1,
                              start->epoch_position)
            : std::string());
  }
  if (!options.step_times.empty()) {
    t->step_times_fd = open(options.step_times.c_str(),
                            O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (t->step_times_fd < 0) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "--step-times: cannot open '%s': %s; give a writable path",
          options.step_times, strerror(errno)));
    }
  }
  ProgressOptions progress_options;
  // DataParallel reports the steps on the agent's pipe; this only shows.
  progress_options.fd = -1;
  progress_options.display = t->lead && options.progress;
  t->progress.emplace(progress_options);

  t->summary.world_size = t->world;
  t->summary.parameters = parameters;
  t->stop = options.max_steps > 0 && t->step >= options.max_steps;
  return t;
}

// Rank 0 saves where training stands (with --checkpoint-dir).
absl::Status SaveProgress(const Training& t, int64_t epoch, int64_t position) {
  if (t.options.checkpoint_dir.empty()) return absl::OkStatus();
  // Every rank: the others wait for rank 0's write in their next step, and
  // a checkpoint's bound is not a step's. The next step ends the phase.
  ReportPhase(t.env.progress_fd, Phase::kCheckpoint);
  if (!t.lead) {
    BlockIfRequested(t, HangPoint::kCheckpoint);
    return absl::OkStatus();
  }
  TrainingCheckpoint c;
  c.model = StateDict(*t.model);
  c.lr = t.options.lr;
  c.epoch = epoch;
  c.epoch_position = position;
  c.step = t.step;
  c.seed = t.options.seed;
  c.world_size = t.world;
  c.epoch_samples = t.epoch_samples;
  if (absl::Status s = SaveCheckpoint(t.options.checkpoint_dir, c); !s.ok()) {
    return absl::Status(s.code(),
                        absl::StrCat(s.message(), " (--checkpoint-dir)"));
  }
  // What a restart resumes from (tests/launcher/partition_test.py).
  spdlog::info("checkpoint of step {} saved (epoch {}, sample {}) in round {}",
               t.step, epoch + 1, position, t.env.round);
  BlockIfRequested(t, HangPoint::kCheckpoint);
  return absl::OkStatus();
}

// One optimizer step over indices [begin, end) of the epoch's `indices`:
// micro-batches of --batch-size, all but the last under NoSync. Returns the
// sum of the micro-batches' losses and their number. An empty range (a
// resumed epoch split unevenly left this rank without samples for the
// step) still takes part in the gradient sync with zero gradients, as
// PyTorch's Join does for ranks out of inputs: one sample's loss times 0.
std::pair<double, int64_t> TrainStep(Training& t, const at::Tensor& indices,
                                     int64_t begin, int64_t end) {
  const c10::Device device = t.group.device;
  double loss_sum = 0;
  int64_t batches = 0;
  // None, not zeros (the first backward then hands its gradient over
  // instead of adding it to 400 KB of zeros; PyTorch 2's default too),
  // unless the gradients are views in shared memory: zeroed in place there.
  t.ddp->ZeroGrad();
  if (begin >= end) {
    at::Tensor x = t.data.train.images.narrow(0, 0, 1).to(device);
    at::Tensor y = t.data.train.labels.narrow(0, 0, 1).to(device);
    (at::cross_entropy_loss(t.model->forward(x), y) * 0).backward();
    ++t.shadow_steps;
  }
  for (int64_t micro = begin; micro < end; micro += t.options.batch_size) {
    const int64_t n = std::min<int64_t>(t.options.batch_size, end - micro);
    std::optional<DataParallel::NoSync> no_sync;
    if (micro + n < end) no_sync.emplace(*t.ddp);
    at::Tensor idx = indices.narrow(0, micro, n);
    at::Tensor x = t.data.train.images.index_select(0, idx).to(device);
    at::Tensor y = t.data.train.labels.index_select(0, idx).to(device);
    at::Tensor loss = at::cross_entropy_loss(t.model->forward(x), y);
    loss.backward();
    t.loss_value = loss.item<double>();
    loss_sum += t.loss_value;
    ++batches;
  }
  t.ddp->FinishGradientSync();
  t.optimizer->step();
  ++t.step;
  return {loss_sum, batches};
}

// One epoch (from where the checkpoint left it when resuming), with
// checkpoints every --checkpoint-every steps and at its end; rank 0 logs
// the test accuracy.
absl::Status TrainEpoch(Training& t, int64_t epoch) {
  const MnistTrainOptions& options = t.options;
  const c10::Device device = t.group.device;
  int64_t position = epoch == t.start.epoch ? t.start.epoch_position : 0;
  t.sampler->SetEpoch(epoch, position);
  t.cur_epoch = epoch;
  t.cur_position = position;
  if (static_cast<int64_t>(t.epoch_samples.size()) <= epoch) {
    t.epoch_samples.resize(epoch + 1, 0);
  }
  const std::vector<int64_t>& indices = t.sampler->indices();
  const int64_t count = static_cast<int64_t>(indices.size());
  // Every rank takes as many steps as the rank with the most indices (a
  // resumed epoch is split unevenly): the same collectives on all ranks.
  const int64_t steps_end = t.sampler->max_indices();
  at::Tensor all_indices = at::tensor(indices, at::kLong).to(device);
  auto epoch_start = Clock::now();
  double loss_sum = 0;
  int64_t batches = 0;
  int64_t epoch_samples = 0;  // all ranks'
  const int64_t first_step_in_epoch =
      t.steps_per_epoch - (steps_end + t.per_step - 1) / t.per_step;
  for (int64_t begin = 0; begin < steps_end; begin += t.per_step) {
    const int64_t step_end = std::min(begin + t.per_step, steps_end);
    // This rank's part of the step (empty when it has no samples left).
    const int64_t end = std::min(step_end, count);
    // In-place recovery: a new round was announced (another rank failed, or
    // the group grows), or this step's collective failed.
    if (t.membership->changed()) {
      t.recover = true;
      break;
    }
    std::pair<double, int64_t> stepped;
    try {
      stepped = TrainStep(t, all_indices, std::min(begin, end), end);
    } catch (const std::exception& e) {
      if (!t.membership->enabled()) throw;
      t.recover = true;
      t.recover_cause = absl::UnavailableError(
          absl::StrFormat("step %d failed: %s", t.step + 1, e.what()));
      break;
    }
    auto [step_loss, step_batches] = stepped;
    loss_sum += step_loss;
    batches += step_batches;
    const int64_t step_samples = t.sampler->samples_between(begin, step_end);
    epoch_samples += step_samples;
    t.samples_trained += std::max<int64_t>(end - begin, 0);
    position = t.sampler->position(step_end);
    t.cur_position = position;
    t.epoch_samples[epoch] += step_samples;
    if (!t.resumed_step_micros.empty() && t.resumed_step_micros.back() == 0) {
      t.resumed_step_micros.back() = UnixMicros();
    }
    if (t.step == t.start.step + 1 &&
        t.summary.time_to_first_step_seconds == 0) {
      t.summary.time_to_first_step_seconds = SecondsSinceProcessStart();
      t.summary.first_step_unix_seconds =
          std::chrono::duration<double>(
              std::chrono::system_clock::now().time_since_epoch())
              .count();
    }
    StepProgress p;
    p.epoch = static_cast<int>(epoch);
    p.epochs = options.epochs;
    p.step = t.step;
    p.steps_per_epoch = t.steps_per_epoch;
    p.step_in_epoch = first_step_in_epoch + (begin / t.per_step) + 1;
    p.loss = t.loss_value;
    p.samples_per_step = t.per_step * t.world;
    p.samples_per_sec = epoch_samples / std::max(Since(epoch_start), 1e-9);
    t.progress->OnStep(p);
    if (t.step_times_fd >= 0) {
      // One write of one short line: appends from all ranks never mix.
      const std::string line =
          absl::StrFormat("%d %d %d\n", t.step, UnixMicros(), getpid());
      (void)!write(t.step_times_fd, line.data(), line.size());
    }
    BlockIfRequested(t, HangPoint::kStep);
    const bool epoch_done = step_end == steps_end;
    if (!epoch_done && options.checkpoint_every > 0 &&
        t.step % options.checkpoint_every == 0) {
      if (absl::Status s = SaveProgress(t, epoch, position); !s.ok()) return s;
    }
    if (options.max_steps > 0 && t.step >= options.max_steps && !epoch_done) {
      t.stop = true;
      break;
    }
  }
  double epoch_seconds = Since(epoch_start);
  t.train_seconds += epoch_seconds;
  t.progress->EndLine();
  if (t.recover) return absl::OkStatus();
  if (!t.stop) {
    if (absl::Status s = SaveProgress(t, epoch + 1, 0); !s.ok()) return s;
    if (options.max_steps > 0 && t.step >= options.max_steps) t.stop = true;
  }
  // Every rank, as for a checkpoint: the others wait for rank 0's
  // evaluation in their next step, and a full test set through a wide model
  // on a loaded machine takes longer than a step's bound.
  ReportPhase(t.env.progress_fd, Phase::kEval);
  if (t.lead) {
    double accuracy = Accuracy(t.model, t.data.test, device);
    t.summary.test_accuracy = accuracy;
    spdlog::info(
        "epoch {}/{}: loss {:.4f}, {:.0f} samples/s, test accuracy "
        "{:.2f}%",
        epoch + 1, options.epochs, batches ? loss_sum / batches : 0.0,
        epoch_samples / std::max(epoch_seconds, 1e-9), 100.0 * accuracy);
  }
  BlockIfRequested(t, HangPoint::kEval);
  t.summary.epochs = static_cast<int>(epoch + 1);
  return absl::OkStatus();
}

// Finish: the summary's figures; rank 0 saves the model and the summary.
absl::Status Finish(Training& t) {
  ReportPhase(t.env.progress_fd, Phase::kStop);
  const MnistTrainOptions& options = t.options;
  t.summary.steps = t.step;
  t.summary.final_loss = t.loss_value;
  t.summary.epoch_samples = t.epoch_samples;
  // Padding is not counted (DistributedSampler::samples_between): an epoch
  // whose samples were each trained once adds up to the data set.
  t.summary.epoch_size = t.data.train.size();
  if (t.shadow_steps > 0) {
    spdlog::info(
        "rank {} took part in {} step(s) with no samples of its own "
        "(the rest of a resumed epoch did not divide evenly)",
        t.env.rank, t.shadow_steps);
  }
  t.summary.resumed_at_steps = t.resumed_at_steps;
  for (int64_t micros : t.resumed_step_micros) {
    t.summary.resumed_step_unix_seconds.push_back(micros / 1e6);
  }
  t.summary.samples_per_sec =
      t.samples_trained * t.world / std::max(t.train_seconds, 1e-9);
  const int64_t steps_here = t.step - t.start.step;
  t.summary.allreduce_seconds_per_step =
      steps_here > 0 ? t.ddp->sync_seconds() / steps_here : 0.0;
  t.summary.intra_op_threads = at::get_num_threads();
  t.summary.allreduces_in_place = t.ddp->gradient_stats().in_place;
  t.summary.allreduces_in_place_fallbacks = t.ddp->gradient_stats().copied;
  if (!t.lead) return absl::OkStatus();
  if (!options.save_path.empty()) {
    absl::Status saved = SaveStateDict(options.save_path, StateDict(*t.model));
    if (!saved.ok()) return saved;
    spdlog::info("saved the model to {}", options.save_path);
  }
  if (!options.summary_json.empty()) {
    // The model's exact bits, which the summary's rounded figures hide.
    uint64_t digest = kFnv1a64Offset;
    for (const auto& item : t.model->named_parameters()) {
      const at::Tensor p = item.value().detach().cpu().contiguous();
      digest = Fnv1a64(absl::string_view(static_cast<const char*>(p.data_ptr()),
                                         p.numel() * p.element_size()),
                       digest);
    }
    t.summary.parameters_fnv1a64 = digest;
  }
  t.summary.wall_seconds = SecondsSinceProcessStart();
  if (!options.summary_json.empty()) {
    absl::Status written = WriteTrainSummary(options.summary_json, t.summary);
    if (!written.ok()) return written;
  }
  return absl::OkStatus();
}

// In-place recovery: drops the group, waits for the next round, forms its
// group and hands this rank's state to the new members (or takes the
// newest state of a survivor). Training goes on from the last step
// completed on every rank.
absl::Status Recover(Training& t) {
  const int64_t stopped_at = t.step;
  // Everything that holds the old group goes first: peers blocked in a
  // collective with this rank see its sockets close.
  t.ddp.reset();
  t.group = ProcessGroup();
  int source = -1;
  // A round that ends while it forms (a member lost meanwhile), or whose
  // state sync fails (a member died in it), is followed by the next: this
  // rank keeps its state (SyncFromSurvivor changes nothing unless it
  // completes) and joins that one.
  absl::StatusOr<WorkerEnv> env = t.membership->JoinNextRound(
      t.recover_cause, [&](const WorkerEnv& next) -> absl::Status {
        // (The debug lines time a recovery's parts: bench/launcher/
        // inplace_recovery.py --breakdown.)
        spdlog::debug("in-place recovery: round {}'s environment received",
                      next.round);
        return JoinRound(t, next, /*has_state=*/true, source);
      });
  if (!env.ok()) return env.status();
  t.recover = false;
  t.recover_cause = absl::OkStatus();
  t.env = *env;
  t.lead = env->rank == 0;
  t.world = env->world_size;
  NoteRecovery(t);
  DataParallelOptions ddp_options;
  ddp_options.bucket_mb = t.options.bucket_mb;
  t.ddp.emplace(t.model->parameters(), t.group, ddp_options);
  ReleaseIdleCollectives(t.group);  // as in SetUp
  MakeSampler(t);
  t.summary.world_size = t.world;
  t.stop = t.options.max_steps > 0 && t.step >= t.options.max_steps;
  spdlog::info(
      "rank {}: in-place recovery into round {} as rank {} of {}: stopped "
      "at step {}, resuming at step {} (epoch {}, sample {}) with the state "
      "of rank {}",
      t.env.rank, t.env.round, t.env.rank, t.world, stopped_at, t.step,
      t.start.epoch + 1, t.start.epoch_position, source);
  return absl::OkStatus();
}

absl::Status Train(const MnistTrainOptions& options) {
  InstallBlockHook(options.test_block_on_sigusr2 ||
                   options.test_spin_on_sigusr2 ||
                   options.test_block_in_checkpoint_on_sigusr2 ||
                   options.test_spin_in_checkpoint_on_sigusr2);
  absl::StatusOr<std::unique_ptr<Training>> training = SetUp(options);
  if (!training.ok()) return training.status();
  Training& t = **training;
  int64_t epoch = t.start.epoch;
  while (epoch < options.epochs && !t.stop) {
    if (absl::Status s = TrainEpoch(t, epoch); !s.ok()) return s;
    if (t.recover) {
      if (absl::Status s = Recover(t); !s.ok()) return s;
      epoch = t.start.epoch;
      continue;
    }
    ++epoch;
  }
  return Finish(t);
}

}  // namespace

absl::Status RunMnistTraining(const MnistTrainOptions& options) {
  try {
    return Train(options);
  } catch (const c10::Error& e) {
    return absl::InternalError(e.what_without_backtrace());
  } catch (const std::exception& e) {
    // Gloo's own exceptions (a peer's connection reset) and the like.
    return absl::InternalError(e.what());
  }
}

}  // namespace ddprun::worker
