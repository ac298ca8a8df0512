#pragma once

#include <string>
#include <vector>

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

// The programs most tests run: ddprun, ddprun-mnist and the launcher tests'
// fault_worker, in the build folder.
std::string Ddprun();
std::string Mnist();
std::string FaultWorker();

// `a` then `b`: a command line from its parts.
std::vector<std::string> Concat(std::vector<std::string> a,
                                const std::vector<std::string>& b);

}  // namespace ddprun::testing
