#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/auth.h"

namespace ddprun::worker {

struct StoreClientOptions {
  std::string endpoint;  // "host:port" of the rendezvous Store service
  std::string run_id;    // the scope: job and round
  int64_t round = 0;
  // The token (sent as "authorization: Bearer <token>" when set) and TLS.
  common::Credentials credentials;
  // The deadline of a call that does not wait for keys.
  absl::Duration call_timeout = absl::Seconds(30);
  // A blocking call's deadline is its wait plus this, so that the server,
  // not the client, reports the timeout.
  absl::Duration deadline_slack = absl::Seconds(5);
  // How long UNAVAILABLE (server not up yet, connection lost) is retried,
  // with common::Backoff, before the call fails.
  absl::Duration retry_unavailable_for = absl::Seconds(30);
  // "Wait forever" is done as waits of this length, so every RPC still has
  // a deadline.
  absl::Duration forever_chunk = absl::Seconds(60);
  // Calls end (ABORTED) when the round ends: when the in-place recovery
  // watcher (worker/recovery.h) requests a collective abort because the
  // agent announced the next round, a call in flight is cancelled and no
  // new call starts until the next round is taken (NextRound clears it).
  bool end_with_round = true;
};

// A client of the ddprun.v1.Store service for one scope. All calls are
// blocking and thread-safe (the gRPC stub is). Errors name the operation,
// the key, the endpoint and the scope. Kept free of LibTorch so gRPC and
// torch headers never meet in one translation unit.
class StoreClient {
 public:
  static absl::StatusOr<std::unique_ptr<StoreClient>> Create(
      const StoreClientOptions& options);
  ~StoreClient();

  absl::Status Set(const std::string& key, const std::string& value);
  // Blocks until the key exists or `timeout` passes (DeadlineExceeded);
  // absl::InfiniteDuration() waits forever.
  absl::StatusOr<std::string> Get(const std::string& key,
                                  absl::Duration timeout);
  absl::StatusOr<int64_t> Add(const std::string& key, int64_t delta);
  absl::StatusOr<std::string> CompareSet(const std::string& key,
                                         const std::string& expected,
                                         const std::string& desired);
  absl::StatusOr<bool> Check(const std::vector<std::string>& keys);
  absl::Status Wait(const std::vector<std::string>& keys,
                    absl::Duration timeout);
  absl::StatusOr<bool> DeleteKey(const std::string& key);
  absl::StatusOr<int64_t> NumKeys();

  const StoreClientOptions& options() const { return options_; }

 private:
  class Impl;
  StoreClient(StoreClientOptions options, std::unique_ptr<Impl> impl);

  StoreClientOptions options_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ddprun::worker
