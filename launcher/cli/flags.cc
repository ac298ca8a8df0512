#include "launcher/cli/flags.h"

#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <map>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/random/random.h"
#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/endpoint.h"
#include "common/status_macros.h"
#include "common/version.h"
#include "launcher/cli/nproc.h"
#include "launcher/cli/rdzv_conf.h"

namespace ddprun::launcher {
namespace {

constexpr char kHelpHint[] = "run 'ddprun --help' for the flags";

// Adds --dash-name and --dash_name, read also from PET_DASH_NAME as torchrun
// does. Values stay strings here; they are validated below with messages of
// our own.
CLI::Option* AddString(CLI::App& app, const std::string& names,
                       std::string* target, const std::string& help) {
  std::vector<std::string> spellings = CLI::detail::split_names(names);
  std::string all;
  std::string env;
  for (const std::string& name : spellings) {
    if (!all.empty()) all += ",";
    all += name;
    if (absl::StartsWith(name, "--")) {
      std::string underscored = absl::StrReplaceAll(name, {{"-", "_"}});
      underscored = "--" + underscored.substr(2);
      if (underscored != name) all += "," + underscored;
      if (env.empty())
        env = "PET_" + absl::AsciiStrToUpper(underscored.substr(2));
    }
  }
  return app.add_option(all, *target, help)->envname(env);
}

CLI::Option* AddFlag(CLI::App& app, const std::string& names, bool* target,
                     const std::string& help) {
  std::vector<std::string> spellings = CLI::detail::split_names(names);
  std::string all;
  std::string env;
  for (const std::string& name : spellings) {
    if (!all.empty()) all += ",";
    all += name;
    if (absl::StartsWith(name, "--")) {
      std::string underscored =
          "--" + absl::StrReplaceAll(name.substr(2), {{"-", "_"}});
      if (underscored != name) all += "," + underscored;
      if (env.empty())
        env = "PET_" + absl::AsciiStrToUpper(underscored.substr(2));
    }
  }
  return app.add_flag(all, *target, help)->envname(env);
}

void AddAuthFlags(CLI::App& app, common::Credentials& auth) {
  AddString(app, "--token-file", &auth.token_file,
            "file with the shared token (default: $DDPRUN_TOKEN)");
  AddString(app, "--tls-ca-file", &auth.tls_ca_file,
            "TLS to the rendezvous: the CA of its certificate (PEM)");
  AddString(app, "--tls-cert-file", &auth.tls_cert_file,
            "mutual TLS: this agent's certificate (PEM)");
  AddString(app, "--tls-key-file", &auth.tls_key_file,
            "mutual TLS: this agent's key (PEM)");
  AddString(app, "--tls-server-name", &auth.tls_server_name,
            "the name to check in the server's certificate");
}

absl::Status Usage(absl::string_view message) {
  return absl::InvalidArgumentError(message);
}

// CLI11's messages are good but may span lines; keep the first line and add
// the fix.
absl::Status FromCliError(const CLI::ParseError& e) {
  std::string what = e.what();
  what = what.substr(0, what.find('\n'));
  return Usage(absl::StrFormat("%s; %s", what, kHelpHint));
}

absl::StatusOr<int> ParseInt(absl::string_view flag, absl::string_view text,
                             int min_value, absl::string_view example) {
  int value = 0;
  if (!absl::SimpleAtoi(text, &value) || value < min_value) {
    return Usage(
        absl::StrFormat("%s: '%s' is not an integer >= %d; write e.g. %s %s",
                        flag, text, min_value, flag, example));
  }
  return value;
}

std::string RandomRunId() {
  absl::BitGen gen;
  return absl::StrFormat("standalone-%08x", absl::Uniform<uint32_t>(gen));
}

// The raw strings of the launch flags, before validation.
struct RawLaunchFlags {
  std::string nnodes = "1";
  std::string nproc_per_node = "1";
  std::string rdzv_conf;
  std::string node_rank = "-1";
  std::string max_restarts = "0";
  std::string monitor_interval = "0.1";
  std::string worker_timeout = "0";
  std::string hang_bound;
  std::string hang_factor = "5";
  std::string straggler_policy = "report";
  // torchrun 2.x waits 30 s between SIGTERM and SIGKILL (its
  // shutdown_timeout); checkpoint-on-SIGTERM code is written for that.
  std::string shutdown_grace = "30";
  // torchrun 2.x's name (also TORCH_ELASTIC_SHUTDOWN_TIMEOUT); empty: unset.
  std::string shutdown_timeout;
  std::string max_nproc_per_node = "512";
  std::string signal_exit_code = "torchrun";
  std::string redirects = "0";
  std::string tee = "0";
  std::string local_ranks_filter;
  bool prewarm = false;
  bool no_prewarm = false;
  std::string master_port = "0";
  std::string metrics_port = "-1";
  // torchrun's flags that mean nothing here, by name: their values.
  std::map<std::string, std::string> ignored;
  std::map<std::string, bool> ignored_switches;
};

// torchrun (1.13 to 2.x) flags without a meaning for ddprun: accepted so that
// a torchrun line runs unchanged, and logged once. None changes what the
// workers see. Worker processes are always fork+exec'd (--start-method); a
// Python program always runs as a path (--run-path); logs go where
// --log-dir/--redirects/--tee say (--logs-specs); there is no event log
// (--event-log-handler); ddprun always forwards SIGTERM, SIGINT, SIGHUP,
// SIGQUIT, SIGUSR1 and SIGUSR2 (--signals-to-handle). --numa-binding is
// refused in ParseLaunchValues: it would change where workers run.
constexpr const char* kIgnoredValueFlags[] = {"--start-method",
                                              "--logs-specs",
                                              "--event-log-handler",
                                              "--numa-binding",
                                              "--signals-to-handle",
                                              "--duplicate-stdout-filters",
                                              "--duplicate-stderr-filters"};
constexpr const char* kIgnoredSwitches[] = {"--run-path"};

// The launch flags, as torchrun spells them, into `o` and `raw`.
void AddLaunchFlags(CLI::App& app, LaunchOptions& o, RawLaunchFlags& raw) {
  AddString(app, "--nnodes", &raw.nnodes, "N or MIN:MAX nodes");
  AddString(app, "--nproc-per-node", &raw.nproc_per_node,
            "workers on this node: N, cpu (one per CPU), gpu (one per GPU) "
            "or auto (one per GPU, else one per CPU)");
  AddString(app, "--rdzv-endpoint", &o.rdzv_endpoint,
            "HOST:PORT of the rendezvous: ddprun-rendezvous, or served by the "
            "agent on HOST when nothing listens there yet (port 0: one node)");
  AddString(app, "--rdzv-id", &o.rdzv_id, "the job's run id");
  AddString(app, "--rdzv-backend", &o.rdzv_backend,
            "accepted for torchrun compatibility (c10d, ddprun)");
  AddString(app, "--rdzv-conf", &raw.rdzv_conf,
            "key=value,...: last_call_timeout, join_timeout, close_timeout, "
            "read_timeout, heartbeat_interval, heartbeat_timeout (seconds)");
  AddFlag(app, "--standalone", &o.standalone,
          "single node: an in-process rendezvous on a loopback port");
  AddString(app, "--node-rank", &raw.node_rank, "this node's rank (optional)");
  AddString(app, "--max-restarts", &raw.max_restarts,
            "restarts of the job's worker groups before it fails");
  AddString(app, "--monitor-interval", &raw.monitor_interval,
            "seconds between worker checks");
  AddString(app, "--worker-timeout", &raw.worker_timeout,
            "seconds without progress, in any phase, after which a reporting "
            "worker is hung (0: each phase's bound adapts: --hang-bound)");
  AddString(app, "--hang-bound", &raw.hang_bound,
            "PHASE=SECONDS,...: fixed hang bounds by phase (start, join, sync, "
            "first-step, step, checkpoint, stop, eval, stopped, blocked, "
            "spin (CPU seconds); 0: "
            "never hung there); unset phases adapt: --hang-factor x the "
            "longest seen, at least a floor (docs/ARCHITECTURE.md, 'Hangs')");
  AddString(app, "--straggler-policy", &raw.straggler_policy,
            "report: a rank the server names a straggler is only reported; "
            "replace: it is treated as failed and killed, so that in-place "
            "recovery replaces it (a restart for programs without it)");
  AddString(app, "--hang-factor", &raw.hang_factor,
            "adaptive hang bounds are this multiple of a phase's longest "
            "observed duration");
  AddString(app, "--shutdown-grace", &raw.shutdown_grace,
            "seconds between SIGTERM and SIGKILL when stopping workers");
  AddString(app, "--shutdown-timeout", &raw.shutdown_timeout,
            "torchrun 2.x's name for --shutdown-grace (also "
            "$TORCH_ELASTIC_SHUTDOWN_TIMEOUT)");
  AddString(app, "--max-nproc-per-node", &raw.max_nproc_per_node,
            "refuse a --nproc-per-node above this (a typo would fork that "
            "many workers)");
  AddString(app, "--signal-exit-code", &raw.signal_exit_code,
            "exit status after a stop signal: torchrun (1, as torchrun) or "
            "shell (128+signal, e.g. 143 for SIGTERM: a service manager's "
            "clean stop)");
  AddFlag(app, "--virtual-local-rank", &o.virtual_local_rank,
          "each worker sees LOCAL_RANK=0 and only its own GPU "
          "(CUDA_VISIBLE_DEVICES), as torchrun 2.x");
  AddString(app, "--log-dir", &o.log_dir,
            "DIR/<run_id>_<random>/attempt_<n>/<local_rank>/{stdout.log,"
            "stderr.log,error.json}, torchrun's layout");
  AddString(app, "-r,--redirects", &raw.redirects,
            "streams to files: 0-3 or LOCAL_RANK:0-3,...");
  AddString(app, "-t,--tee", &raw.tee,
            "streams to files and console: 0-3 or LOCAL_RANK:0-3,...");
  AddString(app, "--local-ranks-filter", &raw.local_ranks_filter,
            "local ranks whose console output is shown, e.g. 0,1");
  AddString(app, "--role", &o.role, "ROLE_NAME of the workers");
  AddFlag(app, "--no-python", &o.no_python,
          "run the program directly, not under python");
  AddFlag(app, "-m,--module", &o.run_module, "run the program as python -m");
  AddFlag(app, "--prewarm", &raw.prewarm,
          "start the next round's workers ahead so that restarts are quick, "
          "also for Python programs (up to 'import torch'); a program that "
          "is not Python must call ddprun::worker::AwaitActivation() "
          "(libddp, e.g. ddprun-mnist) before it reads its environment. "
          "Default: on for programs that call it, forked from a worker there");
  AddFlag(app, "--no-prewarm", &raw.no_prewarm,
          "never start workers ahead: each restart starts its processes");
  AddString(app, "--master-addr", &o.master_addr,
            "static rendezvous (without --rdzv-endpoint): node rank 0 serves "
            "it here");
  AddString(app, "--master-port", &raw.master_port,
            "static rendezvous: its port (default 29500); on one node "
            "without --master-addr and --rdzv-endpoint: the workers' "
            "MASTER_PORT (default: a free port)");
  AddString(app, "--local-addr", &o.local_addr,
            "this node's address for its peers");
  AddString(app, "--log-level", &o.log_level,
            "trace, debug, info, warn, error, off");
  AddString(app, "--metrics-port", &raw.metrics_port,
            "serve Prometheus /metrics of this node's workers on this port "
            "(0: pick one; -1: off)");
  AddString(app, "--metrics-host", &o.metrics_host,
            "address /metrics listens on (0.0.0.0: every interface)");
  for (const char* flag : kIgnoredValueFlags) {
    AddString(app, flag, &raw.ignored[flag], "accepted; ignored (torchrun's)");
  }
  for (const char* flag : kIgnoredSwitches) {
    AddFlag(app, flag, &raw.ignored_switches[flag],
            "accepted; ignored (torchrun's)");
  }
  AddAuthFlags(app, o.auth);
  AddString(app, "--host-tls-cert-file", &o.host_tls.cert_file,
            "when this agent serves the rendezvous (c10d's is_host, static "
            "node rank 0): serve TLS with this PEM certificate chain, as "
            "ddprun-rendezvous --tls-cert-file; agents and workers check it "
            "with --tls-ca-file");
  AddString(app, "--host-tls-key-file", &o.host_tls.key_file,
            "the PEM private key of --host-tls-cert-file");
  AddString(app, "--host-tls-client-ca-file", &o.host_tls.client_ca_file,
            "with --host-tls-cert-file: mutual TLS, as ddprun-rendezvous "
            "--tls-client-ca-file; every caller, this agent included, must "
            "present a certificate signed by this CA (--tls-cert-file, "
            "--tls-key-file)");
}

// What follows the flags: the program and its arguments, untouched.
absl::Status TakeProgram(std::vector<std::string> rest, LaunchOptions& o) {
  if (!rest.empty() && rest.front() == "--") rest.erase(rest.begin());
  if (!rest.empty() && absl::StartsWith(rest.front(), "-") &&
      rest.front() != "-") {
    return Usage(
        absl::StrFormat("unknown flag '%s'; %s", rest.front(), kHelpHint));
  }
  if (rest.empty()) {
    return Usage(absl::StrFormat(
        "no program to run; write ddprun [FLAGS] PROGRAM [ARGS...], e.g. "
        "ddprun --standalone --nproc-per-node 2 ./train; %s",
        kHelpHint));
  }
  o.program = std::move(rest);

  return absl::OkStatus();
}

// --hang-bound PHASE=SECONDS,... and --hang-factor into `bounds`; a
// --worker-timeout (non-zero) fixes every phase but the start, as it did
// before phases existed.
absl::Status ParseHangBounds(const std::string& text,
                             const std::string& factor_text,
                             absl::Duration worker_timeout,
                             PhaseBoundsOptions& bounds) {
  double factor = 0;
  if (!absl::SimpleAtod(factor_text, &factor) || !std::isfinite(factor) ||
      factor < 1) {
    return Usage(absl::StrFormat(
        "--hang-factor: '%s' is not a number >= 1; write e.g. --hang-factor 5",
        factor_text));
  }
  bounds.factor = factor;
  if (worker_timeout > absl::ZeroDuration()) {
    for (int i = 0; i < common::kNumPhases; ++i) {
      if (static_cast<common::Phase>(i) != common::Phase::kStart) {
        bounds.fixed[i] = worker_timeout;
      }
    }
    bounds.blocked_fixed = worker_timeout;
    // A spin's bound is CPU time, which a spin on several threads uses
    // faster than the wall time the user gave: the step's bound finds it.
    bounds.spin_fixed = absl::InfiniteDuration();
  }
  for (absl::string_view item : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    std::pair<std::string, std::string> kv =
        absl::StrSplit(item, absl::MaxSplits('=', 1));
    const std::string name(absl::StripAsciiWhitespace(kv.first));
    absl::StatusOr<absl::Duration> value =
        ParseSeconds(absl::StrCat("--hang-bound ", name), kv.second);
    if (!value.ok()) return value.status();
    const absl::Duration bound =
        *value == absl::ZeroDuration() ? absl::InfiniteDuration() : *value;
    if (name == "stopped") {
      bounds.stopped = bound;
      continue;
    }
    if (name == "blocked") {
      bounds.blocked_fixed = bound;
      continue;
    }
    if (name == "spin") {
      bounds.spin_fixed = bound;
      continue;
    }
    std::optional<common::Phase> phase = common::ParsePhase(name);
    if (!phase.has_value()) {
      return Usage(absl::StrFormat(
          "--hang-bound: unknown phase '%s'; the phases are start, join, "
          "sync, first-step, step, checkpoint, stop, eval, stopped, "
          "blocked and spin, e.g. "
          "--hang-bound step=2,checkpoint=600",
          name));
    }
    bounds.fixed[static_cast<int>(*phase)] = bound;
  }
  return absl::OkStatus();
}

// The flags given as strings, parsed and range-checked.
absl::Status ParseLaunchValues(const RawLaunchFlags& raw, LaunchOptions& o) {
  if (raw.prewarm && raw.no_prewarm) {
    return Usage("--prewarm and --no-prewarm contradict; drop one of them");
  }
  if (raw.prewarm) o.prewarm = LaunchOptions::Prewarm::kOn;
  if (raw.no_prewarm) o.prewarm = LaunchOptions::Prewarm::kOff;
  if (absl::Status s = ParseNnodes(raw.nnodes, o.min_nodes, o.max_nodes);
      !s.ok()) {
    return s;
  }
  absl::StatusOr<int> nproc =
      ResolveNprocPerNode(raw.nproc_per_node, ProbeThisHost());
  if (!nproc.ok()) return nproc.status();
  o.nproc_per_node = *nproc;
  DDPRUN_ASSIGN_OR_RETURN(
      int max_nproc,
      ParseInt("--max-nproc-per-node", raw.max_nproc_per_node, 1, "1024"));
  if (o.nproc_per_node > max_nproc) {
    return Usage(absl::StrFormat(
        "--nproc-per-node %s: %d workers on one node is over the bound of "
        "%d; write a smaller --nproc-per-node, or raise the bound with "
        "--max-nproc-per-node %d if you mean it",
        raw.nproc_per_node, o.nproc_per_node, max_nproc, o.nproc_per_node));
  }
  // torchrun 2.x refuses a local rank past the agent's CUDA_VISIBLE_DEVICES
  // when it starts the workers; here before anything starts.
  const char* visible = getenv("CUDA_VISIBLE_DEVICES");
  if (o.virtual_local_rank && visible != nullptr) {
    std::vector<std::string> devices = absl::StrSplit(visible, ',');
    if (static_cast<int>(devices.size()) < o.nproc_per_node) {
      return Usage(absl::StrFormat(
          "--virtual-local-rank gives each of the %d workers one GPU of "
          "CUDA_VISIBLE_DEVICES=%s, which lists %d; list one per worker or "
          "write --nproc-per-node %d",
          o.nproc_per_node, visible, devices.size(), devices.size()));
    }
  }
  if (absl::Status s = ParseRdzvConf(raw.rdzv_conf, o.rdzv_conf); !s.ok()) {
    return s;
  }
  DDPRUN_ASSIGN_OR_RETURN(o.node_rank,
                          ParseInt("--node-rank", raw.node_rank, -1, "0"));
  DDPRUN_ASSIGN_OR_RETURN(o.max_restarts,
                          ParseInt("--max-restarts", raw.max_restarts, 0, "3"));
  DDPRUN_ASSIGN_OR_RETURN(
      o.master_port, ParseInt("--master-port", raw.master_port, 0, "29500"));
  absl::StatusOr<int> metrics_port =
      ParseInt("--metrics-port", raw.metrics_port, -1, "9401");
  if (!metrics_port.ok()) return metrics_port.status();
  if (*metrics_port > 65535) {
    return Usage(absl::StrFormat(
        "--metrics-port: %d is not a port; write e.g. --metrics-port 9401",
        *metrics_port));
  }
  o.metrics_port = *metrics_port;
  struct {
    const char* flag;
    const std::string& text;
    absl::Duration& target;
  } durations[] = {
      {"--monitor-interval", raw.monitor_interval, o.monitor_interval},
      {"--worker-timeout", raw.worker_timeout, o.worker_timeout},
      {"--shutdown-grace", raw.shutdown_grace, o.shutdown_grace},
  };
  for (auto& d : durations) {
    absl::StatusOr<absl::Duration> value = ParseSeconds(d.flag, d.text);
    if (!value.ok()) return value.status();
    d.target = *value;
  }
  if (raw.signal_exit_code != "torchrun" && raw.signal_exit_code != "shell") {
    return Usage(absl::StrFormat(
        "--signal-exit-code: '%s' is not torchrun or shell; write e.g. "
        "--signal-exit-code shell",
        raw.signal_exit_code));
  }
  o.signal_exit_code_shell = raw.signal_exit_code == "shell";
  if (raw.straggler_policy != "report" && raw.straggler_policy != "replace") {
    return Usage(absl::StrFormat(
        "--straggler-policy: '%s' is not report or replace; write e.g. "
        "--straggler-policy replace",
        raw.straggler_policy));
  }
  o.replace_stragglers = raw.straggler_policy == "replace";
  if (absl::Status s = ParseHangBounds(raw.hang_bound, raw.hang_factor,
                                       o.worker_timeout, o.hang_bounds);
      !s.ok()) {
    return s;
  }
  // torchrun 2.x: --shutdown-timeout, else TORCH_ELASTIC_SHUTDOWN_TIMEOUT.
  std::string shutdown_timeout = raw.shutdown_timeout;
  std::string shutdown_flag = "--shutdown-timeout";
  if (shutdown_timeout.empty()) {
    const char* env = getenv("TORCH_ELASTIC_SHUTDOWN_TIMEOUT");
    if (env != nullptr && *env != '\0') {
      shutdown_timeout = env;
      shutdown_flag = "TORCH_ELASTIC_SHUTDOWN_TIMEOUT";
    }
  }
  if (!shutdown_timeout.empty()) {
    DDPRUN_ASSIGN_OR_RETURN(o.shutdown_grace,
                            ParseSeconds(shutdown_flag, shutdown_timeout));
  }
  // torchrun 2.x's file timer hands workers TORCHELASTIC_TIMER_FILE for
  // torch.distributed.elastic.timer's expires(); ddprun serves none, so such
  // workers would fail at their first expires(): refused, with what to use.
  if (const char* timer = getenv("TORCHELASTIC_ENABLE_FILE_TIMER");
      timer != nullptr && std::string(timer) == "1") {
    return Usage(
        "TORCHELASTIC_ENABLE_FILE_TIMER=1: ddprun serves no file timer "
        "(torch.distributed.elastic.timer); unset it, and bound hung workers "
        "with --worker-timeout or --hang-bound instead");
  }
  if (o.monitor_interval <= absl::ZeroDuration()) {
    return Usage(
        "--monitor-interval must be positive; write e.g. "
        "--monitor-interval 0.1");
  }
  DDPRUN_ASSIGN_OR_RETURN(o.redirects,
                          ParsePerRankStreams("--redirects", raw.redirects));
  DDPRUN_ASSIGN_OR_RETURN(o.tee, ParsePerRankStreams("--tee", raw.tee));
  DDPRUN_ASSIGN_OR_RETURN(
      o.local_ranks_filter,
      ParseIntList("--local-ranks-filter", raw.local_ranks_filter));
  for (const auto& [flag, value] : raw.ignored) {
    if (value.empty()) continue;
    if (flag == "--numa-binding") {
      return Usage(absl::StrFormat(
          "--numa-binding %s: ddprun does not bind workers to NUMA nodes; "
          "drop the flag, or run the program under numactl (e.g. "
          "--no-python numactl --cpunodebind=0 python3 train.py)",
          value));
    }
    o.ignored_flags.push_back(flag + " " + value);
  }
  for (const auto& [flag, on] : raw.ignored_switches) {
    if (on) o.ignored_flags.push_back(flag);
  }
  return absl::OkStatus();
}

// A run id names a folder under --log-dir and the job on the server: only
// letters, digits, '.', '_' and '-', starting with a letter or digit, so
// that it can be no path ("../x") and no name the shell or a file system
// treats specially.
constexpr size_t kMaxRunIdLength = 128;

absl::Status CheckRunId(const std::string& id) {
  bool ok = !id.empty() && id.size() <= kMaxRunIdLength &&
            absl::ascii_isalnum(static_cast<unsigned char>(id[0]));
  for (char c : id) {
    ok = ok && (absl::ascii_isalnum(static_cast<unsigned char>(c)) ||
                c == '.' || c == '_' || c == '-');
  }
  if (ok) return absl::OkStatus();
  return Usage(absl::StrFormat(
      "--rdzv-id: '%s' is not a run id: use 1 to %d letters, digits, '.', "
      "'_' or '-', starting with a letter or digit; write e.g. --rdzv-id "
      "job-42",
      absl::CHexEscape(id.substr(0, 2 * kMaxRunIdLength)), kMaxRunIdLength));
}

// How the rendezvous is found, as torchrun decides it: --standalone; else
// --rdzv-endpoint (served by the agent on its host when free, c10d's
// is_host); else static from --master-addr/--master-port (node rank 0
// serves); else, for one node, standalone.
absl::Status DecideRendezvous(LaunchOptions& o) {
  using Mode = LaunchOptions::RdzvMode;
  bool is_static = o.rdzv_endpoint.empty() &&
                   (o.rdzv_backend == "static" || !o.master_addr.empty());
  if (!o.standalone && o.rdzv_endpoint.empty() && !is_static &&
      o.max_nodes == 1) {
    o.standalone = true;  // torchrun's plain single-node line
  }
  if (o.standalone) {
    o.rdzv_mode = Mode::kStandalone;
    o.min_nodes = 1;
    o.max_nodes = 1;
    o.rdzv_endpoint.clear();
    if (o.rdzv_id == "none") o.rdzv_id = RandomRunId();
    return absl::OkStatus();
  }
  if (is_static) {
    if (o.min_nodes != o.max_nodes) {
      return Usage(absl::StrFormat(
          "--nnodes %d:%d needs an elastic rendezvous; a static one "
          "(--master-addr) has a fixed size: write --nnodes %d, or give "
          "--rdzv-endpoint HOST:PORT",
          o.min_nodes, o.max_nodes, o.max_nodes));
    }
    if (o.node_rank < 0) {
      if (o.max_nodes > 1) {
        return Usage(absl::StrFormat(
            "static rendezvous (--master-addr %s) of %d nodes needs "
            "--node-rank (0 on the node that serves it); write e.g. "
            "--node-rank 0",
            o.master_addr, o.max_nodes));
      }
      o.node_rank = 0;
    }
    if (o.node_rank >= o.max_nodes) {
      return Usage(absl::StrFormat(
          "--node-rank %d is not below --nnodes %d; write --node-rank 0..%d",
          o.node_rank, o.max_nodes, o.max_nodes - 1));
    }
    std::string host = o.master_addr.empty() ? "127.0.0.1" : o.master_addr;
    int port = o.master_port > 0 ? o.master_port : 29500;
    o.rdzv_endpoint = common::Endpoint{host, port}.ToString();
    o.rdzv_mode = o.node_rank == 0 ? Mode::kHost : Mode::kConnect;
    return absl::OkStatus();
  }
  if (o.rdzv_endpoint.empty()) {
    return Usage(absl::StrFormat(
        "no rendezvous for --nnodes %d:%d: give --rdzv-endpoint HOST:PORT (a "
        "ddprun-rendezvous server, or served by the agent on HOST), or "
        "--master-addr A --master-port P --node-rank R (static)",
        o.min_nodes, o.max_nodes));
  }
  absl::StatusOr<common::Endpoint> endpoint =
      common::ParseEndpoint(o.rdzv_endpoint, /*default_port=*/29400);
  if (!endpoint.ok()) {
    return Usage(
        absl::StrCat("--rdzv-endpoint: ", endpoint.status().message()));
  }
  o.rdzv_endpoint = endpoint->ToString();
  if (endpoint->port == 0) {
    if (o.max_nodes > 1) {
      return Usage(absl::StrFormat(
          "--rdzv-endpoint %s: port 0 works for one node only (the others "
          "could not find the port); write a port, e.g. %s:29400",
          o.rdzv_endpoint, endpoint->host));
    }
    o.rdzv_mode = Mode::kHost;
  } else if (o.rdzv_conf.is_host.has_value()) {
    o.rdzv_mode = *o.rdzv_conf.is_host ? Mode::kHost : Mode::kConnect;
  } else {
    o.rdzv_mode = Mode::kHostOrConnect;
  }
  return absl::OkStatus();
}

// The TLS of a rendezvous this agent serves. The certificate and key come
// together; whoever serves TLS is checked with --tls-ca-file, this agent
// (its own client) and its workers included. Mutual TLS (a client CA)
// needs the served certificate, and a client certificate of this agent's
// own, since it is the first caller of what it serves. A TLS rendezvous is
// never replaced by a plaintext one served here: an agent that must serve and
// has
// --tls-ca-file but no certificate is refused.
absl::Status CheckHostTls(const LaunchOptions& o) {
  using Mode = LaunchOptions::RdzvMode;
  const common::ServerTlsOptions& tls = o.host_tls;
  if (tls.cert_file.empty() != tls.key_file.empty()) {
    return Usage(absl::StrFormat(
        "%s without %s: serving TLS needs the certificate and its key; give "
        "both --host-tls-cert-file and --host-tls-key-file",
        tls.cert_file.empty() ? "--host-tls-key-file" : "--host-tls-cert-file",
        tls.cert_file.empty() ? "--host-tls-cert-file"
                              : "--host-tls-key-file"));
  }
  if (!tls.client_ca_file.empty() && tls.cert_file.empty()) {
    return Usage(
        "--host-tls-client-ca-file without --host-tls-cert-file: mutual TLS "
        "is TLS that also checks its callers; give --host-tls-cert-file and "
        "--host-tls-key-file (the served certificate) too");
  }
  if (!tls.client_ca_file.empty() &&
      (o.auth.tls_cert_file.empty() || o.auth.tls_key_file.empty())) {
    return Usage(
        "--host-tls-client-ca-file without --tls-cert-file and "
        "--tls-key-file: this agent talks to the rendezvous it serves and "
        "must present a client certificate signed by that CA too; give "
        "--tls-cert-file and --tls-key-file (the same for every agent is "
        "fine)");
  }
  if (!tls.cert_file.empty() && o.auth.tls_ca_file.empty()) {
    return Usage(
        "--host-tls-cert-file without --tls-ca-file: every agent, this one "
        "included, and every worker checks the served certificate; give "
        "--tls-ca-file with the CA that signed it");
  }
  if (o.rdzv_mode == Mode::kHost && !o.auth.tls_ca_file.empty() &&
      tls.cert_file.empty()) {
    return Usage(absl::StrFormat(
        "--tls-ca-file, but this agent serves the rendezvous at %s (static "
        "node rank 0, or --rdzv-conf is_host=1) with no certificate: give "
        "--host-tls-cert-file and --host-tls-key-file (what "
        "ddprun-rendezvous takes as --tls-cert-file and --tls-key-file), or "
        "run ddprun-rendezvous there with them and drop is_host=1",
        o.rdzv_endpoint));
  }
  return absl::OkStatus();
}

// Values that are fine alone but not together, and what --standalone
// implies.
absl::Status CheckLaunchOptions(LaunchOptions& o) {
  DDPRUN_RETURN_IF_ERROR(CheckRunId(o.rdzv_id));
  if (o.rdzv_backend != "c10d" && o.rdzv_backend != "ddprun" &&
      o.rdzv_backend != "static" && o.rdzv_backend != "etcd" &&
      o.rdzv_backend != "etcd-v2") {
    return Usage(absl::StrFormat(
        "--rdzv-backend: '%s' is unknown; write --rdzv-backend c10d (ddprun "
        "always uses its own rendezvous service)",
        o.rdzv_backend));
  }
  if (o.no_python && o.run_module) {
    return Usage(
        "--no-python and --module cannot be used together; drop one of them");
  }
  static constexpr const char* kLevels[] = {"trace", "debug",    "info", "warn",
                                            "error", "critical", "off"};
  if (std::find(std::begin(kLevels), std::end(kLevels), o.log_level) ==
      std::end(kLevels)) {
    return Usage(absl::StrFormat(
        "--log-level: '%s' is unknown; write one of trace, debug, info, warn, "
        "error, off",
        o.log_level));
  }
  if (o.prewarm == LaunchOptions::Prewarm::kOn) {
    if (!o.PlainConsole()) {
      return Usage(
          "--prewarm cannot be combined with --redirects, --tee or "
          "--local-ranks-filter yet; drop one of them");
    }
  }
  DDPRUN_RETURN_IF_ERROR(DecideRendezvous(o));
  return CheckHostTls(o);
}

absl::StatusOr<CommandLine> ParseStatus(int argc, const char* const* argv) {
  CommandLine command;
  command.kind = CommandLine::Kind::kStatus;
  StatusOptions& o = command.status;
  CLI::App app("ddprun status: what the rendezvous server knows about jobs",
               "ddprun status");
  std::string timeout = "5";
  AddString(app, "--rdzv-endpoint", &o.rdzv_endpoint,
            "HOST:PORT of ddprun-rendezvous")
      ->required();
  AddString(app, "--rdzv-id", &o.rdzv_id, "only this job (default: all)");
  AddFlag(app, "--json", &o.json, "print JSON instead of a table");
  AddFlag(app, "--events", &o.events,
          "print each job's events (rounds, failures, restarts, stragglers); "
          "with --json as JSON lines");
  AddAuthFlags(app, o.auth);
  AddString(app, "--timeout", &timeout, "seconds to wait for the answer");
  try {
    app.parse(argc - 1, argv + 1);
  } catch (const CLI::CallForHelp&) {
    command.kind = CommandLine::Kind::kHelp;
    command.help = app.help();
    return command;
  } catch (const CLI::ParseError& e) {
    std::string what = e.what();
    return Usage(
        absl::StrFormat("status: %s; run 'ddprun status --help' for the flags",
                        what.substr(0, what.find('\n'))));
  }
  DDPRUN_ASSIGN_OR_RETURN(o.timeout, ParseSeconds("--timeout", timeout));
  return command;
}

}  // namespace

absl::StatusOr<CommandLine> ParseCommandLine(int argc,
                                             const char* const* argv) {
  if (argc >= 2 && std::string(argv[1]) == "status") {
    return ParseStatus(argc, argv);
  }
  CommandLine command;
  LaunchOptions& o = command.launch;
  RawLaunchFlags raw;
  CLI::App app(
      "ddprun: run a data-parallel job on this node (torchrun's flags)",
      "ddprun");
  app.prefix_command();
  app.footer(
      "Usage: ddprun [FLAGS] PROGRAM [ARGS...]; see also: ddprun status "
      "--help");
  AddLaunchFlags(app, o, raw);
  bool version = false;
  app.add_flag("--version", version, "print ddprun's version and exit");
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    command.kind = CommandLine::Kind::kHelp;
    command.help = app.help();
    return command;
  } catch (const CLI::ParseError& e) {
    return FromCliError(e);
  }

  if (version) {
    command.kind = CommandLine::Kind::kHelp;
    command.help = absl::StrCat("ddprun ", common::Version(), "\n");
    return command;
  }
  DDPRUN_RETURN_IF_ERROR(TakeProgram(app.remaining(), o));
  DDPRUN_RETURN_IF_ERROR(ParseLaunchValues(raw, o));
  DDPRUN_RETURN_IF_ERROR(CheckLaunchOptions(o));
  return command;
}

}  // namespace ddprun::launcher
