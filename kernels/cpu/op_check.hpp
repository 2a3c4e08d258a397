// Fail-fast checks for the CPU reference ops: a broken shape or index invariant is a bug in
// the caller, so it stops the process with file:line instead of returning an error.
#pragma once

#include <cstdio>
#include <cstdlib>

/// Aborts with file:line and `what` when `cond` is false. Always on (also in release builds).
#define CEDAR_OP_CHECK(cond, what)                                                    \
  do {                                                                                \
    if (!(cond)) {                                                                    \
      std::fprintf(stderr, "%s:%d: check failed: %s (%s)\n", __FILE__, __LINE__, #cond, \
                   what);                                                             \
      std::abort();                                                                   \
    }                                                                                 \
  } while (0)
