// BS_CHECK: internal invariants (programming errors), never user input. Aborts with a message.
#pragma once

#include <cstdio>
#include <cstdlib>

#define BS_CHECK(cond)                                                                            \
  do {                                                                                            \
    if (!(cond)) {                                                                                \
      std::fprintf(stderr, "blockspec: internal check failed at %s:%d: %s\n", __FILE__, __LINE__, \
                   #cond);                                                                        \
      std::abort();                                                                               \
    }                                                                                             \
  } while (0)
