/* The mask of a 16-float vector's first lanes, for the tails the attention and bf16 kernels load and store. */
#pragma once
#include <immintrin.h>
#include <stdint.h>

/* The first `count` of 16 lanes (none for count <= 0). */
static inline __mmask16 hotrod_first(int64_t count) {
  return count >= 16 ? (__mmask16)0xFFFF : count <= 0 ? 0 : (__mmask16)((1u << count) - 1);
}

/* The first `count` of 16 floats at p (zeros after them), with no load at all for count <= 0: a load whose lanes
 * are all masked off reads nothing, yet where the int8 attention read heads of 32 floats 64 at a time, leaving
 * those loads out took a third off its time on a Zen 5 (benchmarks/README.md). */
static inline __m512 hotrod_load_first(int64_t count, const float* p) {
  return count > 0 ? _mm512_maskz_loadu_ps(hotrod_first(count), p) : _mm512_setzero_ps();
}
