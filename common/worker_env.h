#pragma once

// The environment contract between the agent (launcher/) and its workers
// (worker/ and any other program). The torchrun names come first, so that an
// unmodified torch.distributed script runs under ddprun as under torchrun;
// the DDPRUN_ names carry what only ddprun has.
namespace ddprun::common::env {

// torchrun's names.
inline constexpr char kRank[] = "RANK";
inline constexpr char kLocalRank[] = "LOCAL_RANK";
inline constexpr char kGroupRank[] = "GROUP_RANK";
inline constexpr char kRoleRank[] = "ROLE_RANK";
inline constexpr char kLocalWorldSize[] = "LOCAL_WORLD_SIZE";
inline constexpr char kWorldSize[] = "WORLD_SIZE";
inline constexpr char kGroupWorldSize[] = "GROUP_WORLD_SIZE";
inline constexpr char kRoleWorldSize[] = "ROLE_WORLD_SIZE";
inline constexpr char kRoleName[] = "ROLE_NAME";
inline constexpr char kMasterAddr[] = "MASTER_ADDR";
inline constexpr char kMasterPort[] = "MASTER_PORT";
inline constexpr char kRestartCount[] = "TORCHELASTIC_RESTART_COUNT";
inline constexpr char kMaxRestarts[] = "TORCHELASTIC_MAX_RESTARTS";
inline constexpr char kRunId[] = "TORCHELASTIC_RUN_ID";
inline constexpr char kErrorFile[] = "TORCHELASTIC_ERROR_FILE";
inline constexpr char kUseAgentStore[] = "TORCHELASTIC_USE_AGENT_STORE";
inline constexpr char kOmpNumThreads[] = "OMP_NUM_THREADS";
// Read by libddp as torch reads it: the interfaces Gloo binds to.
inline constexpr char kGlooSocketIfname[] = "GLOO_SOCKET_IFNAME";

// ddprun's own names.
// host:port of the rendezvous store service (gRPC).
inline constexpr char kStoreEndpoint[] = "DDPRUN_STORE_ENDPOINT";
// The store scope: the job's run id and the round the worker belongs to.
inline constexpr char kStoreRunId[] = "DDPRUN_STORE_RUN_ID";
inline constexpr char kRound[] = "DDPRUN_ROUND";
// File holding the shared token that authenticates store calls (optional).
inline constexpr char kTokenFile[] = "DDPRUN_TOKEN_FILE";
// The token itself, when no file is used (optional).
inline constexpr char kToken[] = "DDPRUN_TOKEN";
// TLS to the store, as the agent talks to the rendezvous (its --tls-* flags;
// absolute paths, unset without TLS). The CA file turns TLS on; the
// certificate and key, both set, make it mutual TLS; the server name is
// checked instead of the endpoint's host.
inline constexpr char kTlsCaFile[] = "DDPRUN_TLS_CA_FILE";
inline constexpr char kTlsCertFile[] = "DDPRUN_TLS_CERT_FILE";
inline constexpr char kTlsKeyFile[] = "DDPRUN_TLS_KEY_FILE";
inline constexpr char kTlsServerName[] = "DDPRUN_TLS_SERVER_NAME";
// This node's address as its peers reach it (Gloo binds its device to it).
inline constexpr char kLocalAddr[] = "DDPRUN_LOCAL_ADDR";
// A file descriptor the worker writes its progress records to: the phases
// it enters and its steps (common/progress_record.h); the agent bounds each
// phase by them. Absent when the agent does not watch progress.
inline constexpr char kProgressFd[] = "DDPRUN_PROGRESS_FD";
// A folder in shared memory (tmpfs) that the node's workers share while
// their agent runs, removed when it ends: for what every local rank would
// otherwise build for itself (libddp keeps the decoded dataset there, once
// per node). Absent when /dev/shm cannot be used. Set before activation too.
inline constexpr char kShmDir[] = "DDPRUN_SHM_DIR";
// Set only in a prewarmed worker (ddprun --prewarm) before its round: a file
// descriptor the worker reads its round's complete environment from (a JSON
// object of strings, then end of file). End of file without data: the worker
// is not needed and exits 0. libddp: ddprun::worker::AwaitActivation().
inline constexpr char kStandbyFd[] = "DDPRUN_STANDBY_FD";
// Set only in the standbys' zygote (ddprun --prewarm, programs that are not
// Python): a Unix socket on which the agent asks for standbys. The process
// forks each from where it waits (libddp: AwaitActivation), copy-on-write
// instead of a new process start; see worker/standby.h for the protocol.
inline constexpr char kZygoteFd[] = "DDPRUN_ZYGOTE_FD";
// Set in one worker that starts while its node has no zygote (ddprun's
// default prewarming): a Unix socket. Where the worker waits for its round
// (AwaitActivation; before its round there, as a worker it only passes),
// it forks the node's zygote, which then serves on this socket as under
// DDPRUN_ZYGOTE_FD, and goes on as the worker.
inline constexpr char kZygoteSeedFd[] = "DDPRUN_ZYGOTE_SEED_FD";
// A file descriptor the agent writes the next round's complete environment
// to (one JSON object of strings per line) while the worker runs: a program
// that recovers in place (libddp: ddprun::worker::Membership, worker/
// recovery.h) keeps running across rounds. Programs that do not read it
// are restarted as under torchrun.
inline constexpr char kControlFd[] = "DDPRUN_CONTROL_FD";

}  // namespace ddprun::common::env
