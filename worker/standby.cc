#include "worker/standby.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "common/worker_env.h"
#include "spdlog/spdlog.h"
#include "worker/error_file.h"
#include "worker/worker_env.h"

namespace ddprun::worker {
namespace env = ::ddprun::common::env;
namespace {

// A parser for exactly what the agent writes (launcher/agent/standby_pool.cc's
// EnvToJson): one flat object of string values.
class EnvJsonParser {
 public:
  explicit EnvJsonParser(const std::string& text) : s_(text) {}

  absl::StatusOr<std::vector<std::pair<std::string, std::string>>> Parse() {
    std::vector<std::pair<std::string, std::string>> out;
    SkipSpace();
    if (!Eat('{')) return Error("expected '{'");
    SkipSpace();
    if (Eat('}')) return Finish(std::move(out));
    while (true) {
      SkipSpace();
      std::string name, value;
      if (!String(name)) return Error("expected a quoted name");
      SkipSpace();
      if (!Eat(':')) return Error("expected ':'");
      SkipSpace();
      if (!String(value)) return Error("expected a quoted string value");
      out.emplace_back(std::move(name), std::move(value));
      SkipSpace();
      if (Eat('}')) return Finish(std::move(out));
      if (!Eat(',')) return Error("expected ',' or '}'");
    }
  }

 private:
  absl::StatusOr<std::vector<std::pair<std::string, std::string>>> Finish(
      std::vector<std::pair<std::string, std::string>> out) {
    SkipSpace();
    if (pos_ != s_.size()) return Error("data after the object");
    return out;
  }

  absl::Status Error(const char* what) const {
    return absl::InvalidArgumentError(absl::StrFormat(
        "the environment from ddprun (%s or %s) is not a JSON object of "
        "strings: %s at byte %d of %d; start this program with ddprun, "
        "which writes it",
        env::kStandbyFd, env::kControlFd, what, pos_, s_.size()));
  }

  void SkipSpace() {
    while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\n' ||
                                s_[pos_] == '\t' || s_[pos_] == '\r')) {
      ++pos_;
    }
  }

  bool Eat(char c) {
    if (pos_ < s_.size() && s_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }

  static void AppendUtf8(std::string& out, uint32_t cp) {
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xC0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      out += static_cast<char>(0xE0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (cp >> 18));
      out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }

  bool Hex4(uint32_t& cp) {
    if (pos_ + 4 > s_.size()) return false;
    cp = 0;
    for (int i = 0; i < 4; ++i) {
      char c = s_[pos_++];
      cp <<= 4;
      if (c >= '0' && c <= '9') {
        cp |= c - '0';
      } else if (c >= 'a' && c <= 'f') {
        cp |= c - 'a' + 10;
      } else if (c >= 'A' && c <= 'F') {
        cp |= c - 'A' + 10;
      } else {
        return false;
      }
    }
    return true;
  }

  bool String(std::string& out) {
    if (!Eat('"')) return false;
    while (pos_ < s_.size()) {
      char c = s_[pos_++];
      if (c == '"') return true;
      if (c != '\\') {
        out += c;
        continue;
      }
      if (pos_ >= s_.size()) return false;
      char e = s_[pos_++];
      switch (e) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': {
          uint32_t cp = 0;
          if (!Hex4(cp)) return false;
          if (cp >= 0xD800 && cp < 0xDC00 && pos_ + 6 <= s_.size() &&
              s_[pos_] == '\\' && s_[pos_ + 1] == 'u') {
            pos_ += 2;
            uint32_t low = 0;
            if (!Hex4(low)) return false;
            cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
          }
          AppendUtf8(out, cp);
          break;
        }
        default:
          return false;
      }
    }
    return false;
  }

  const std::string& s_;
  size_t pos_ = 0;
};

}  // namespace

absl::StatusOr<std::vector<std::pair<std::string, std::string>>> ParseEnvJson(
    const std::string& text) {
  return EnvJsonParser(text).Parse();
}

absl::Status AwaitActivation() {
  std::optional<std::string> fd_text = ReadStandbyFd();
  if (!fd_text.has_value()) return absl::OkStatus();
  int fd = -1;
  if (!absl::SimpleAtoi(*fd_text, &fd) || fd < 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s='%s' is not a file descriptor; unset it, or start this program "
        "with ddprun --prewarm, which sets it",
        env::kStandbyFd, *fd_text));
  }
  auto waiting_since = std::chrono::steady_clock::now();
  std::string data;
  char buffer[16384];
  while (true) {
    ssize_t n = read(fd, buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      int err = errno;
      close(fd);
      return absl::UnavailableError(absl::StrFormat(
          "cannot read the round's environment from %s=%d: %s", env::kStandbyFd,
          fd, strerror(err)));
    }
    if (n == 0) break;
    data.append(buffer, static_cast<size_t>(n));
  }
  close(fd);
  if (data.empty()) {
    // Not needed (the job ended, or the agent let this standby go): leave
    // without running what exit() would, which may block on threads that
    // libraries started.
    fflush(nullptr);
    _exit(0);
  }
  absl::StatusOr<std::vector<std::pair<std::string, std::string>>> vars =
      EnvJsonParser(data).Parse();
  if (!vars.ok()) return vars.status();
  clearenv();
  for (const auto& [name, value] : *vars) {
    if (name.empty() || name.find('=') != std::string::npos) continue;
    setenv(name.c_str(), value.c_str(), /*overwrite=*/1);
  }
  if (std::string error_file = ReadErrorFilePath(); !error_file.empty()) {
    InstallErrorFileHandlers(error_file);
  }
  double waited = std::chrono::duration<double>(
                      std::chrono::steady_clock::now() - waiting_since)
                      .count();
  // Only for the log line: RANK as given, whatever the rest holds.
  spdlog::info("prewarmed process {} activated as rank {} after {:.1f} s in "
               "standby",
               getpid(), common::ProcessEnv(env::kRank).value_or("?"), waited);
  return absl::OkStatus();
}

}  // namespace ddprun::worker
