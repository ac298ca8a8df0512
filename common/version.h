#pragma once

namespace ddprun::common {

// The project's version, "MAJOR.MINOR.PATCH", from project(VERSION) of the
// top-level CMakeLists.txt (generated version.cc): every program's
// --version.
const char* Version();

}  // namespace ddprun::common
