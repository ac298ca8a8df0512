// What the straggler figures, the event log and the job page cost the
// rendezvous server, at a simulated job of N nodes x P ranks: the server's
// own work, in process (JobTable with a fake clock, no sockets), with each
// heartbeat parsed from its wire bytes as gRPC would hand it over.
//
//   insight-bench [--nodes 1000] [--nproc 8] [--passes 21]
//                 [--interval-ms 250]
//
// Interleaved passes of the same N heartbeats without figures (the
// baseline) and with them; the medians' difference is the figures' cost
// per heartbeat. The page's cost is one page.json (what the page polls) per
// second; the HTML is loaded once (its refresh rate) for one open page. Printed
// as CPU seconds per second of one core at the heartbeat rate N / interval.
//
//   insight-bench --process [--nodes 1000] [--nproc 8] [--blocks 8]
//                 [--block-seconds 4] [--interval-ms 250] [--stream]
//                 [--no-page | --no-figures]
//
// The whole server process instead (insight_process.h): two real
// ddprun-rendezvous processes, simulated agents beating over real gRPC at
// the job's rate, one without figures or page (the baseline), one with
// both, blocks interleaved; each block's cost is the process's CPU time
// from /proc, gRPC's transport and the HTTP listener included.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/synchronization/mutex.h"
#include "bench/rendezvous/insight_process.h"
#include "common/clock.h"
#include "ddprun/v1/rendezvous.pb.h"
#include "rendezvous/core/job_table.h"
#include "rendezvous/service/job_page.h"

namespace {

using ddprun::rendezvous::Effects;
using ddprun::rendezvous::JobTable;

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

template <typename F>
double SecondsOf(F&& f) {
  const auto start = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
      .count();
}

}  // namespace

int main(int argc, char** argv) {
  int nodes = 1000;
  int nproc = 8;
  int passes = 21;
  int interval_ms = 250;
  CLI::App app(
      "insight-bench: the straggler figures' and the job page's "
      "cost to the rendezvous server");
  app.add_option("--nodes", nodes)->check(CLI::Range(2, 100000));
  app.add_option("--nproc", nproc)->check(CLI::Range(1, 512));
  app.add_option("--passes", passes)->check(CLI::Range(3, 1001));
  app.add_option("--interval-ms", interval_ms)->check(CLI::Range(1, 60000));
  bool process = false;
  ddprun::bench::InsightProcessOptions process_options;
  process_options.server_binary = DDPRUN_RENDEZVOUS_BINARY;
  double block_seconds =
      absl::ToDoubleSeconds(ddprun::bench::InsightProcessOptions{}.block);
  app.add_flag("--process", process,
               "measure whole ddprun-rendezvous processes (their CPU time "
               "from /proc) fed by simulated agents over gRPC");
  app.add_option("--server", process_options.server_binary,
                 "(--process) the ddprun-rendezvous binary")
      ->capture_default_str();
  app.add_option("--blocks", process_options.blocks,
                 "(--process) blocks measured on each server")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000));
  app.add_option("--block-seconds", block_seconds,
                 "(--process) the length of one block")
      ->capture_default_str()
      ->check(CLI::Range(0.5, 600.0));
  bool stream = false;
  app.add_flag("--stream", stream,
               "(--process) beat on Heartbeats streams, one per node, as "
               "ddprun's agents do (default: unary calls)");
  bool no_figures = false;
  app.add_flag("--no-figures", no_figures,
               "(--process) the page alone: the heartbeats carry no figures");
  int figures_interval_ms = -1;
  app.add_option("--figures-interval-ms", figures_interval_ms,
                 "(--process) a node's figures ride on one heartbeat per "
                 "this interval; -1: the server's (its assignment's, as "
                 "ddprun's agents follow it); 0: on every heartbeat, as "
                 "agents did before")
      ->capture_default_str()
      ->check(CLI::Range(-1, 600000));
  int64_t figures_budget = -1;
  app.add_option("--figures-budget", figures_budget,
                 "(--process) the servers' --figures-budget; -1: their "
                 "default")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{-1}, int64_t{1000000}));
  bool no_page = false;
  app.add_flag("--no-page", no_page,
               "(--process) the figures alone: nobody opens the page");
  CLI11_PARSE(app, argc, argv);
  if (process) {
    process_options.page = !no_page;
    process_options.figures = !no_figures;
    process_options.stream = stream;
    process_options.figures_interval =
        figures_interval_ms < 0 ? absl::InfiniteDuration()
                                : absl::Milliseconds(figures_interval_ms);
    process_options.figures_budget = figures_budget;
    // As in ddprun-rendezvous: the simulated agents' gRPC would otherwise
    // spend its time in Abseil's deadlock-detection graph.
    absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
    process_options.nodes = nodes;
    process_options.nproc = nproc;
    process_options.block = absl::Seconds(block_seconds);
    process_options.interval = absl::Milliseconds(interval_ms);
    return ddprun::bench::RunInsightProcessBench(process_options);
  }

  ddprun::common::FakeClock clock;
  JobTable table(&clock);
  ddprun::v1::JobConfig config;
  config.set_min_nodes(nodes);
  config.set_max_nodes(nodes);
  config.set_last_call_timeout_ms(1000);
  config.set_join_timeout_ms(600000);
  config.set_heartbeat_interval_ms(interval_ms);
  config.set_heartbeat_timeout_ms(3600000);
  for (int i = 0; i < nodes; ++i) {
    ddprun::v1::JoinRequest join;
    join.set_run_id("bench");
    join.set_node_id("node-" + std::to_string(i));
    join.set_local_world_size(nproc);
    join.set_node_rank(-1);
    join.set_address("10.0.0.1");
    join.set_master_port(29500);
    *join.mutable_config() = config;
    Effects effects;
    table.Join(join, static_cast<uint64_t>(i + 1), &effects);
  }
  {
    Effects effects;
    table.Tick(&effects);
  }
  // The heartbeats as bytes: plain, and with every rank's figures.
  std::vector<std::string> plain(nodes);
  std::vector<std::string> figured(nodes);
  for (int i = 0; i < nodes; ++i) {
    ddprun::v1::HeartbeatRequest hb;
    hb.set_run_id("bench");
    hb.set_node_id("node-" + std::to_string(i));
    hb.set_round(0);
    hb.SerializeToString(&plain[i]);
    for (int r = 0; r < nproc; ++r) {
      ddprun::v1::RankFigures* f = hb.add_ranks();
      f->set_local_rank(r);
      f->set_phase("step");
      f->set_steps(1000 + r);
      f->set_steps_per_s(40);
      f->set_samples(80);
      const double slow = (i == 7 && r == 3) ? 2.0 : 1.0;  // one straggler
      f->set_compute_mean_s(0.020 * slow + 0.0001 * r);
      f->set_compute_median_s(0.019 * slow);
      f->set_compute_p99_s(0.030 * slow);
    }
    hb.SerializeToString(&figured[i]);
  }
  auto pass = [&](const std::vector<std::string>& wire) {
    return SecondsOf([&] {
      ddprun::v1::HeartbeatRequest request;
      for (const std::string& bytes : wire) {
        request.ParseFromString(bytes);
        (void)table.Heartbeat(request);
      }
    });
  };
  std::vector<double> plain_s, figured_s, json_s, html_s;
  ddprun::rendezvous::StatusSource status =
      [&](const ddprun::v1::StatusRequest& r) { return table.Status(r); };
  size_t json_bytes = 0;
  for (int p = 0; p < passes; ++p) {
    // Alternate which goes first, so that neither always runs warm.
    if (p % 2 == 0) {
      plain_s.push_back(pass(plain));
      figured_s.push_back(pass(figured));
    } else {
      figured_s.push_back(pass(figured));
      plain_s.push_back(pass(plain));
    }
    json_s.push_back(SecondsOf([&] {
      json_bytes = ddprun::rendezvous::JobPage("/jobs/bench/page.json", status)
                       ->body.size();
    }));
    html_s.push_back(SecondsOf(
        [&] { (void)ddprun::rendezvous::JobPage("/jobs/bench", status); }));
    clock.Advance(absl::Milliseconds(interval_ms));
  }
  ddprun::v1::StatusRequest request;
  request.set_run_id("bench");
  const int named = table.Status(request)->jobs(0).stragglers_size();

  const double beats_per_s = nodes * 1000.0 / interval_ms;
  const double per_beat_plain_us = Median(plain_s) / nodes * 1e6;
  const double per_beat_figured_us = Median(figured_s) / nodes * 1e6;
  const double figures_cpu =
      (per_beat_figured_us - per_beat_plain_us) * 1e-6 * beats_per_s;
  const double page_cpu = Median(json_s);  // one refresh/s
  std::printf(
      "nodes %d x %d ranks, %.0f heartbeats/s; %d straggler(s) named\n"
      "heartbeat, server work: plain %.2f us, with figures %.2f us "
      "(+%.2f us)\n"
      "figures at %.0f heartbeats/s: %.3f%% of one core\n"
      "page: page.json %.2f ms (%zu bytes), html %.3f ms; one open page "
      "(1 refresh/s): %.3f%% of one core\n"
      "total: %.3f%% of one core\n",
      nodes, nproc, beats_per_s, named, per_beat_plain_us, per_beat_figured_us,
      per_beat_figured_us - per_beat_plain_us, beats_per_s, figures_cpu * 100,
      Median(json_s) * 1e3, json_bytes, Median(html_s) * 1e3, page_cpu * 100,
      (figures_cpu + page_cpu) * 100);
  return 0;
}
