#include "bench/rendezvous/hostile_load.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "bench/rendezvous/server_process.h"
#include "bench/rendezvous/simulated_agents.h"
#include "ddprun/v1/store.grpc.pb.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "rendezvous/core/job_token.h"

namespace ddprun::bench {
namespace {

constexpr char kSecret[] = "ddprun-rdzv-bench-hostile-secret";

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t i = static_cast<size_t>(std::ceil(p * v.size()));
  return v[std::min(v.size() - 1, i == 0 ? 0 : i - 1)];
}

std::unique_ptr<v1::Store::Stub> StoreStub(const std::string& endpoint,
                                           int channel) {
  grpc::ChannelArguments args;
  args.SetInt("ddprun.bench.channel", channel);  // its own connection
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  args.SetMaxSendMessageSize(64 << 20);
  return v1::Store::NewStub(grpc::CreateCustomChannel(
      endpoint, grpc::InsecureChannelCredentials(), args));
}

void Authorize(grpc::ClientContext* context, const std::string& token,
               absl::Duration deadline) {
  context->set_deadline(absl::ToChronoTime(absl::Now() + deadline));
  context->AddMetadata("authorization", absl::StrCat("Bearer ", token));
}

}  // namespace

int RunHostileBench(const HostileOptions& options) {
  char dir_template[] = "/tmp/ddprun-rdzv-bench-XXXXXX";
  if (mkdtemp(dir_template) == nullptr) {
    std::fprintf(stderr, "cannot make a temporary folder\n");
    return 1;
  }
  const std::string dir = dir_template;
  const std::string secret_file = dir + "/secret";
  std::ofstream(secret_file) << kSecret << "\n";
  chmod(secret_file.c_str(), 0600);
  const std::string cap = absl::StrCat(options.store_cap_bytes);
  std::vector<std::string> args = {"--token-file",          secret_file,
                                   "--max-store-bytes",     cap,
                                   "--max-job-store-bytes", cap};
  if (options.memory_bound) {
    args.push_back("--max-memory-bytes");
    args.push_back(cap);
  }
  args.insert(args.end(), options.server_args.begin(),
              options.server_args.end());
  auto server = ServerProcess::Start(options.server_binary, args);
  unlink(secret_file.c_str());
  rmdir(dir.c_str());
  if (!server.ok()) {
    std::fprintf(stderr, "%s\n", server.status().ToString().c_str());
    return 1;
  }
  const std::string victim_token = *rendezvous::JobToken(kSecret, "victim");
  const std::string hog_token = *rendezvous::JobToken(kSecret, "hog");

  AgentsOptions agents_options;
  agents_options.endpoint = server->endpoint();
  agents_options.run_id = "victim";
  agents_options.nodes = options.victim_nodes;
  agents_options.channels = options.victim_nodes;
  agents_options.max_restarts =
      2 * options.blocks * options.rounds_per_block + 1;
  agents_options.token = victim_token;
  SimulatedAgents victim(agents_options);
  auto victim_store = StoreStub(server->endpoint(), 1000);

  std::atomic<bool> hog_on{false};
  std::atomic<bool> stop{false};
  std::atomic<int64_t> hog_ok{0};
  std::atomic<int64_t> hog_refused{0};
  std::atomic<int64_t> hog_other{0};
  std::vector<std::thread> hogs;
  for (int h = 0; h < options.hog_threads; ++h) {
    hogs.emplace_back([&, h] {
      auto store = StoreStub(server->endpoint(), 2000 + h);
      const std::string value(options.hog_value_bytes, 'h');
      for (int64_t i = 0; !stop.load(); ++i) {
        if (!hog_on.load()) {
          absl::SleepFor(absl::Milliseconds(5));
          continue;
        }
        grpc::ClientContext context;
        Authorize(&context, hog_token, absl::Seconds(30));
        v1::SetRequest request;
        request.mutable_scope()->set_run_id("hog");
        request.set_key(absl::StrCat("fill-", h, "-", i));
        request.set_value(value);
        v1::SetResponse response;
        grpc::Status status = store->Set(&context, request, &response);
        if (status.ok()) {
          hog_ok.fetch_add(1);
        } else if (status.error_code() ==
                   grpc::StatusCode::RESOURCE_EXHAUSTED) {
          hog_refused.fetch_add(1);
        } else {
          hog_other.fetch_add(1);
        }
      }
    });
  }

  std::vector<double> quiet_ms;
  std::vector<double> hostile_ms;
  long hostile_rss_kib = 0;
  std::string error;
  auto run_round = [&]() -> double {
    absl::Time start = absl::Now();
    JoinResult joined = victim.JoinAll(absl::Seconds(60));
    if (!joined.error.empty()) {
      error = "join: " + joined.error;
      return -1;
    }
    v1::StoreScope scope;
    scope.set_run_id("victim");
    scope.set_round(victim.round());
    grpc::ClientContext set_context;
    Authorize(&set_context, victim_token, absl::Seconds(30));
    v1::SetRequest set;
    *set.mutable_scope() = scope;
    set.set_key("MASTER_ADDR");
    set.set_value(std::string(1024, 'v'));
    v1::SetResponse set_response;
    grpc::Status status = victim_store->Set(&set_context, set, &set_response);
    if (status.ok()) {
      grpc::ClientContext get_context;
      Authorize(&get_context, victim_token, absl::Seconds(30));
      v1::GetRequest get;
      *get.mutable_scope() = scope;
      get.set_key("MASTER_ADDR");
      v1::GetResponse got;
      status = victim_store->Get(&get_context, get, &got);
    }
    double ms = absl::ToDoubleMilliseconds(absl::Now() - start);
    if (!status.ok()) {
      error = "store: " + status.error_message();
      return -1;
    }
    absl::Status ended = victim.EndRound();
    if (!ended.ok()) {
      error = "end round: " + std::string(ended.message());
      return -1;
    }
    return ms;
  };
  for (int block = 0; block < 2 * options.blocks && error.empty(); ++block) {
    bool hostile = block % 2 == 1;
    hog_on.store(hostile);
    if (hostile) absl::SleepFor(absl::Milliseconds(200));  // the hog ramps up
    for (int r = 0; r < options.rounds_per_block && error.empty(); ++r) {
      double ms = run_round();
      if (ms < 0) break;
      (hostile ? hostile_ms : quiet_ms).push_back(ms);
      if (hostile)
        hostile_rss_kib = std::max(hostile_rss_kib, server->RssKib());
    }
  }
  stop.store(true);
  for (std::thread& hog : hogs) hog.join();
  const long peak_kib = server->PeakRssKib();

  const double cap_mib = options.store_cap_bytes / 1048576.0;
  std::printf(
      "hostile load: victim %d nodes, %d rounds per block, %d quiet + %d "
      "hostile blocks interleaved; hog %d connections x %d KiB Sets; store cap "
      "%.0f MiB (--max-store-bytes = --max-job-store-bytes%s)\n",
      options.victim_nodes, options.rounds_per_block, options.blocks,
      options.blocks, options.hog_threads, options.hog_value_bytes / 1024,
      cap_mib, options.memory_bound ? " = --max-memory-bytes" : "");
  if (!error.empty()) {
    std::printf("victim round failed: %s\n", error.c_str());
    return 1;
  }
  const double quiet_p99 = Percentile(quiet_ms, 0.99);
  const double hostile_p99 = Percentile(hostile_ms, 0.99);
  std::printf("%-8s %8s %10s %10s\n", "victim", "rounds", "p50_ms", "p99_ms");
  std::printf("%-8s %8zu %10.1f %10.1f\n", "quiet", quiet_ms.size(),
              Percentile(quiet_ms, 0.5), quiet_p99);
  std::printf("%-8s %8zu %10.1f %10.1f\n", "hostile", hostile_ms.size(),
              Percentile(hostile_ms, 0.5), hostile_p99);
  std::printf("p99 hostile / quiet: %.2fx (goal <= 2x)\n",
              quiet_p99 > 0 ? hostile_p99 / quiet_p99 : 0.0);
  std::printf(
      "hog Sets: %lld stored, %lld refused RESOURCE_EXHAUSTED, %lld "
      "other errors\n",
      static_cast<long long>(hog_ok.load()),
      static_cast<long long>(hog_refused.load()),
      static_cast<long long>(hog_other.load()));
  std::printf(
      "server RSS under the hog: max %.1f MiB, peak (VmHWM) %.1f MiB; cap + "
      "10%% = %.1f MiB\n",
      hostile_rss_kib / 1024.0, peak_kib / 1024.0, cap_mib * 1.1);
  return hog_other.load() == 0 ? 0 : 1;
}

}  // namespace ddprun::bench
