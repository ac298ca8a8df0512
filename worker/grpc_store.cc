#include "worker/grpc_store.h"

#include <c10/util/Exception.h>

namespace ddprun::worker {
namespace {

std::string ToString(const std::vector<uint8_t>& bytes) {
  return std::string(bytes.begin(), bytes.end());
}

std::vector<uint8_t> ToBytes(const std::string& text) {
  return std::vector<uint8_t>(text.begin(), text.end());
}

// c10d's convention: a zero timeout means no timeout.
absl::Duration ToDuration(std::chrono::milliseconds timeout) {
  if (timeout == ::c10d::Store::kNoTimeout) return absl::InfiniteDuration();
  return absl::FromChrono(timeout);
}

template <typename T>
T ValueOrThrow(absl::StatusOr<T> result) {
  TORCH_CHECK(result.ok(), result.status().ToString());
  return std::move(*result);
}

void OkOrThrow(const absl::Status& status) {
  TORCH_CHECK(status.ok(), status.ToString());
}

}  // namespace

GrpcStore::GrpcStore(const StoreClientOptions& options,
                     std::chrono::milliseconds timeout)
    : ::c10d::Store(timeout), options_(options) {
  client_ = ValueOrThrow(StoreClient::Create(options));
}

GrpcStore::~GrpcStore() = default;

void GrpcStore::set(const std::string& key, const std::vector<uint8_t>& value) {
  OkOrThrow(client_->Set(key, ToString(value)));
}

std::vector<uint8_t> GrpcStore::compareSet(
    const std::string& key, const std::vector<uint8_t>& expected,
    const std::vector<uint8_t>& desired) {
  return ToBytes(ValueOrThrow(
      client_->CompareSet(key, ToString(expected), ToString(desired))));
}

std::vector<uint8_t> GrpcStore::get(const std::string& key) {
  return ToBytes(ValueOrThrow(client_->Get(key, ToDuration(timeout_))));
}

int64_t GrpcStore::add(const std::string& key, int64_t value) {
  return ValueOrThrow(client_->Add(key, value));
}

bool GrpcStore::deleteKey(const std::string& key) {
  return ValueOrThrow(client_->DeleteKey(key));
}

bool GrpcStore::check(const std::vector<std::string>& keys) {
  return ValueOrThrow(client_->Check(keys));
}

int64_t GrpcStore::getNumKeys() { return ValueOrThrow(client_->NumKeys()); }

void GrpcStore::wait(const std::vector<std::string>& keys) {
  wait(keys, timeout_);
}

void GrpcStore::wait(const std::vector<std::string>& keys,
                     const std::chrono::milliseconds& timeout) {
  OkOrThrow(client_->Wait(keys, ToDuration(timeout)));
}

#if DDPRUN_STORE_HAS_CLONE
c10::intrusive_ptr<::c10d::Store> GrpcStore::clone() {
  return c10::make_intrusive<GrpcStore>(options_, timeout_);
}
#endif

}  // namespace ddprun::worker
