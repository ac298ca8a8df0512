#pragma once

#include <functional>
#include <map>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

// The credentials type, free of gRPC so that libddp's LibTorch code may
// include it (common/credentials.h makes channels from it).
namespace ddprun::common {

// Looks up an environment variable: the process's own (ProcessEnv), or a
// map in tests. nullopt: unset.
using EnvLookup = std::function<std::optional<std::string>(const char* name)>;
std::optional<std::string> ProcessEnv(const char* name);

// How a client proves itself to the rendezvous server (and its store) and
// checks the server: the one credentials type of ddprun. The agent fills it
// from its flags, hands it to its workers with ToEnv, and a worker reads it
// back with FromEnv.
struct Credentials {
  // The shared token's file; empty: $DDPRUN_TOKEN, else no token.
  std::string token_file;
  // Sent on every call; empty: none. Filled by LoadToken / FromEnv.
  std::string token;
  // TLS is on when tls_ca_file is set: the server's certificate must chain
  // to this CA (PEM).
  std::string tls_ca_file;
  // Both set: the client certificate and key (PEM) for mutual TLS.
  std::string tls_cert_file;
  std::string tls_key_file;
  // The name checked against the server certificate instead of the host of
  // the endpoint (e.g. a certificate for "rendezvous" dialled by IP).
  std::string tls_server_name;

  // No TLS: plaintext, the token alone.
  void ClearTls();
  // What a worker is given: the token file and TLS files as absolute paths
  // (workers may change directory); the token itself stays out (a worker
  // reads the file, or inherits DDPRUN_TOKEN).
  Credentials ForWorkers() const;
  // Sets DDPRUN_TOKEN_FILE and DDPRUN_TLS_* in `vars` from the non-empty
  // fields and removes the names of the empty ones, so that a worker talks
  // to the store exactly as its agent talks to the rendezvous.
  void ToEnv(std::map<std::string, std::string>& vars) const;
  // The worker's side: the fields from DDPRUN_TOKEN_FILE (the token read
  // from it) or DDPRUN_TOKEN, and DDPRUN_TLS_*. Errors name the variable:
  // an unreadable or empty token file, a certificate without its key.
  static absl::StatusOr<Credentials> FromEnv(const EnvLookup& lookup);
};

// The shared token: the first line of `token_file` when it is given
// (surrounding whitespace removed; an empty token is an error), otherwise
// the environment variable DDPRUN_TOKEN, otherwise empty (no token).
absl::StatusOr<std::string> LoadToken(const std::string& token_file);

// Reads a whole file, for keys and certificates. The error names the file.
absl::StatusOr<std::string> ReadSecretFile(const std::string& path,
                                           absl::string_view what);

}  // namespace ddprun::common
