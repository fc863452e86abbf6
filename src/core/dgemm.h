// Double-precision GEMM for host-side load-time linear algebra (the FlashMap fold's eigensolver):
// packed, cache-blocked, an AVX2+FMA micro-kernel where the CPU has one, multi-threaded over a
// bs::ThreadPool. Not a BLAS: only what the eigensolver needs.
#pragma once

#include <cstdint>

#include "core/thread_pool.h"

namespace bs {

// A strided read-only matrix view: element (i, j) is p[i * rs + j * cs] (so a transpose is a view
// with rs and cs swapped).
struct DView {
  const double* p;
  int64_t rs, cs;
};

// C = beta * C + alpha * A B with A [m, k], B [k, n], C [m, n] at c[i * rs_c + j * cs_c]; C is not
// read when beta == 0. upper: only C's blocks that meet the upper triangle (j >= i) are computed
// (those blocks are written whole, a few entries below the diagonal included). Every entry of C is
// summed in the same order whatever the pool size, so the result does not depend on the number of
// threads (it may differ in the last bits between CPUs with and without FMA). pool may be null.
void dgemm(int64_t m, int64_t n, int64_t k, double alpha, DView a, DView b, double beta, double* c,
           int64_t rs_c, int64_t cs_c, ThreadPool* pool, bool upper = false);

// pool->parallel_for(n, min_chunk, fn), or fn(0, n) on the calling thread when pool is null.
template <class Fn>
void parallel_for(ThreadPool* pool, int64_t n, int64_t min_chunk, const Fn& fn) {
  if (pool == nullptr) {
    if (n > 0) fn(int64_t{0}, n);
    return;
  }
  pool->parallel_for(n, min_chunk, fn);
}

}  // namespace bs
