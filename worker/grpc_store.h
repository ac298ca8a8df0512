#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "worker/store_client.h"
#include "worker/torch_compat.h"

namespace ddprun::worker {

// A c10d::Store over the rendezvous Store service, for one (run, round)
// scope: what Gloo and NCCL use to exchange addresses and unique ids.
// Semantics as c10d's stores: get blocks until the key exists, bounded by the
// store timeout; wait(keys, 0) waits forever; every failure throws c10::Error
// naming the key and the endpoint. Thread-safe.
class GrpcStore : public ::c10d::Store {
 public:
  // Connects lazily: a server that is not up yet is retried per call (see
  // StoreClientOptions). Throws c10::Error on a malformed endpoint.
  explicit GrpcStore(
      const StoreClientOptions& options,
      std::chrono::milliseconds timeout = ::c10d::Store::kDefaultTimeout);
  ~GrpcStore() override;

  void set(const std::string& key, const std::vector<uint8_t>& value) override;
  std::vector<uint8_t> compareSet(const std::string& key,
                                  const std::vector<uint8_t>& expected,
                                  const std::vector<uint8_t>& desired) override;
  std::vector<uint8_t> get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t value) override;
  bool deleteKey(const std::string& key) override;
  bool check(const std::vector<std::string>& keys) override;
  int64_t getNumKeys() override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override;

#if DDPRUN_STORE_HAS_CLONE
  // A second client of the same scope (LibTorch >= 2.5 calls it).
  c10::intrusive_ptr<::c10d::Store> clone();
#endif

 private:
  StoreClientOptions options_;
  std::unique_ptr<StoreClient> client_;
};

}  // namespace ddprun::worker
