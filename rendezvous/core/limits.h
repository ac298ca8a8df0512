#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "ddprun/v1/store.pb.h"

namespace ddprun::rendezvous {

// What one server accepts, so that no client (buggy or hostile) can take
// the memory every other job needs. A request over a size limit is refused
// INVALID_ARGUMENT; one that would grow state past a count limit is refused
// RESOURCE_EXHAUSTED. Every message names the limit and its value.
struct Limits {
  int64_t max_message_bytes = 4 << 20;  // a gRPC request, any method
  int64_t max_key_bytes = 4096;
  int64_t max_value_bytes = 1 << 20;  // a store value
  int64_t max_keys_per_scope = 100000;
  int64_t max_scopes = 100000;  // store scopes, all jobs together
  // Store memory: what keys, values and parked Get/Wait calls hold (each
  // charged its bytes plus a fixed overhead), for all jobs together and per
  // job (a run_id, all its rounds). The defaults fit the 2 GiB the
  // Kubernetes manifest gives the server; flags: --max-store-bytes,
  // --max-job-store-bytes, --max-job-store-keys.
  int64_t max_store_bytes = int64_t{1} << 30;
  int64_t max_job_store_bytes = int64_t{256} << 20;
  int64_t max_job_store_keys = 100000;
  // The server's whole resident memory (its RSS: the process, gRPC's
  // buffers, jobs and store together), which the store caps above do not
  // see: a store write that would take the server past it is refused
  // RESOURCE_EXHAUSTED. Sampled every tick and advanced by what the store
  // charged since. A job holding over half the store (and over a tenth of
  // the bound) is refused at 90 % of it, so that the other jobs keep room: they
  // may store up to that tenth (counted in their store bytes) even when the
  // resident memory is at the bound, as a hog's requests in flight can take it
  // there. So the resident memory stays within the bound plus a tenth.
  // --max-memory-bytes; 0: no bound but the store caps. ddprun-rendezvous sets
  // kDefaultMemoryBytes (its flag's default); an agent's in-process server
  // keeps 0 (one job).
  int64_t max_memory_bytes = 0;
  // Back-pressure on store writes (StoreWriteRate): the request bytes of
  // one job's Set, Add, CompareSet and DeleteKey calls, stored or refused
  // alike, may arrive at this rate after a burst; a job past it is answered
  // late (its writes parked until the rate paid for them, then applied), so
  // a client with a bounded number of calls in flight slows down to the
  // rate instead of taking the CPU every other job's calls need. Real jobs
  // write NCCL ids, addresses and counters: bytes to kilobytes per node and
  // round (a 100,000-node job's round: ~10 MB, spread over the round), so
  // 16 MiB/s is far above them and a tenth of what one client sending 1 MiB
  // values can push on a 2-core server (~170 MiB/s, which tripled the other
  // jobs' round latency: bench/rendezvous/README.md, wave 8). The burst is
  // the largest request (max_message_bytes): it lets any single write
  // through at once, while what a hog spends at once is what the other
  // jobs' tail latency pays (a 32 MiB burst measured 2.9x their quiet
  // p99, 4 MiB 1.7-2.2x). Parked writes hold their requests: a write that
  // would take its job's parked writes past max_job_parked_write_bytes, or
  // all jobs' past a twentieth of max_memory_bytes (a quarter of
  // max_store_bytes without a bound), is refused RESOURCE_EXHAUSTED at
  // once. Flags: --max-job-store-write-bytes-per-s (0: no rate),
  // --job-store-write-burst-bytes, --max-job-parked-write-bytes.
  int64_t max_job_store_write_bytes_per_s = int64_t{16} << 20;
  int64_t job_store_write_burst_bytes = int64_t{4} << 20;
  int64_t max_job_parked_write_bytes = int64_t{16} << 20;
  // A write refused past those parked caps is answered when its job's rate
  // has paid for it (its payload dropped meanwhile), up to this many such
  // refusals held at once for all jobs; past it, at once. Without it a
  // client with more calls in flight than its parked share resends as fast
  // as the refusals come: a hog on 32 connections took the CPU the other
  // jobs' rounds need. A held call costs a few KiB of gRPC state.
  // --max-held-store-refusals; 0: every refusal at once.
  int64_t max_held_store_refusals = 4096;
  int64_t max_keys_per_request = 10000;  // Check, Wait
  int64_t max_id_bytes = 512;            // run_id, node_id, address
  int64_t max_nodes_per_job = 100000;
  int64_t max_jobs = 10000;
  int64_t max_failure_message_bytes = 8192;  // longer ones are cut
};

// ddprun-rendezvous's --max-memory-bytes default: the store caps alone let
// jobs hold 1 GiB plus what gRPC keeps; 1.5 GiB leaves room in the 2 GiB the
// Kubernetes manifest gives the server.
inline constexpr int64_t kDefaultMemoryBytes = int64_t{1536} << 20;

// The smallest --max-memory-bytes that is not 0: below it the server's own
// start-up (gRPC, its threads) is over the bound and every write is refused.
inline constexpr int64_t kMinMemoryBytes = int64_t{64} << 20;

// INVALID_ARGUMENT, naming the flag, its value and the fix, for limits that
// cannot work: a size or count below 1 (0 where 0 means "off" is fine), a
// value larger than a request, a memory bound below kMinMemoryBytes.
absl::Status ValidateLimits(const Limits& limits);

// Checks the sizes of a store request's scope, key and value.
absl::Status CheckStoreSizes(const Limits& limits, const v1::StoreScope& scope,
                             const std::string& key, size_t value_bytes = 0);

}  // namespace ddprun::rendezvous
