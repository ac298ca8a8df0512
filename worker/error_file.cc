#include "worker/error_file.h"

#include <cxxabi.h>
#include <fcntl.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <ctime>
#include <exception>
#include <iostream>
#include <typeinfo>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/json_string.h"
#include "common/worker_env.h"
#include "worker/worker_env.h"

namespace ddprun::worker {
namespace {

// The handlers' state: set once before they are installed, then only read.
char g_path[4096];
volatile sig_atomic_t g_written = 0;

std::string Demangle(const char* name) {
  int status = 0;
  char* demangled = abi::__cxa_demangle(name, nullptr, nullptr, &status);
  std::string out = status == 0 && demangled != nullptr ? demangled : name;
  std::free(demangled);
  return out;
}

// c10::Error's what() carries a C++ backtrace; its first line is the message.
std::string FirstLine(const char* what) {
  std::string text(what);
  size_t newline = text.find('\n');
  return newline == std::string::npos ? text : text.substr(0, newline);
}

void OnTerminate() {
  std::string message = "terminate called without an active exception";
  if (std::exception_ptr current = std::current_exception()) {
    std::type_info* type = abi::__cxa_current_exception_type();
    std::string type_name = type ? Demangle(type->name()) : "unknown";
    try {
      std::rethrow_exception(current);
    } catch (const std::exception& e) {
      message = absl::StrCat(type_name, ": ", FirstLine(e.what()));
    } catch (...) {
      message = absl::StrCat(type_name, ": (not a std::exception)");
    }
  }
  std::cerr << "uncaught exception: " << message << std::endl;
  if (g_path[0] != '\0') {
    (void)WriteErrorFile(g_path, message);
    g_written = 1;
  }
  std::abort();
}

// Async-signal-safe pieces of the signal handler.
void SafeWrite(int fd, const char* text) {
  size_t left = strlen(text);
  while (left > 0) {
    ssize_t n = write(fd, text, left);
    if (n <= 0) return;
    text += n;
    left -= static_cast<size_t>(n);
  }
}

void SafeWriteNumber(int fd, long long value) {
  char digits[24];
  int i = sizeof(digits) - 1;
  digits[i] = '\0';
  if (value == 0) digits[--i] = '0';
  while (value > 0 && i > 0) {
    digits[--i] = static_cast<char>('0' + value % 10);
    value /= 10;
  }
  SafeWrite(fd, digits + i);
}

const char* SignalName(int sig) {
  switch (sig) {
    case SIGSEGV:
      return "SIGSEGV";
    case SIGBUS:
      return "SIGBUS";
    case SIGFPE:
      return "SIGFPE";
    case SIGILL:
      return "SIGILL";
    case SIGABRT:
      return "SIGABRT";
    default:
      return "signal";
  }
}

void OnFatalSignal(int sig) {
  if (!g_written && g_path[0] != '\0') {
    g_written = 1;
    int fd = open(g_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd >= 0) {
      SafeWrite(fd, "{\"message\": {\"message\": \"Signal ");
      SafeWrite(fd, SignalName(sig));
      SafeWrite(fd, " (");
      SafeWriteNumber(fd, sig);
      SafeWrite(fd, ") received by PID ");
      SafeWriteNumber(fd, getpid());
      SafeWrite(fd,
                "\", \"extraInfo\": {\"py_callstack\": \"\", \"timestamp\": "
                "\"");
      SafeWriteNumber(fd, static_cast<long long>(time(nullptr)));
      SafeWrite(fd, "\"}}}\n");
      close(fd);
    }
  }
  // Die as the signal would have made us: the agent decodes it.
  signal(sig, SIG_DFL);
  raise(sig);
}

}  // namespace

std::string ErrorFileJson(const std::string& message, long long unix_seconds) {
  std::string quoted;
  common::AppendJsonString(quoted, message);
  return absl::StrFormat(
      "{\"message\": {\"message\": %s, \"extraInfo\": {\"py_callstack\": "
      "\"\", \"timestamp\": \"%d\"}}}\n",
      quoted, unix_seconds);
}

absl::Status WriteErrorFile(const std::string& path,
                            const std::string& message) {
  if (path.empty()) return absl::OkStatus();
  std::string json =
      ErrorFileJson(message, static_cast<long long>(time(nullptr)));
  int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    return absl::PermissionDeniedError(absl::StrFormat(
        "cannot write the error file %s: %s", path, strerror(errno)));
  }
  SafeWrite(fd, json.c_str());
  close(fd);
  return absl::OkStatus();
}

void InstallErrorFileHandlers(const std::string& path) {
  if (path.size() >= sizeof(g_path)) return;
  memcpy(g_path, path.c_str(), path.size() + 1);
  std::set_terminate(&OnTerminate);
  struct sigaction action;
  memset(&action, 0, sizeof(action));
  action.sa_handler = &OnFatalSignal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESETHAND;
  for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT}) {
    sigaction(sig, &action, nullptr);
  }
}

int RunWorkerMain(const std::string& program,
                  const std::function<absl::Status()>& body) {
  std::string error_file = ReadErrorFilePath();
  if (!error_file.empty()) InstallErrorFileHandlers(error_file);
  absl::Status status = body();
  if (status.ok()) return 0;
  if (g_path[0] != '\0') {
    // The newest path: after an in-place recovery (worker/recovery.h), the
    // round's, not the one the process started with.
    error_file = g_path;
  } else if (error_file.empty()) {
    // A prewarmed worker learns its error file in the body (AwaitActivation).
    error_file = ReadErrorFilePath();
  }
  std::string message = std::string(status.message());
  std::cerr << program << ": error: " << message << std::endl;
  (void)WriteErrorFile(
      error_file,
      absl::StrCat(absl::StatusCodeToString(status.code()), ": ", message));
  g_written = 1;
  return 1;
}

}  // namespace ddprun::worker
