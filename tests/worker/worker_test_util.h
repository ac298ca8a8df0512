#pragma once

#include <map>
#include <string>

namespace ddprun::worker::testing {

// The environment ddprun gives a worker, for a free-standing store scope.
inline std::map<std::string, std::string> WorkerEnvFor(
    int rank, int world_size, const std::string& endpoint,
    const std::string& run_id) {
  return {{"RANK", std::to_string(rank)},
          {"LOCAL_RANK", std::to_string(rank)},
          {"WORLD_SIZE", std::to_string(world_size)},
          {"LOCAL_WORLD_SIZE", std::to_string(world_size)},
          {"DDPRUN_STORE_ENDPOINT", endpoint},
          {"DDPRUN_STORE_RUN_ID", run_id},
          {"DDPRUN_ROUND", "0"},
          {"DDPRUN_LOCAL_ADDR", "127.0.0.1"},
          {"OMP_NUM_THREADS", "1"}};
}

}  // namespace ddprun::worker::testing
