/* The mask of a 16-float vector's first lanes, for the tails the attention and bf16 kernels load and store. */
#pragma once
#include <immintrin.h>
#include <stdint.h>

/* The first `count` of 16 lanes (none for count <= 0). */
static inline __mmask16 hotrod_first(int64_t count) {
  return count >= 16 ? (__mmask16)0xFFFF : count <= 0 ? 0 : (__mmask16)((1u << count) - 1);
}
