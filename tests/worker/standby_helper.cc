// Calls AwaitActivation, then prints its environment (one NAME=value per
// line, sorted) and "activated"; an error is printed and exits 3. For
// standby_test.cc and tests/launcher/standby_zygote_test.cc: with
// STANDBY_HELPER_THREAD=1 it starts a thread first (a process that may not
// be a zygote); with STANDBY_HELPER_OUT=PATH in the round's environment it
// writes the same lines there, then "forked=1" when a zygote forked it
// ("forked=0" otherwise), "pid=PID" and "comm=NAME" (its name in ps).
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <future>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "common/logging.h"
#include "worker/standby.h"

extern char** environ;

int main() {
  ddprun::common::InitLogging({.name = "standby_helper"});
  const char* thread = std::getenv("STANDBY_HELPER_THREAD");
  if (thread != nullptr && std::string(thread) == "1") {
    // A second thread that only has to exist: it blocks on a promise that is
    // never kept, and goes when the process does. The promise is never
    // destroyed and its future is taken before the thread starts: a static
    // one was destroyed at exit while a thread not yet running could still
    // call get_future on it (std::future_error, seen once in CI).
    auto* never = new std::promise<void>();
    std::thread([future = never->get_future()] { future.wait(); }).detach();
  }
  absl::Status activated = ddprun::worker::AwaitActivation();
  if (!activated.ok()) {
    std::cerr << activated.message() << std::endl;
    return 3;
  }
  std::vector<std::string> vars;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    vars.emplace_back(*e);
  }
  std::sort(vars.begin(), vars.end());
  for (const std::string& v : vars) std::cout << v << "\n";
  std::cout << "activated" << std::endl;
  if (const char* out = std::getenv("STANDBY_HELPER_OUT")) {
    std::ofstream file(out);
    for (const std::string& v : vars) file << v << "\n";
    file << "forked=" << (ddprun::worker::ForkedByZygote() ? 1 : 0) << "\n"
         << "pid=" << getpid() << "\n";
    std::ifstream comm("/proc/self/comm");
    std::string name;
    std::getline(comm, name);
    file << "comm=" << name << "\n";
  }
  return 0;
}
