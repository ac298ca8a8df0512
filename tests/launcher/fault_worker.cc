// A worker for the launcher's tests that misbehaves on command: exits N,
// dies by a signal, hangs, ignores SIGTERM, reports progress then stalls,
// spawns a grandchild, writes its environment and pid to files, writes a
// torchrun-style error file. Each failure can be limited to one rank and to
// the first restarts, so that tests can fail a job once and see it recover.
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"

extern char** environ;

namespace {

struct Options {
  int exit_code = 0;
  int signal = 0;
  double sleep_s = 0;
  bool hang = false;
  bool ignore_sigterm = false;
  int progress = 0;  // records to write, then hang
  std::string error_message;
  std::string out_dir;  // rank_<R>.pid, rank_<R>.env.json, grandchild pids
  bool spawn_grandchild = false;
  int fail_rank = -1;                // -1: every rank fails
  int fail_below_restart = 1 << 30;  // fail only while restart count < this
  std::string print;           // a line to print on stdout (for log tests)
  int hang_below_restart = 0;  // workers that do not fail hang while
                               // restart count < this
  int hang_if_world_size = 0;  // every worker hangs while WORLD_SIZE is this
};

int EnvInt(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v != nullptr ? std::atoi(v) : fallback;
}

std::string JsonEscape(const std::string& s) {
  return absl::StrReplaceAll(
      s, {{"\\", "\\\\"}, {"\"", "\\\""}, {"\n", "\\n"}, {"\t", "\\t"}});
}

void WriteFile(const std::string& path, const std::string& content) {
  std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp);
    out << content;
  }
  std::rename(tmp.c_str(), path.c_str());
}

void SleepForever() {
  while (true) pause();
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app("fault_worker");
  app.add_option("--exit", o.exit_code);
  app.add_option("--signal", o.signal);
  app.add_option("--sleep", o.sleep_s);
  app.add_flag("--hang", o.hang);
  app.add_flag("--ignore-sigterm", o.ignore_sigterm);
  app.add_option("--progress", o.progress);
  app.add_option("--error-message", o.error_message);
  app.add_option("--out-dir", o.out_dir);
  app.add_flag("--spawn-grandchild", o.spawn_grandchild);
  app.add_option("--fail-rank", o.fail_rank);
  app.add_option("--fail-below-restart", o.fail_below_restart);
  app.add_option("--print", o.print);
  app.add_option("--hang-below-restart", o.hang_below_restart);
  app.add_option("--hang-if-world-size", o.hang_if_world_size);
  CLI11_PARSE(app, argc, argv);

  int rank = EnvInt("RANK", 0);
  int restart = EnvInt("TORCHELASTIC_RESTART_COUNT", 0);
  std::string prefix = absl::StrCat(o.out_dir, "/rank_", rank);
  if (!o.out_dir.empty()) {
    std::string json = "{";
    for (char** e = environ; *e != nullptr; ++e) {
      std::string entry(*e);
      size_t eq = entry.find('=');
      if (eq == std::string::npos) continue;
      absl::StrAppend(&json, json.size() > 1 ? "," : "", "\"",
                      JsonEscape(entry.substr(0, eq)), "\":\"",
                      JsonEscape(entry.substr(eq + 1)), "\"");
    }
    json += "}";
    WriteFile(prefix + ".env.json", json);
  }
  if (o.ignore_sigterm) {
    // Every polite stop signal the agent may forward; only SIGKILL works.
    for (int sig : {SIGTERM, SIGINT, SIGHUP, SIGQUIT}) signal(sig, SIG_IGN);
  }
  if (o.spawn_grandchild) {
    pid_t child = fork();
    if (child == 0) SleepForever();
    if (!o.out_dir.empty()) {
      WriteFile(prefix + ".grandchild.pid", std::to_string(child));
    }
  }
  if (!o.print.empty()) {
    std::printf("%s\n", o.print.c_str());
    std::fflush(stdout);
  }
  // The pid file comes after everything above, so that a test that sees it
  // knows the worker is set up.
  if (!o.out_dir.empty()) {
    WriteFile(prefix + ".pid", std::to_string(getpid()));
  }
  // A worker fails only when told how, and only as --fail-rank and
  // --fail-below-restart allow.
  bool told_to_fail = o.exit_code != 0 || o.signal != 0 || o.hang ||
                      o.progress > 0 || !o.error_message.empty();
  bool fails = told_to_fail && (o.fail_rank < 0 || o.fail_rank == rank) &&
               restart < o.fail_below_restart;
  if (o.progress > 0) {
    int fd = EnvInt("DDPRUN_PROGRESS_FD", -1);
    for (int i = 0; i < o.progress && fd >= 0; ++i) {
      std::string record = absl::StrCat("step ", i, "\n");
      ssize_t ignored = write(fd, record.data(), record.size());
      (void)ignored;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    if (fails) SleepForever();
  }
  if (o.hang_if_world_size > 0 &&
      EnvInt("WORLD_SIZE", 0) == o.hang_if_world_size) {
    SleepForever();
  }
  if (!fails && restart < o.hang_below_restart) SleepForever();
  if (fails) {
    if (!o.error_message.empty()) {
      const char* path = std::getenv("TORCHELASTIC_ERROR_FILE");
      if (path != nullptr) {
        WriteFile(path, absl::StrCat("{\"message\": {\"message\": \"",
                                     JsonEscape(o.error_message),
                                     "\", \"extraInfo\": {\"timestamp\": \"",
                                     time(nullptr), "\"}}}"));
      }
    }
    if (o.hang) SleepForever();
    if (o.sleep_s > 0) {
      std::this_thread::sleep_for(
          std::chrono::milliseconds(static_cast<int>(o.sleep_s * 1000)));
    }
    if (o.signal != 0) raise(o.signal);
    return o.exit_code;
  }
  return 0;
}
