// pytorch/examples' cpp/distributed/dist-mnist.cpp on libddp: each rank
// trains the same CNN on its part of MNIST (LibTorch's dataset, loader and
// DistributedRandomSampler); DataParallel averages the gradients by the
// path libddp chooses (no option set). Run it under ddprun:
//   ddprun --standalone --nproc-per-node 2 dist-cnn --data-dir DIR
// --batchnorm adds a BatchNorm2d (buffers), synchronised as DDP's
// broadcast_buffers does. --reference-replicas K (world 1) trains on the
// union of what K ranks see at each step: the single-process reference of
// the equivalence test. --dump PATH writes each parameter and buffer as
// text ("name v0 v1 ..."); rank 0 prints the gradient path's counters and
// samples/s. --gradient-sync process-group: the process group's path, for
// comparison (bench). --mkldnn 0: LibTorch's own CPU convolutions instead
// of oneDNN's (tests/deploy/example_cnn_test.sh says why it asks for them).
#include <torch/torch.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "worker/ddp.h"
#include "worker/phase.h"
#include "worker/process_group.h"
#include "worker/worker_env.h"

namespace {

struct Options {
  std::string data_dir = "data/mnist";
  int64_t batch_size = 64;  // per rank
  int64_t steps = 30;
  double lr = 0.01;
  double dropout = 0.5;
  bool batchnorm = false;
  int64_t reference_replicas = 0;
  std::string dump;
  bool process_group = false;  // --gradient-sync process-group (comparison)
  bool tune_malloc = true;     // --tune-malloc 0: glibc's own (comparison)
  bool mkldnn = true;          // --mkldnn 0: convolutions without oneDNN
};

struct Net : torch::nn::Module {
  Net(double dropout, bool batchnorm) : dropout_(dropout) {
    conv1 = register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(
                                         1, 10, /*kernel_size=*/5)));
    conv2 = register_module("conv2", torch::nn::Conv2d(torch::nn::Conv2dOptions(
                                         10, 20, /*kernel_size=*/5)));
    conv2_drop = register_module("conv2_drop", torch::nn::Dropout2d(dropout));
    fc1 = register_module("fc1", torch::nn::Linear(320, 50));
    fc2 = register_module("fc2", torch::nn::Linear(50, 10));
    if (batchnorm) bn = register_module("bn", torch::nn::BatchNorm2d(10));
  }

  torch::Tensor forward(torch::Tensor x) {
    x = conv1->forward(x);
    if (bn) x = bn->forward(x);
    x = torch::relu(torch::max_pool2d(x, 2));
    x = torch::relu(
        torch::max_pool2d(conv2_drop->forward(conv2->forward(x)), 2));
    x = x.view({-1, 320});
    x = torch::relu(fc1->forward(x));
    x = torch::dropout(x, dropout_, is_training());
    return torch::log_softmax(fc2->forward(x), /*dim=*/1);
  }

  double dropout_;
  torch::nn::Conv2d conv1{nullptr}, conv2{nullptr};
  torch::nn::Dropout2d conv2_drop{nullptr};
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
  torch::nn::BatchNorm2d bn{nullptr};
};

using Sampler = torch::data::samplers::DistributedRandomSampler;

auto MakeLoader(const Options& o, size_t replicas, size_t rank) {
  auto dataset = torch::data::datasets::MNIST(o.data_dir)
                     .map(torch::data::transforms::Normalize<>(0.1307, 0.3081))
                     .map(torch::data::transforms::Stack<>());
  Sampler sampler(dataset.size().value(), replicas, rank,
                  /*allow_duplicates=*/false);
  return torch::data::make_data_loader(
      std::move(dataset), std::move(sampler),
      torch::data::DataLoaderOptions().batch_size(o.batch_size).workers(0));
}

int Fail(const std::string& what) {
  std::cerr << "dist-cnn: " << what << "\n";
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--data-dir")
      o.data_dir = value;
    else if (flag == "--batch-size")
      o.batch_size = std::stoll(value);
    else if (flag == "--steps")
      o.steps = std::stoll(value);
    else if (flag == "--lr")
      o.lr = std::stod(value);
    else if (flag == "--dropout")
      o.dropout = std::stod(value);
    else if (flag == "--batchnorm")
      o.batchnorm = value == "1";
    else if (flag == "--reference-replicas")
      o.reference_replicas = std::stoll(value);
    else if (flag == "--dump")
      o.dump = value;
    else if (flag == "--gradient-sync")
      o.process_group = value == "process-group";
    else if (flag == "--tune-malloc")
      o.tune_malloc = value == "1";
    else if (flag == "--mkldnn")
      o.mkldnn = value == "1";
    else
      return Fail("unknown flag " + flag);
  }
  if (argc % 2 == 0) return Fail("every flag takes a value");

  // As the README's snippet: the environment ddprun (or torchrun) gives.
  auto env = ddprun::worker::ReadWorkerEnv();
  if (!env.ok()) return Fail(env.status().ToString());
  // Nothing between its steps goes unreported (it has no evaluation or
  // checkpoint): a rank that spins in a step is found after 1 s of CPU.
  ddprun::worker::DeclareReportsBetweenSteps(env->progress_fd);
  ddprun::worker::ProcessGroupOptions group_options;  // the defaults
  if (o.process_group) {
    group_options.gradient_sync = ddprun::worker::GradientSync::kProcessGroup;
  }
  auto group = ddprun::worker::CreateProcessGroup(*env, group_options);
  if (!group.ok()) return Fail(group.status().ToString());
  const int rank = env->rank;
  const int world = env->world_size;
  if (o.reference_replicas > 0 && world != 1) {
    return Fail("--reference-replicas is for a world of one");
  }

  if (!o.mkldnn) at::globalContext().setUserEnabledMkldnn(false);
  torch::manual_seed(1);
  auto model = std::make_shared<Net>(o.dropout, o.batchnorm);
  ddprun::worker::DataParallelOptions ddp_options;  // the defaults
  ddp_options.tune_malloc = o.tune_malloc;
  ddprun::worker::DataParallel ddp(model->parameters(), *group, ddp_options);
  std::vector<at::Tensor> buffers = model->buffers();
  ddp.BroadcastParameters(buffers);
  ddprun::worker::ReleaseIdleCollectives(*group);
  torch::optim::SGD optimizer(model->parameters(),
                              torch::optim::SGDOptions(o.lr).momentum(0.5));

  // Ranks (or, for the reference, the replicas it stands for) each draw
  // their part of every global batch.
  const size_t replicas =
      o.reference_replicas > 0 ? o.reference_replicas : world;
  std::vector<decltype(MakeLoader(o, 1, 0))> loaders;
  for (size_t r = 0; r < replicas; ++r) {
    if (o.reference_replicas > 0 || static_cast<int>(r) == rank) {
      loaders.push_back(MakeLoader(o, replicas, r));
    }
  }
  std::vector<decltype(loaders[0]->begin())> its;
  for (auto& loader : loaders) its.push_back(loader->begin());

  model->train();
  const auto start = std::chrono::steady_clock::now();
  for (int64_t step = 0; step < o.steps; ++step) {
    std::vector<torch::Tensor> data, target;
    for (size_t i = 0; i < its.size(); ++i) {
      // The next epoch (same order, as pytorch/examples' loop without
      // set_epoch) once this one is used up.
      if (its[i] == loaders[i]->end()) its[i] = loaders[i]->begin();
      data.push_back(its[i]->data);
      target.push_back(its[i]->target);
      ++its[i];
    }
    if (o.batchnorm) ddp.BroadcastBuffers(buffers);  // DDP's broadcast_buffers
    ddp.ZeroGrad();
    auto output = model->forward(torch::cat(data));
    auto loss = torch::nll_loss(output, torch::cat(target));
    loss.backward();
    ddp.FinishGradientSync();
    optimizer.step();
    if (rank == 0 && (step + 1) % 10 == 0) {
      std::cout << "step " << step + 1 << " loss " << loss.item<float>()
                << std::endl;
    }
  }
  // Rank 0's running statistics everywhere, as evaluation would see them.
  if (o.batchnorm) ddp.BroadcastBuffers(buffers);

  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  if (rank == 0) {
    std::cout << "samples_per_sec "
              << o.steps * o.batch_size * static_cast<double>(replicas) /
                     seconds
              << std::endl;
    const auto& stats = ddp.gradient_stats();
    std::cout << "gradient path " << GradientPathName(ddp.gradient_path())
              << " buckets " << ddp.num_buckets() << " in_place "
              << stats.in_place << " copied " << stats.copied
              << " process_group " << stats.process_group << std::endl;
  }
  if (!o.dump.empty()) {
    std::ofstream out(o.dump + "." + std::to_string(rank));
    out.precision(9);
    for (const auto& item : model->named_parameters()) {
      out << item.key();
      auto flat = item.value().detach().reshape({-1}).to(torch::kDouble);
      for (int64_t i = 0; i < flat.numel(); ++i)
        out << " " << flat[i].item<double>();
      out << "\n";
    }
    for (const auto& item : model->named_buffers()) {
      out << "buffer." << item.key();
      auto flat = item.value().reshape({-1}).to(torch::kDouble);
      for (int64_t i = 0; i < flat.numel(); ++i)
        out << " " << flat[i].item<double>();
      out << "\n";
    }
    if (!out) return Fail("cannot write " + o.dump);
  }
  return 0;
}
