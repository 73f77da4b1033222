/* The AVX-512 product kernels' row counts (i8gemm.c, bf16gemm.c): an always-inlined `kernel(a, stride, w, steps,
 * count, sums)` made into one function per count of rows, 1 to 8, and the table DOTS of them, indexed by count - 1.
 * Each count its own code: the sums stay in registers (inlined into a caller, gcc's registers go to the caller's
 * values and the sums spill). */
#pragma once
#include <stdint.h>

#define HOTROD_DOT_ROWS 8 /* the most rows a step */

/* Whether this CPU has the AVX-512 the kernels' paths without tiles build on (F, BW, VL), beside each one's own
 * extension. */
static inline int hotrod_has_avx512(void) {
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
}

#define HOTROD_DOT(kernel, A, W, S, count)                                                                   \
  static __attribute__((noinline)) void dot##count(const A* a, int64_t stride, const W* w, int64_t steps,    \
                                                   S* sums) {                                                \
    kernel(a, stride, w, steps, count, sums);                                                                \
  }

#define HOTROD_DOTS(kernel, A, W, S)                                                                         \
  HOTROD_DOT(kernel, A, W, S, 1) HOTROD_DOT(kernel, A, W, S, 2) HOTROD_DOT(kernel, A, W, S, 3)              \
  HOTROD_DOT(kernel, A, W, S, 4) HOTROD_DOT(kernel, A, W, S, 5) HOTROD_DOT(kernel, A, W, S, 6)              \
  HOTROD_DOT(kernel, A, W, S, 7) HOTROD_DOT(kernel, A, W, S, 8)                                              \
  static void (*const DOTS[HOTROD_DOT_ROWS])(const A*, int64_t, const W*, int64_t, S*) = {                  \
      dot1, dot2, dot3, dot4, dot5, dot6, dot7, dot8};
