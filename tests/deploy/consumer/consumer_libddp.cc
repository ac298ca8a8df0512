// Reads the worker environment through the installed libddp, as a user's
// LibTorch program does, and prints what it found.
#include <iostream>

#include "worker/worker_env.h"

int main() {
  auto env = ddprun::worker::ReadWorkerEnv();
  if (!env.ok()) {
    std::cerr << env.status() << "\n";
    return 1;
  }
  std::cout << "consumer rank " << env->rank << " of " << env->world_size
            << "\n";
  return 0;
}
