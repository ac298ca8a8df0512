#include "launcher/agent/error_file.h"

#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"

namespace ddprun::launcher {
namespace {

// Long tracebacks stay in the file; the summary shows the start.
constexpr size_t kMaxMessageBytes = 4096;

std::string Clip(std::string text) {
  if (text.size() > kMaxMessageBytes) {
    text.resize(kMaxMessageBytes);
    text += "...";
  }
  return text;
}

}  // namespace

std::string ReadWorkerErrorMessage(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return "";
  std::ostringstream content;
  content << in.rdbuf();
  std::string text(absl::StripAsciiWhitespace(content.str()));
  if (text.empty()) return "";
  google::protobuf::Struct root;
  if (!google::protobuf::util::JsonStringToMessage(text, &root).ok()) {
    return Clip(text);
  }
  auto it = root.fields().find("message");
  if (it == root.fields().end()) return Clip(text);
  const google::protobuf::Value& message = it->second;
  if (message.has_string_value()) return Clip(message.string_value());
  if (message.has_struct_value()) {
    const auto& inner = message.struct_value().fields();
    auto m = inner.find("message");
    if (m != inner.end() && m->second.has_string_value()) {
      // torch's @record puts the Python traceback in extraInfo.py_callstack;
      // torchrun's summary shows it, and so does ours: its end (where the
      // error was raised) when it is long.
      std::string text = m->second.string_value();
      auto extra = inner.find("extraInfo");
      if (extra != inner.end() && extra->second.has_struct_value()) {
        const auto& info = extra->second.struct_value().fields();
        auto stack = info.find("py_callstack");
        if (stack != info.end() && stack->second.has_string_value() &&
            !stack->second.string_value().empty()) {
          std::string trace = stack->second.string_value();
          size_t room = kMaxMessageBytes > text.size() + 64
                            ? kMaxMessageBytes - text.size() - 64
                            : 0;
          if (trace.size() > room) {
            trace = "..." + trace.substr(trace.size() - room);
          }
          text += kTracebackMarker +
                  std::string(absl::StripTrailingAsciiWhitespace(trace));
        }
      }
      return Clip(text);
    }
  }
  return Clip(text);
}

}  // namespace ddprun::launcher
