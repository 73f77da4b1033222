/* The AVX-512 VNNI unit's own int8 rate (unit_rate.h). The bench's floor took the int8 rate from a product
 * kernel at 2048^3, which the same kernel beats inside a model on some CPUs (the floor then read 0.8x): a floor
 * must be what the hardware allows, so this runs the instruction alone, 24 sums deep (more than its latency
 * times its issue rate on the CPUs measured), with nothing else to wait on. benchmarks/vnni_rate.c times the
 * product kernel's own step beside it. */
#include <immintrin.h>
#include <time.h>

#include "unit_rate.h"

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Written out in assembly: gcc spills an array of 24 sums around a loop this short. Built for AVX-512 alone, and
 * called only where the CPU has it: the library loads on CPUs with AVX2 only, where an AVX-512 instruction that the
 * compiler placed ahead of the check would fault. */
#define DP(i) "vpdpbusd %%zmm25, %%zmm24, %%zmm" #i "\n\t"

__attribute__((target("avx512f,avx512vnni"), noinline)) static double unit_seconds(int64_t steps) {
  const __m512i a = _mm512_set1_epi32(0x01020304), b = _mm512_set1_epi32(0x05060708);
  const double start = now();
  __asm__ volatile("vmovdqa64 %0, %%zmm24\n\tvmovdqa64 %1, %%zmm25\n\tmov %2, %%rax\n"
                   "1:\n\t" DP(0) DP(1) DP(2) DP(3) DP(4) DP(5) DP(6) DP(7) DP(8) DP(9) DP(10) DP(11) DP(12) DP(13)
                   DP(14) DP(15) DP(16) DP(17) DP(18) DP(19) DP(20) DP(21) DP(22) DP(23)
                   "dec %%rax\n\tjnz 1b\n\tvzeroupper"
                   :
                   : "v"(a), "v"(b), "r"(steps)
                   : "rax", "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10",
                     "xmm11", "xmm12", "xmm13", "xmm14", "xmm15", "xmm16", "xmm17", "xmm18", "xmm19", "xmm20",
                     "xmm21", "xmm22", "xmm23", "xmm24", "xmm25", "cc", "memory");
  return now() - start;
}

double hotrod_vnni_unit_ops(int64_t steps) {
  if (steps < 1 || !__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("avx512vnni")) return -1;
  const double seconds = unit_seconds(steps);
  return seconds > 0 ? (double)steps * 24 * 64 * 2 / seconds : -1;
}
