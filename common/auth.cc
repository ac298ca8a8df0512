#include "common/auth.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_format.h"
#include "common/secret_file.h"
#include "common/worker_env.h"

namespace ddprun::common {

absl::StatusOr<std::string> ReadSecretFile(const std::string& path,
                                           absl::string_view what) {
  // An ifstream opens a folder and reads nothing: without this a folder
  // was reported as an empty file, or by its mode.
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "the %s file '%s' is a folder; give the path of the file inside it "
        "(e.g. '%s/token')",
        what, path, path));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(absl::StrFormat(
        "cannot read the %s file '%s': it is missing or not readable by this "
        "user; check the path and its permissions",
        what, path));
  }
  std::ostringstream content;
  content << in.rdbuf();
  return content.str();
}

std::optional<std::string> ProcessEnv(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr) return std::nullopt;
  return std::string(value);
}

namespace {

// The token in `token_file` (its only line, surrounding whitespace removed;
// an empty token is an error), else `from_env` (DDPRUN_TOKEN), else none.
absl::StatusOr<std::string> ReadToken(
    const std::string& token_file, const std::optional<std::string>& from_env) {
  if (!token_file.empty()) {
    absl::StatusOr<std::string> content = ReadSecretFile(token_file, "token");
    if (!content.ok()) return content.status();
    absl::Status private_file = CheckSecretFilePermissions(token_file, "token");
    if (!private_file.ok()) return private_file;
    std::string token(absl::StripAsciiWhitespace(*content));
    if (token.empty()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "the token file '%s' is empty; write the shared token into it "
          "(e.g. head -c 32 /dev/urandom | base64)",
          token_file));
    }
    if (token.find_first_of("\r\n") != std::string::npos) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "the token file '%s' holds more than one line; it must hold the "
          "token alone",
          token_file));
    }
    return token;
  }
  return std::string(
      from_env.has_value() ? absl::StripAsciiWhitespace(*from_env) : "");
}

}  // namespace

absl::StatusOr<std::string> LoadToken(const std::string& token_file) {
  return ReadToken(token_file, ProcessEnv(env::kToken));
}

void Credentials::ClearTls() {
  tls_ca_file.clear();
  tls_cert_file.clear();
  tls_key_file.clear();
  tls_server_name.clear();
}

Credentials Credentials::ForWorkers() const {
  Credentials out;
  std::error_code ec;
  auto absolute = [&ec](const std::string& path) -> std::string {
    return path.empty() ? path : std::filesystem::absolute(path, ec).string();
  };
  out.token_file = absolute(token_file);
  // TLS files without a CA are refused when the channel is made; a worker
  // gets none then.
  if (!tls_ca_file.empty()) {
    out.tls_ca_file = absolute(tls_ca_file);
    out.tls_cert_file = absolute(tls_cert_file);
    out.tls_key_file = absolute(tls_key_file);
    out.tls_server_name = tls_server_name;
  }
  return out;
}

void Credentials::ToEnv(std::map<std::string, std::string>& vars) const {
  for (const auto& [name, value] :
       {std::pair{env::kTokenFile, &token_file},
        std::pair{env::kTlsCaFile, &tls_ca_file},
        std::pair{env::kTlsCertFile, &tls_cert_file},
        std::pair{env::kTlsKeyFile, &tls_key_file},
        std::pair{env::kTlsServerName, &tls_server_name}}) {
    if (value->empty()) {
      vars.erase(name);
    } else {
      vars[name] = *value;
    }
  }
}

absl::StatusOr<Credentials> Credentials::FromEnv(const EnvLookup& lookup) {
  // An empty variable counts as unset.
  auto get = [&lookup](const char* name) -> std::string {
    return lookup(name).value_or("");
  };
  Credentials c;
  c.token_file = get(env::kTokenFile);
  c.tls_ca_file = get(env::kTlsCaFile);
  c.tls_cert_file = get(env::kTlsCertFile);
  c.tls_key_file = get(env::kTlsKeyFile);
  c.tls_server_name = get(env::kTlsServerName);
  if (c.tls_cert_file.empty() != c.tls_key_file.empty()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s='%s' and %s='%s': mutual TLS needs both a certificate and its "
        "key; set both or neither",
        env::kTlsCertFile, c.tls_cert_file, env::kTlsKeyFile, c.tls_key_file));
  }
  absl::StatusOr<std::string> token =
      ReadToken(c.token_file, lookup(env::kToken));
  if (!token.ok()) {
    return absl::Status(
        token.status().code(),
        absl::StrFormat("%s: %s", env::kTokenFile, token.status().message()));
  }
  c.token = *std::move(token);
  return c;
}

}  // namespace ddprun::common
