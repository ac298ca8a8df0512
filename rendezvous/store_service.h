#pragma once

#include <string>
#include <vector>

#include "ddprun/v1/store.grpc.pb.h"
#include "grpcpp/support/status.h"
#include "rendezvous/job_table.h"
#include "rendezvous/limits.h"
#include "rendezvous/parked_calls.h"
#include "rendezvous/store_state.h"
#include "rendezvous/token_check.h"

namespace ddprun::rendezvous {

// The Store service: a thin gRPC adapter over StoreState. Every call first
// checks its scope against the jobs (a stale round is FAILED_PRECONDITION).
// Get and Wait are parked without a thread until StoreState reports them
// done, they time out, or the client cancels. Every call is admitted first:
// token, sizes (Limits), then scope. Thread-safe.
class StoreService final : public v1::Store::CallbackService {
 public:
  // All three must outlive the service.
  StoreService(const JobTable* jobs, StoreState* store, const TokenCheck* token,
               Limits limits);

  grpc::ServerUnaryReactor* Set(grpc::CallbackServerContext* context,
                                const v1::SetRequest* request,
                                v1::SetResponse* response) override;
  grpc::ServerUnaryReactor* Get(grpc::CallbackServerContext* context,
                                const v1::GetRequest* request,
                                v1::GetResponse* response) override;
  grpc::ServerUnaryReactor* Add(grpc::CallbackServerContext* context,
                                const v1::AddRequest* request,
                                v1::AddResponse* response) override;
  grpc::ServerUnaryReactor* CompareSet(
      grpc::CallbackServerContext* context,
      const v1::CompareSetRequest* request,
      v1::CompareSetResponse* response) override;
  grpc::ServerUnaryReactor* Check(grpc::CallbackServerContext* context,
                                  const v1::CheckRequest* request,
                                  v1::CheckResponse* response) override;
  grpc::ServerUnaryReactor* Wait(grpc::CallbackServerContext* context,
                                 const v1::WaitRequest* request,
                                 v1::WaitResponse* response) override;
  grpc::ServerUnaryReactor* DeleteKey(grpc::CallbackServerContext* context,
                                      const v1::DeleteKeyRequest* request,
                                      v1::DeleteKeyResponse* response) override;
  grpc::ServerUnaryReactor* NumKeys(grpc::CallbackServerContext* context,
                                    const v1::NumKeysRequest* request,
                                    v1::NumKeysResponse* response) override;

  // Finishes the parked calls StoreState reported done.
  void Complete(std::vector<StoreCompletion> done);
  void ReleaseRoundsBefore(const std::string& run_id, int64_t before_round);
  void Tick();
  void CancelAll(const grpc::Status& status);
  // Get and Wait calls parked now.
  size_t num_parked() const { return parked_.size(); }

 private:
  // A parked Get or Wait: the response to fill (nullptr for a Wait).
  using Parked = ParkedCalls<v1::GetResponse>;

  // Token, sizes of scope/key/value, then the scope's round.
  absl::Status Admit(const grpc::CallbackServerContext& context,
                     const v1::StoreScope& scope, const std::string& key,
                     size_t value_bytes = 0) const;
  absl::Status AdmitKeys(
      const grpc::CallbackServerContext& context, const v1::StoreScope& scope,
      const google::protobuf::RepeatedPtrField<std::string>& keys) const;
  // Parks an admitted Get or Wait; `start` hands it to StoreState.
  grpc::ServerUnaryReactor* Park(
      grpc::CallbackServerContext* context, v1::GetResponse* response,
      const std::function<void(WaiterId, absl::Duration,
                               std::vector<StoreCompletion>*)>& start,
      const v1::StoreScope& scope, int64_t timeout_ms);

  const JobTable* const jobs_;
  StoreState* const store_;
  const TokenCheck* const token_;
  const Limits limits_;
  Parked parked_;
};

}  // namespace ddprun::rendezvous
