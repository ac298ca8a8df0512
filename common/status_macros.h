#pragma once

#include <utility>

#include "absl/status/status.h"

// The project's one pair of status macros (absl has none in its public API).

// Returns the absl::Status of `expr` from the enclosing function unless it
// is OK.
#define DDPRUN_RETURN_IF_ERROR(expr)                                \
  do {                                                              \
    if (absl::Status ddprun_status_ = (expr); !ddprun_status_.ok()) \
      return ddprun_status_;                                        \
  } while (0)

// Evaluates `expr` (an absl::StatusOr<T>); returns its status unless it is
// OK, else assigns its value to `lhs`, an lvalue or a declaration
// (`auto x`).
#define DDPRUN_ASSIGN_OR_RETURN(lhs, expr) \
  DDPRUN_ASSIGN_OR_RETURN_IMPL_(           \
      DDPRUN_STATUS_CONCAT_(ddprun_statusor_, __LINE__), lhs, expr)

#define DDPRUN_STATUS_CONCAT_INNER_(a, b) a##b
#define DDPRUN_STATUS_CONCAT_(a, b) DDPRUN_STATUS_CONCAT_INNER_(a, b)
#define DDPRUN_ASSIGN_OR_RETURN_IMPL_(result, lhs, expr) \
  auto result = (expr);                                  \
  if (!result.ok()) return std::move(result).status();   \
  lhs = *std::move(result)
