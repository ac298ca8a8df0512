#include "worker/mnist_trainer.h"

#include <chrono>
#include <fstream>
#include <optional>

#include <ATen/ATen.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/optim/sgd.h>
#include <torch/utils.h>

#include "absl/strings/str_format.h"
#include "spdlog/spdlog.h"
#include "worker/checkpoint.h"
#include "worker/ddp.h"
#include "worker/distributed_sampler.h"
#include "worker/mnist_data.h"
#include "worker/mnist_model.h"
#include "worker/process_group.h"
#include "worker/process_start.h"
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

struct Summary {
  int world_size = 1;
  int epochs = 0;
  int64_t steps = 0;
  double samples_per_sec = 0;
  double test_accuracy = 0;
  double wall_seconds = 0;
  double time_to_first_step_seconds = 0;
  double final_loss = 0;
  double allreduce_seconds_per_step = 0;
};

absl::Status WriteSummary(const std::string& path, const Summary& s) {
  std::ofstream out(path);
  out << absl::StrFormat(
      "{\"world_size\": %d, \"epochs\": %d, \"steps\": %d, "
      "\"samples_per_sec\": %.1f, \"test_accuracy\": %.6f, "
      "\"wall_seconds\": %.3f, \"time_to_first_step_seconds\": %.3f, "
      "\"final_loss\": %.6f, \"allreduce_seconds_per_step\": %.6f}\n",
      s.world_size, s.epochs, s.steps, s.samples_per_sec, s.test_accuracy,
      s.wall_seconds, s.time_to_first_step_seconds, s.final_loss,
      s.allreduce_seconds_per_step);
  out.close();
  if (!out) {
    return absl::PermissionDeniedError(absl::StrFormat(
        "cannot write the summary %s; choose a writable path", path));
  }
  return absl::OkStatus();
}

absl::Status Train(const MnistTrainOptions& options) {
  at::set_num_threads(1);
  absl::StatusOr<WorkerEnv> env = ReadWorkerEnv();
  if (!env.ok()) return env.status();
  const bool lead = env->rank == 0;
  if (options.batch_size < 1 || options.epochs < 1 || options.lr <= 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--batch-size %d, --epochs %d and --lr %g must be positive",
        options.batch_size, options.epochs, options.lr));
  }

  absl::StatusOr<DatasetKind> dataset = ParseDataset(options.dataset);
  if (!dataset.ok()) return dataset.status();
  absl::StatusOr<BackendKind> backend = ParseBackend(options.backend);
  if (!backend.ok()) return backend.status();

  MnistOptions data_options;
  data_options.data_dir = options.data_dir;
  data_options.dataset = *dataset;
  data_options.train_limit = options.train_limit;
  data_options.test_limit = options.test_limit;
  absl::StatusOr<MnistData> data = LoadMnist(data_options);
  if (!data.ok()) return data.status();

  ProcessGroupOptions group_options;
  group_options.backend = *backend;
  absl::StatusOr<ProcessGroup> group = CreateProcessGroup(*env, group_options);
  if (!group.ok()) return group.status();
  const c10::Device device = group->device;

  torch::manual_seed(options.seed);
  torch::nn::Sequential model = MakeMnistMlp();
  model->to(device);
  DataParallelOptions ddp_options;
  ddp_options.bucket_mb = options.bucket_mb;
  ddp_options.overlap = options.overlap;
  DataParallel ddp(model->parameters(), *group, ddp_options);
  ddp.BroadcastParameters();
  torch::optim::SGD optimizer(model->parameters(),
                              torch::optim::SGDOptions(options.lr));

  DistributedSamplerOptions sampler_options;
  sampler_options.dataset_size = data->train.size();
  sampler_options.rank = env->rank;
  sampler_options.world_size = env->world_size;
  sampler_options.seed = options.seed;
  DistributedSampler sampler(sampler_options);

  if (lead) {
    spdlog::info(
        "training on {} train / {} test samples, world size {}, backend {}, "
        "batch {} per rank, {} gradient bucket(s)",
        data->train.size(), data->test.size(), env->world_size,
        BackendName(group->backend), options.batch_size, ddp.num_buckets());
  }

  Summary summary;
  summary.world_size = env->world_size;
  int64_t step = 0;
  int64_t samples_seen = 0;  // by this rank
  double train_seconds = 0;
  double loss_value = 0;
  bool stop = false;
  for (int epoch = 0; epoch < options.epochs && !stop; ++epoch) {
    sampler.SetEpoch(epoch);
    const std::vector<int64_t>& indices = sampler.indices();
    at::Tensor all_indices = at::tensor(indices, at::kLong);
    auto epoch_start = Clock::now();
    double loss_sum = 0;
    int64_t batches = 0;
    int64_t epoch_samples = 0;
    for (int64_t start = 0; start < static_cast<int64_t>(indices.size());
         start += options.batch_size) {
      int64_t n = std::min<int64_t>(options.batch_size,
                                    indices.size() - start);
      at::Tensor idx = all_indices.narrow(0, start, n);
      at::Tensor x = data->train.images.index_select(0, idx).to(device);
      at::Tensor y = data->train.labels.index_select(0, idx).to(device);
      optimizer.zero_grad();
      at::Tensor loss = at::cross_entropy_loss(model->forward(x), y);
      loss.backward();
      ddp.FinishGradientSync();
      optimizer.step();
      ++step;
      if (step == 1) {
        summary.time_to_first_step_seconds = SecondsSinceProcessStart();
      }
      loss_value = loss.item<double>();
      loss_sum += loss_value;
      ++batches;
      epoch_samples += n;
      if (options.max_steps > 0 && step >= options.max_steps) {
        stop = true;
        break;
      }
    }
    double epoch_seconds = Since(epoch_start);
    train_seconds += epoch_seconds;
    samples_seen += epoch_samples;
    if (lead) {
      double accuracy = Accuracy(model, data->test, device);
      summary.test_accuracy = accuracy;
      spdlog::info(
          "epoch {}/{}: loss {:.4f}, {:.0f} samples/s, test accuracy "
          "{:.2f}%",
          epoch + 1, options.epochs, batches ? loss_sum / batches : 0.0,
          epoch_samples * env->world_size / std::max(epoch_seconds, 1e-9),
          100.0 * accuracy);
    }
    summary.epochs = epoch + 1;
  }

  summary.steps = step;
  summary.final_loss = loss_value;
  summary.samples_per_sec =
      samples_seen * env->world_size / std::max(train_seconds, 1e-9);
  summary.allreduce_seconds_per_step =
      step > 0 ? ddp.sync_seconds() / step : 0.0;
  if (lead) {
    if (!options.save_path.empty()) {
      absl::Status saved = SaveStateDict(options.save_path, StateDict(*model));
      if (!saved.ok()) return saved;
      spdlog::info("saved the model to {}", options.save_path);
    }
    summary.wall_seconds = SecondsSinceProcessStart();
    if (!options.summary_json.empty()) {
      absl::Status written = WriteSummary(options.summary_json, summary);
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
  }
}

}  // namespace ddprun::worker
