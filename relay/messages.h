#pragma once

#include "grpcpp/impl/codegen/proto_utils.h"
#include "grpcpp/support/byte_buffer.h"

namespace ddprun::relay {

// A message of the generic API's bytes, read as `message`. False: not one.
// `buffer` is consumed.
template <typename Message>
bool ParseMessage(grpc::ByteBuffer* buffer, Message* message) {
  return grpc::SerializationTraits<Message>::Deserialize(buffer, message).ok();
}

// `message` as bytes for the generic API.
template <typename Message>
grpc::ByteBuffer SerializeMessage(const Message& message) {
  grpc::ByteBuffer buffer;
  bool own_buffer = false;
  grpc::SerializationTraits<Message>::Serialize(message, &buffer, &own_buffer);
  return buffer;
}

}  // namespace ddprun::relay
