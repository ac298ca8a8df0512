// ddprun-relay: batches agents' Joins and heartbeats towards a rendezvous
// server and passes every other call through.
#include "common/logging.h"
#include "relay/relay_flags.h"

int main(int argc, char** argv) {
  ddprun::relay::RelayCommandLine command =
      ddprun::relay::ParseRelayFlags(argc, argv);
  if (command.exit_code.has_value()) return *command.exit_code;
  ddprun::common::InitLogging(command.logging);
  return ddprun::relay::RunRelayUntilSignal(command.run);
}
