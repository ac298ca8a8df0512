// Calls AwaitActivation, then prints its environment (one NAME=value per
// line, sorted) and "activated"; an error is printed and exits 3. For
// standby_test.cc.
#include <algorithm>
#include <iostream>
#include <string>
#include <vector>

#include "common/logging.h"
#include "worker/standby.h"

extern char** environ;

int main() {
  ddprun::common::InitLogging({.name = "standby_helper"});
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
  return 0;
}
