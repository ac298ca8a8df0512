#include "launcher/cli/rdzv_conf.h"

#include <algorithm>
#include <cmath>
#include <iterator>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace ddprun::launcher {

absl::StatusOr<absl::Duration> ParseSeconds(absl::string_view flag,
                                            absl::string_view text) {
  double seconds = 0;
  // SimpleAtod takes "nan" and "inf": neither is a duration a deadline can
  // be computed from (NaN compares false to everything, so it passed every
  // range check after it).
  if (!absl::SimpleAtod(text, &seconds) || !std::isfinite(seconds) ||
      seconds < 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: '%s' is not a finite, non-negative number of seconds; write "
        "e.g. %s 5 or %s 0.5",
        flag, text, flag, flag));
  }
  return absl::Seconds(seconds);
}

absl::Status ParseRdzvConf(absl::string_view text, RdzvConf& conf) {
  // torchrun's keys that have no meaning with ddprun's rendezvous: the c10d
  // store's transport, etcd's plain connection. None changes what the
  // workers see.
  static constexpr absl::string_view kIgnored[] = {"store_type", "use_libuv",
                                                   "protocol", "rank"};
  // etcd's TLS: ignoring it would leave a job that asked for TLS in
  // plaintext, so it is refused with ddprun's flags for the same thing.
  static constexpr absl::string_view kTlsKeys[] = {"cacert", "cert", "key"};
  int keep_alive_max_attempt = 0;
  for (absl::string_view item : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    std::pair<absl::string_view, absl::string_view> kv =
        absl::StrSplit(item, absl::MaxSplits('=', 1));
    absl::string_view key = absl::StripAsciiWhitespace(kv.first);
    absl::string_view value = absl::StripAsciiWhitespace(kv.second);
    if (std::find(std::begin(kTlsKeys), std::end(kTlsKeys), key) !=
            std::end(kTlsKeys) ||
        (key == "protocol" && absl::AsciiStrToLower(value) == "https")) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "--rdzv-conf %s=%s: etcd's TLS settings are not ddprun's; give "
          "--tls-ca-file (cacert) and, for mutual TLS, --tls-cert-file and "
          "--tls-key-file (cert, key); the agent that serves the rendezvous "
          "takes its certificate as --host-tls-cert-file and "
          "--host-tls-key-file",
          key, value));
    }
    if (std::find(std::begin(kIgnored), std::end(kIgnored), key) !=
        std::end(kIgnored)) {
      conf.ignored.push_back(absl::StrCat(key, "=", value));
      continue;
    }
    if (key == "is_host") {
      std::string v = absl::AsciiStrToLower(value);
      if (v == "1" || v == "true" || v == "yes" || v == "y") {
        conf.is_host = true;
      } else if (v == "0" || v == "false" || v == "no" || v == "n") {
        conf.is_host = false;
      } else {
        return absl::InvalidArgumentError(absl::StrFormat(
            "--rdzv-conf is_host: '%s' is not a boolean; write is_host=1 or "
            "is_host=0",
            value));
      }
      continue;
    }
    if (key == "keep_alive_max_attempt") {
      if (!absl::SimpleAtoi(value, &keep_alive_max_attempt) ||
          keep_alive_max_attempt < 1) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "--rdzv-conf keep_alive_max_attempt: '%s' is not a positive "
            "integer; write e.g. keep_alive_max_attempt=3",
            value));
      }
      continue;
    }
    absl::Duration* target = nullptr;
    // c10d's "timeout" is its join timeout.
    if (key == "last_call_timeout") target = &conf.last_call_timeout;
    if (key == "join_timeout" || key == "timeout") target = &conf.join_timeout;
    if (key == "close_timeout") target = &conf.close_timeout;
    if (key == "read_timeout") target = &conf.read_timeout;
    if (key == "heartbeat_interval" || key == "keep_alive_interval") {
      target = &conf.heartbeat_interval;
    }
    if (key == "heartbeat_timeout") target = &conf.heartbeat_timeout;
    if (target == nullptr) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "--rdzv-conf: unknown key '%s'; known keys: last_call_timeout, "
          "join_timeout (timeout), close_timeout, read_timeout, "
          "heartbeat_interval (keep_alive_interval), heartbeat_timeout, "
          "keep_alive_max_attempt, is_host; accepted and ignored: "
          "store_type, use_libuv, protocol, rank",
          key));
    }
    absl::StatusOr<absl::Duration> d =
        ParseSeconds(absl::StrFormat("--rdzv-conf %s", key), value);
    if (!d.ok()) return d.status();
    *target = *d;
  }
  if (conf.heartbeat_interval <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        "--rdzv-conf heartbeat_interval must be positive; write e.g. "
        "heartbeat_interval=1");
  }
  // torchrun: a node is dead after keep_alive_max_attempt missed beats.
  if (keep_alive_max_attempt > 0) {
    conf.heartbeat_timeout = conf.heartbeat_interval * keep_alive_max_attempt;
  }
  return absl::OkStatus();
}

absl::Status ParseNnodes(absl::string_view text, int& min_nodes,
                         int& max_nodes) {
  std::vector<absl::string_view> parts = absl::StrSplit(text, ':');
  int lo = 0;
  int hi = 0;
  bool ok = false;
  if (parts.size() == 1) {
    ok = absl::SimpleAtoi(parts[0], &lo);
    hi = lo;
  } else if (parts.size() == 2) {
    ok = absl::SimpleAtoi(parts[0], &lo) && absl::SimpleAtoi(parts[1], &hi);
  }
  if (!ok || lo < 1 || hi < lo) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--nnodes: '%s' is not N or MIN:MAX with 1 <= MIN <= MAX; write e.g. "
        "--nnodes 2 or --nnodes 1:4",
        text));
  }
  min_nodes = lo;
  max_nodes = hi;
  return absl::OkStatus();
}

absl::StatusOr<PerRankStreams> ParsePerRankStreams(absl::string_view flag,
                                                   absl::string_view text) {
  auto bad = [&]() {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: '%s' is not 0-3 or LOCAL_RANK:0-3,...; write e.g. %s 3 or %s "
        "0:1,1:2 (1 stdout, 2 stderr, 3 both)",
        flag, text, flag, flag));
  };
  PerRankStreams streams;
  if (text.find(':') == absl::string_view::npos) {
    if (!absl::SimpleAtoi(text, &streams.all) || streams.all < 0 ||
        streams.all > 3) {
      return bad();
    }
    return streams;
  }
  for (absl::string_view item : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    std::vector<absl::string_view> kv = absl::StrSplit(item, ':');
    int rank = 0;
    int value = 0;
    if (kv.size() != 2 || !absl::SimpleAtoi(kv[0], &rank) ||
        !absl::SimpleAtoi(kv[1], &value) || rank < 0 || value < 0 ||
        value > 3) {
      return bad();
    }
    streams.by_local_rank[rank] = value;
  }
  return streams;
}

absl::StatusOr<std::vector<int>> ParseIntList(absl::string_view flag,
                                              absl::string_view text) {
  std::vector<int> values;
  for (absl::string_view item : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    int value = 0;
    if (!absl::SimpleAtoi(item, &value) || value < 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: '%s' is not a list of local ranks; write e.g. %s 0,1", flag,
          text, flag));
    }
    values.push_back(value);
  }
  return values;
}

}  // namespace ddprun::launcher
