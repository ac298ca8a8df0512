#ifndef DDPRUN_TESTS_TESTING_CI_H_
#define DDPRUN_TESTS_TESTING_CI_H_

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>

namespace ddprun::testing {

// True under CI=true, where CI must have what every test needs: there a
// missing prerequisite is a failure, never a skip.
inline bool UnderCi() {
  const char* ci = std::getenv("CI");
  return ci != nullptr && std::strcmp(ci, "true") == 0;
}

}  // namespace ddprun::testing

// Skips the test with MESSAGE (a std::string or string literal), or fails it
// under CI=true. Use it in a TEST body, in place of GTEST_SKIP().
#define DDPRUN_SKIP_UNLESS_CI(message)                                \
  do {                                                                \
    if (::ddprun::testing::UnderCi()) {                               \
      GTEST_FAIL() << (message) << " (CI=true: a skip is a failure)"; \
    }                                                                 \
    GTEST_SKIP() << (message);                                        \
  } while (false)

#endif  // DDPRUN_TESTS_TESTING_CI_H_
