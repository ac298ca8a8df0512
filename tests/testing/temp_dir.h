#pragma once

#include <string>

namespace ddprun::testing {

// A fresh directory under $TMPDIR (or /tmp), removed with its contents when
// the object goes away.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }
  std::string File(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// Reads a whole file; empty when it cannot be read.
std::string ReadFileOrEmpty(const std::string& path);

// The project's build and source folders, and the MNIST data folder the
// setup script fills (DDPRUN_MNIST_DIR overrides it).
std::string BinaryPath(const std::string& relative);
std::string SourcePath(const std::string& relative);
std::string MnistDir();

}  // namespace ddprun::testing
