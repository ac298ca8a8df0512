// ddprun-rendezvous: the rendezvous and store server for ddprun jobs.
#include <cstdio>
#include <string>

#include "common/credentials.h"
#include "common/logging.h"
#include "rendezvous/core/job_token.h"
#include "rendezvous/service/run_server.h"
#include "rendezvous/service/server_flags.h"

namespace {

// `ddprun-rendezvous job-token`: prints the token of one job.
int PrintJobToken(const ddprun::rendezvous::JobTokenCommand& command) {
  absl::StatusOr<std::string> secret =
      ddprun::common::LoadToken(command.token_file);
  if (!secret.ok()) {
    std::fprintf(stderr, "ddprun-rendezvous job-token: %s\n",
                 secret.status().ToString().c_str());
    return 1;
  }
  if (command.run_id.empty()) {
    std::fprintf(stderr,
                 "ddprun-rendezvous job-token: --run-id is empty; give the "
                 "job's run id (the agents' --rdzv-id)\n");
    return 1;
  }
  absl::StatusOr<std::string> token =
      ddprun::rendezvous::JobToken(*secret, command.run_id);
  if (!token.ok()) {
    std::fprintf(stderr, "ddprun-rendezvous job-token: %s\n",
                 token.status().ToString().c_str());
    return 1;
  }
  std::printf("%s\n", token->c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  ddprun::rendezvous::ServerCommandLine command =
      ddprun::rendezvous::ParseServerFlags(argc, argv);
  if (command.exit_code.has_value()) return *command.exit_code;
  if (command.job_token.has_value()) return PrintJobToken(*command.job_token);
  ddprun::common::InitLogging(command.logging);
  return ddprun::rendezvous::RunServerUntilSignal(command.run);
}
