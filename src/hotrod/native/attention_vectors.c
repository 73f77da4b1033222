/* Encoder attention's products without tiles (see attention_vectors.h): 8 rows by 32 columns a step, the 16 sums in
 * registers through the whole depth, each row's value at a depth broadcast against 32 packed columns. Each row's
 * sums are the same whatever rows go with it. */
#include <string.h>

#include "attention_vectors.h"
#include "dots.h"
#include "lanes.h"
#include "transpose.h"

/* sums[r][0..32) = rows r < count of `a` (a row stride on) times 32 packed columns `w` ([depth][32]) over `steps`
 * steps of 4 depths. Made one function per count (dots.h). */
static inline __attribute__((always_inline)) void fma_rows(const float* a, int64_t stride, const float* w,
                                                          int64_t steps, const int count, float* sums) {
  __m512 acc[HOTROD_DOT_ROWS][2];
  for (int r = 0; r < count; r++) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
  for (int64_t step = 0; step < steps; step++, a += 4, w += 4 * 32) {
#pragma GCC unroll 4 /* constant offsets: the core's ports go to the products, not to addresses */
    for (int d = 0; d < 4; d++) {
      const __m512 low = _mm512_loadu_ps(w + d * 32), high = _mm512_loadu_ps(w + d * 32 + 16);
      for (int r = 0; r < count; r++) {
        const __m512 x = _mm512_set1_ps(a[r * stride + d]);
        acc[r][0] = _mm512_fmadd_ps(x, low, acc[r][0]);
        acc[r][1] = _mm512_fmadd_ps(x, high, acc[r][1]);
      }
    }
  }
  for (int r = 0; r < count; r++)
    for (int h = 0; h < 2; h++) _mm512_store_ps(sums + r * 32 + h * 16, acc[r][h]);
}

HOTROD_DOTS(fma_rows, float, float, float)

int hotrod_attention_vectors_ready(void) { return hotrod_has_avx512(); }

void hotrod_attention_pack_keys(const float* k, int64_t width, int64_t seq_k, int64_t padded_k, int64_t head_size,
                                int64_t depth, float* packed) {
  for (int64_t key = 0; key < padded_k; key += 16)
    for (int64_t d = 0; d < depth; d += 16) {
      __m512i rows[16];
      for (int64_t j = 0; j < 16; j++)
        rows[j] = key + j < seq_k ? _mm512_castps_si512(hotrod_round_bf16(
                                        _mm512_maskz_loadu_ps(hotrod_first(head_size - d), k + (key + j) * width + d)))
                                  : _mm512_setzero_si512();
      hotrod_transpose16(rows); /* row i: depth d + i of the 16 keys */
      float* to = packed + ((key / 32) * depth + d) * 32 + key % 32;
      for (int i = 0; i < 16; i++) _mm512_storeu_si512(to + i * 32, rows[i]);
    }
}

void hotrod_attention_pack_values(const float* v, int64_t width, int64_t seq_k, int64_t padded_k, int64_t head_size,
                                  int64_t depth, float* packed) {
  for (int64_t column = 0; column < depth; column += 32)
    for (int64_t key = 0; key < padded_k; key++) {
      float* to = packed + (column / 32 * padded_k + key) * 32;
      for (int h = 0; h < 2; h++) {
        const __mmask16 m = key < seq_k ? hotrod_first(head_size - column - h * 16) : 0;
        _mm512_storeu_ps(to + h * 16, hotrod_round_bf16(_mm512_maskz_loadu_ps(m, v + key * width + column + h * 16)));
      }
    }
}

void hotrod_attention_queries(const float* q, int64_t width, int64_t rows, int64_t head_size, int64_t depth,
                              float* queries) {
  for (int64_t r = 0; r < 32; r++)
    for (int64_t d = 0; d < depth; d += 16) {
      const __mmask16 m = r < rows ? hotrod_first(head_size - d) : 0;
      _mm512_storeu_ps(queries + r * depth + d, hotrod_round_bf16(_mm512_maskz_loadu_ps(m, q + r * width + d)));
    }
}

void hotrod_attention_scores(const float* queries, const float* keys, int64_t rows, int64_t seq_k, int64_t padded_k,
                             int64_t depth, float* scores) {
  float sums[HOTROD_DOT_ROWS * 32] __attribute__((aligned(64)));
  for (int64_t row = 0; row < rows; row += HOTROD_DOT_ROWS) {
    const int64_t count = rows - row < HOTROD_DOT_ROWS ? rows - row : HOTROD_DOT_ROWS;
    for (int64_t key = 0; key < seq_k; key += 32) {
      DOTS[count - 1](queries + row * depth, depth, keys + key * depth, depth / 4, sums);
      for (int64_t r = 0; r < count; r++)
        memcpy(scores + (row + r) * padded_k + key, sums + r * 32, sizeof(float) * 32);
    }
  }
}

void hotrod_attention_weigh(const float* numerators, const float* values, int64_t rows, int64_t padded_k,
                            int64_t head_size, int64_t depth, float* sums) {
  float block[HOTROD_DOT_ROWS * 32] __attribute__((aligned(64)));
  for (int64_t row = 0; row < rows; row += HOTROD_DOT_ROWS) {
    const int64_t count = rows - row < HOTROD_DOT_ROWS ? rows - row : HOTROD_DOT_ROWS;
    for (int64_t column = 0; column < head_size; column += 32) {
      DOTS[count - 1](numerators + row * padded_k, padded_k, values + column * padded_k, padded_k / 4, block);
      for (int64_t r = 0; r < count; r++) memcpy(sums + (row + r) * depth + column, block + r * 32, sizeof(float) * 32);
    }
  }
}
