#include "tests/testing/temp_dir.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace ddprun::testing {

TempDir::TempDir() {
  const char* base = std::getenv("TMPDIR");
  std::string pattern =
      std::string(base != nullptr && *base != '\0' ? base : "/tmp") +
      "/ddprun-test-XXXXXX";
  if (mkdtemp(pattern.data()) == nullptr) {
    throw std::runtime_error("mkdtemp failed for " + pattern);
  }
  path_ = pattern;
}

TempDir::~TempDir() {
  std::error_code ignored;
  std::filesystem::remove_all(path_, ignored);
}

std::string ReadFileOrEmpty(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

std::string BinaryPath(const std::string& relative) {
  return std::string(DDPRUN_BINARY_DIR) + "/" + relative;
}

std::string SourcePath(const std::string& relative) {
  return std::string(DDPRUN_SOURCE_DIR) + "/" + relative;
}

std::string MnistDir() {
  const char* dir = std::getenv("DDPRUN_MNIST_DIR");
  if (dir != nullptr && *dir != '\0') return dir;
  return SourcePath("data/mnist");
}

std::string Ddprun() { return BinaryPath("launcher/ddprun"); }
std::string Mnist() { return BinaryPath("mnist/ddprun-mnist"); }
std::string FaultWorker() { return BinaryPath("tests/launcher/fault_worker"); }

std::vector<std::string> Concat(std::vector<std::string> a,
                                const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

}  // namespace ddprun::testing
