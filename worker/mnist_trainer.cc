#include "worker/mnist_trainer.h"

#include <chrono>
#include <cstdlib>
#include <future>
#include <optional>

#include <ATen/ATen.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/optim/sgd.h>
#include <torch/utils.h>

#include "absl/strings/str_format.h"
#include "common/worker_env.h"
#include "spdlog/spdlog.h"
#include "worker/checkpoint.h"
#include "worker/ddp.h"
#include "worker/distributed_sampler.h"
#include "worker/mnist_data.h"
#include "worker/mnist_model.h"
#include "worker/nccl_group.h"
#include "worker/process_group.h"
#include "worker/process_start.h"
#include "worker/progress.h"
#include "worker/standby.h"
#include "worker/train_summary.h"
#include "worker/worker_env.h"

namespace ddprun::worker {
namespace {

using Clock = std::chrono::steady_clock;

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
  return split.size() == 0 ? 0.0
                           : static_cast<double>(correct) / split.size();
}

// Where training starts: fresh, or from the newest checkpoint.
struct StartPoint {
  int64_t epoch = 0;
  int64_t epoch_position = 0;
  int64_t step = 0;
  int64_t resumed_from = -1;
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
        if (it == c.model.end() || !it->second.sizes().equals(item.value().sizes())) {
          return absl::FailedPreconditionError(absl::StrFormat(
              "checkpoint in %s does not fit --model %s (parameter %s); use "
              "another --checkpoint-dir",
              options.checkpoint_dir, options.model, item.key()));
        }
        item.value().copy_(it->second);
      }
      start.epoch = c.epoch;
      start.epoch_position = c.epoch_position;
      start.step = c.step;
      start.resumed_from = c.step;
      if (c.seed != options.seed) {
        spdlog::warn("checkpoint was written with --seed {}, now {}; the "
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
        at::tensor({start.epoch, start.epoch_position, start.step,
                    start.resumed_from},
                   at::kLong)
            .to(group.device)};
    ::c10d::BroadcastOptions root0;
    root0.rootRank = 0;
    group.collectives->broadcast(counters, root0)->wait();
    at::Tensor on_host = counters[0].cpu();
    const int64_t* v = on_host.data_ptr<int64_t>();
    start = {v[0], v[1], v[2], v[3]};
  }
  return start;
}

absl::Status ValidateOptions(const MnistTrainOptions& o) {
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

absl::Status Train(const MnistTrainOptions& options) {
  at::set_num_threads(1);
  if (absl::Status valid = ValidateOptions(options); !valid.ok()) return valid;
  spdlog::debug("{:.3f} s after start: main", SecondsSinceProcessStart());
  absl::StatusOr<DatasetKind> dataset = ParseDataset(options.dataset);
  if (!dataset.ok()) return dataset.status();
  absl::StatusOr<BackendKind> backend = ParseBackend(options.backend);
  if (!backend.ok()) return backend.status();
  torch::manual_seed(options.seed);
  absl::StatusOr<torch::nn::Sequential> made = MakeMnistModel(options.model);
  if (!made.ok()) return made.status();
  torch::nn::Sequential model = *made;

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
  std::future<absl::StatusOr<MnistData>> loading = std::async(
      std::launch::async, [data_options] {
        absl::StatusOr<MnistData> loaded = LoadMnist(data_options);
        spdlog::debug("{:.3f} s after start: data loaded",
                      SecondsSinceProcessStart());
        return loaded;
      });
  // CUDA's runtime starts in the first device query (a large part of a
  // GPU worker's start): done here, it is done before the round too.
  if (*backend != BackendKind::kGloo) (void)NcclUsable();
  // Nothing above depends on the round: a prewarmed process (ddprun
  // --prewarm) has done it all before its round starts, and waits here.
  if (absl::Status activated = AwaitActivation(); !activated.ok()) {
    return activated;
  }
  spdlog::debug("{:.3f} s after start: round's environment",
                SecondsSinceProcessStart());
  absl::StatusOr<WorkerEnv> env = ReadWorkerEnv();
  if (!env.ok()) return env.status();
  const bool lead = env->rank == 0;
  const int world = env->world_size;

  ProcessGroupOptions group_options;
  group_options.backend = *backend;
  group_options.direct_allreduce = options.direct_allreduce;
  absl::StatusOr<ProcessGroup> group = CreateProcessGroup(*env, group_options);
  absl::StatusOr<MnistData> data = loading.get();
  if (!data.ok()) return data.status();
  if (!group.ok()) return group.status();
  const c10::Device device = group->device;
  spdlog::debug("{:.3f} s after start: process group formed",
                SecondsSinceProcessStart());

  model->to(device);
  if (!device.is_cpu()) {
    // Once, not per step: the whole set fits in GPU memory (~220 MB).
    for (MnistSplit* split : {&data->train, &data->test}) {
      split->images = split->images.to(device);
      split->labels = split->labels.to(device);
    }
  }
  absl::StatusOr<StartPoint> start = Resume(options, *env, *group, model);
  if (!start.ok()) return start.status();
  spdlog::debug("{:.3f} s after start: resume point agreed",
                SecondsSinceProcessStart());
  DataParallelOptions ddp_options;
  ddp_options.bucket_mb = options.bucket_mb;
  ddp_options.overlap = options.overlap;
  DataParallel ddp(model->parameters(), *group, ddp_options);
  ddp.BroadcastParameters();
  spdlog::debug("{:.3f} s after start: parameters broadcast",
                SecondsSinceProcessStart());
  torch::optim::SGD optimizer(model->parameters(),
                              torch::optim::SGDOptions(options.lr));

  DistributedSamplerOptions sampler_options;
  sampler_options.dataset_size = data->train.size();
  sampler_options.rank = env->rank;
  sampler_options.world_size = world;
  sampler_options.seed = options.seed;
  DistributedSampler sampler(sampler_options);
  const int64_t per_step = static_cast<int64_t>(options.batch_size) * options.accumulate;
  const int64_t steps_per_epoch = (sampler.num_samples() + per_step - 1) / per_step;

  if (lead) {
    spdlog::info(
        "training {} on {} train / {} test samples, world size {}, backend "
        "{}{}, batch {} per rank, {} gradient bucket(s){}",
        options.model, data->train.size(), data->test.size(), world,
        BackendName(group->backend), group->direct ? " (direct allreduce)" : "",
        options.batch_size, ddp.num_buckets(),
        start->resumed_from >= 0
            ? absl::StrFormat(", resuming from step %d (epoch %d, sample %d)",
                              start->step, start->epoch + 1,
                              start->epoch_position)
            : std::string());
  }
  ProgressOptions progress_options;
  progress_options.fd = env->progress_fd;
  progress_options.display = lead && options.progress;
  ProgressReporter progress(progress_options);

  auto save_checkpoint = [&](int64_t epoch, int64_t position, int64_t step) {
    if (!lead || options.checkpoint_dir.empty()) return absl::OkStatus();
    TrainingCheckpoint c;
    c.model = StateDict(*model);
    c.lr = options.lr;
    c.epoch = epoch;
    c.epoch_position = position;
    c.step = step;
    c.seed = options.seed;
    c.world_size = world;
    return SaveCheckpoint(options.checkpoint_dir, c);
  };

  TrainSummary summary;
  summary.world_size = world;
  summary.resumed_from_step = start->resumed_from;
  summary.epochs = static_cast<int>(start->epoch);
  int64_t step = start->step;
  int64_t samples_trained = 0;  // by this rank, this run
  double train_seconds = 0;
  double loss_value = 0;
  bool stop = options.max_steps > 0 && step >= options.max_steps;
  for (int64_t epoch = start->epoch; epoch < options.epochs && !stop; ++epoch) {
    int64_t position = epoch == start->epoch ? start->epoch_position : 0;
    sampler.SetEpoch(epoch, position);
    const std::vector<int64_t>& indices = sampler.indices();
    const int64_t count = static_cast<int64_t>(indices.size());
    at::Tensor all_indices = at::tensor(indices, at::kLong).to(device);
    auto epoch_start = Clock::now();
    double loss_sum = 0;
    int64_t batches = 0;
    int64_t epoch_samples = 0;
    const int64_t first_step_in_epoch = steps_per_epoch - (count + per_step - 1) / per_step;
    for (int64_t begin = 0; begin < count; begin += per_step) {
      const int64_t end = std::min(begin + per_step, count);
      // None, not zeros: the first backward then hands its gradient over
      // instead of adding it to 400 KB of zeros (PyTorch 2's default too).
      model->zero_grad(/*set_to_none=*/true);
      for (int64_t micro = begin; micro < end; micro += options.batch_size) {
        const int64_t n = std::min<int64_t>(options.batch_size, end - micro);
        std::optional<DataParallel::NoSync> no_sync;
        if (micro + n < end) no_sync.emplace(ddp);
        at::Tensor idx = all_indices.narrow(0, micro, n);
        at::Tensor x = data->train.images.index_select(0, idx).to(device);
        at::Tensor y = data->train.labels.index_select(0, idx).to(device);
        at::Tensor loss = at::cross_entropy_loss(model->forward(x), y);
        loss.backward();
        loss_value = loss.item<double>();
        loss_sum += loss_value;
        ++batches;
      }
      ddp.FinishGradientSync();
      optimizer.step();
      ++step;
      epoch_samples += end - begin;
      position += (end - begin) * world;
      if (step == start->step + 1) {
        summary.time_to_first_step_seconds = SecondsSinceProcessStart();
        summary.first_step_unix_seconds =
            std::chrono::duration<double>(
                std::chrono::system_clock::now().time_since_epoch())
                .count();
      }
      StepProgress p;
      p.epoch = static_cast<int>(epoch);
      p.epochs = options.epochs;
      p.step = step;
      p.steps_per_epoch = steps_per_epoch;
      p.step_in_epoch = first_step_in_epoch + (begin / per_step) + 1;
      p.loss = loss_value;
      p.samples_per_step = per_step * world;
      p.samples_per_sec = epoch_samples * world / std::max(Since(epoch_start), 1e-9);
      progress.OnStep(p);
      const bool epoch_done = end == count;
      if (!epoch_done && options.checkpoint_every > 0 &&
          step % options.checkpoint_every == 0) {
        if (absl::Status s = save_checkpoint(epoch, position, step); !s.ok()) return s;
      }
      if (options.max_steps > 0 && step >= options.max_steps && !epoch_done) {
        stop = true;
        break;
      }
    }
    double epoch_seconds = Since(epoch_start);
    train_seconds += epoch_seconds;
    samples_trained += epoch_samples;
    progress.EndLine();
    if (!stop) {
      if (absl::Status s = save_checkpoint(epoch + 1, 0, step); !s.ok()) return s;
      if (options.max_steps > 0 && step >= options.max_steps) stop = true;
    }
    if (lead) {
      double accuracy = Accuracy(model, data->test, device);
      summary.test_accuracy = accuracy;
      spdlog::info(
          "epoch {}/{}: loss {:.4f}, {:.0f} samples/s, test accuracy "
          "{:.2f}%",
          epoch + 1, options.epochs, batches ? loss_sum / batches : 0.0,
          epoch_samples * world / std::max(epoch_seconds, 1e-9),
          100.0 * accuracy);
    }
    summary.epochs = static_cast<int>(epoch + 1);
  }

  summary.steps = step;
  summary.final_loss = loss_value;
  summary.samples_per_sec = samples_trained * world / std::max(train_seconds, 1e-9);
  const int64_t steps_here = step - start->step;
  summary.allreduce_seconds_per_step =
      steps_here > 0 ? ddp.sync_seconds() / steps_here : 0.0;
  if (lead) {
    if (!options.save_path.empty()) {
      absl::Status saved = SaveStateDict(options.save_path, StateDict(*model));
      if (!saved.ok()) return saved;
      spdlog::info("saved the model to {}", options.save_path);
    }
    summary.wall_seconds = SecondsSinceProcessStart();
    if (!options.summary_json.empty()) {
      absl::Status written = WriteTrainSummary(options.summary_json, summary);
      if (!written.ok()) return written;
    }
  }
  return absl::OkStatus();
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
