/* The AVX-512 VNNI unit's own int8 rate on one core, the floor the int8 products without tiles are measured against,
 * beside the product kernel's own step and two other ways to feed the unit.
 *
 * Four loops of VPDPBUSD (64 uint8 x int8 multiply-adds into 16 int32 sums an instruction):
 *   "registers": 24 independent sums, operands in registers (the unit alone: the library's hotrod_vnni_unit_ops,
 *                which the bench's floor takes, src/hotrod/native/unit_rate.c);
 *   "8 x 32": the product kernel's step without tiles (i8gemm.c's dot_rows at 8 rows): per 4 depths, two
 *             lines of weights loaded and each of 8 rows' 4 bytes broadcast once for both, 16 sums;
 *   "8 x 32 embedded": the same with each row's 4 bytes read by the instruction itself ({1to16}), which needs
 *             the rows as the signed operand and the weights as the unsigned one;
 *   "6 x 64": 6 rows by 4 lines of weights, 24 sums: fewer loads an instruction (10 per 24, against 10 per 16).
 * The loads cycle through 8 KB of rows and 16 KB of weights (L1). Run one process per core at once to see whether
 * the vCPUs are cores of their own. Build and run (a CPU with AVX-512 VNNI):
 *     cc -O2 -Isrc/hotrod/native -mavx512f -mavx512vnni -o /tmp/vnni_rate benchmarks/vnni_rate.c \
 *         src/hotrod/native/unit_rate.c && /tmp/vnni_rate
 */
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "unit_rate.h"

#define STEPS 20000000L

static uint8_t rows[8 * 1024] __attribute__((aligned(64)));
static int8_t weights[16 * 1024] __attribute__((aligned(64)));

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int32_t fold(const __m512i* sums, int count) { /* the sums are read: the loops are not dead code */
  __m512i all = _mm512_setzero_si512();
  for (int i = 0; i < count; i++) all = _mm512_add_epi32(all, sums[i]);
  return _mm512_reduce_add_epi32(all);
}

/* Multiply-adds a second: `count` rows by `lines` lines of 16 weight columns, per 4 depths; `embedded`: each row's
 * bytes read by the instruction ({1to16}) rather than broadcast once for every line. */
static inline __attribute__((always_inline)) double step_rate(int count, int lines, int embedded, int32_t* check) {
  __m512i s[24];
  for (int i = 0; i < count * lines; i++) s[i] = _mm512_setzero_si512();
  const double start = now();
  for (long i = 0; i < STEPS / 16; i++) {
    const uint8_t* a = rows + (i & 15) * 512;
    const int8_t* w = weights + (i & 3) * 4096;
#pragma GCC unroll 16
    for (int quad = 0; quad < 16; quad++) {
      __m512i wl[4];
#pragma GCC unroll 4
      for (int l = 0; l < lines; l++) wl[l] = _mm512_load_si512(w + l * 1024 + quad * 64);
#pragma GCC unroll 8
      for (int r = 0; r < count; r++) {
        int32_t bytes;
        memcpy(&bytes, a + r * 64 + quad * 4, 4);
        const __m512i x = _mm512_set1_epi32(bytes);
#pragma GCC unroll 4
        for (int l = 0; l < lines; l++) {
          if (embedded) /* the weights as the unsigned operand, the row's bytes as the signed one, from memory */
            __asm__("vpdpbusd %1%{1to16%}, %2, %0" : "+v"(s[r * lines + l]) : "m"(*(const int32_t*)(a + r * 64 + quad * 4)),
                    "v"(wl[l]));
          else
            s[r * lines + l] = _mm512_dpbusd_epi32(s[r * lines + l], x, wl[l]);
        }
      }
    }
  }
  const double seconds = now() - start;
  *check += fold(s, count * lines);
  return (STEPS / 16) * 16.0 * count * lines * 64.0 / seconds;
}

int main(void) {
  for (size_t i = 0; i < sizeof rows; i++) rows[i] = (uint8_t)(i * 7);
  for (size_t i = 0; i < sizeof weights; i++) weights[i] = (int8_t)(i * 13);
  int32_t check = 0;
  printf("T int8 operations a second (2 a multiply-add), one thread:\n");
  for (int round = 0; round < 3; round++) {
    const double regs = hotrod_vnni_unit_ops(STEPS) / 2, kernel = step_rate(8, 2, 0, &check);
    const double embedded = step_rate(8, 2, 1, &check), wide = step_rate(6, 4, 0, &check);
    printf("round %d: registers %.3f  8 x 32 %.3f  8 x 32 embedded %.3f  6 x 64 %.3f\n", round, 2e-12 * regs,
           2e-12 * kernel, 2e-12 * embedded, 2e-12 * wide);
  }
  return check == 42 ? 1 : 0;
}
