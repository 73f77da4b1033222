/* Encoder attention's products without tiles (see attention_vectors.h): 8 rows by 32 columns a step, the 16 sums in
 * registers through the whole depth, each row's value at a depth broadcast against 32 packed columns. Each row's
 * sums are the same whatever rows go with it. */
#include "attention_vectors.h"
#include "dots.h" /* HOTROD_DOT_ROWS, hotrod_has_avx512 */
#include "lanes.h"
#include "transpose.h"

/* out[r * out_stride + 0..32) = rows r < count of `a` (a row stride on) times 32 packed columns `w` ([depth][32])
 * over `steps` steps of 4 depths: stored where they go, not through a buffer (a second write of every sum). */
static inline __attribute__((always_inline)) void fma_rows(const float* a, int64_t stride, const float* w,
                                                          int64_t steps, const int count, float* out,
                                                          int64_t out_stride) {
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
    for (int h = 0; h < 2; h++) _mm512_storeu_ps(out + r * out_stride + h * 16, acc[r][h]);
}

/* One function per count of rows (as dots.h makes them for the products: each count's sums stay in registers). */
#define FMA_ROWS(count)                                                                                        \
  static __attribute__((noinline)) void fma##count(const float* a, int64_t stride, const float* w, int64_t steps, \
                                                   float* out, int64_t out_stride) {                          \
    fma_rows(a, stride, w, steps, count, out, out_stride);                                                     \
  }
FMA_ROWS(1) FMA_ROWS(2) FMA_ROWS(3) FMA_ROWS(4) FMA_ROWS(5) FMA_ROWS(6) FMA_ROWS(7) FMA_ROWS(8)
static void (*const FMAS[HOTROD_DOT_ROWS])(const float*, int64_t, const float*, int64_t, float*, int64_t) = {
    fma1, fma2, fma3, fma4, fma5, fma6, fma7, fma8};

int hotrod_attention_vectors_ready(void) { return hotrod_has_avx512(); }

void hotrod_attention_pack_keys(const float* k, int64_t width, int64_t seq_k, int64_t padded_k, int64_t head_size,
                                int64_t depth, float* packed) {
  for (int64_t key = 0; key < padded_k; key += 16)
    for (int64_t d = 0; d < depth; d += 16) {
      __m512i rows[16];
      for (int64_t j = 0; j < 16; j++)
        rows[j] = key + j < seq_k ? _mm512_castps_si512(hotrod_round_bf16(
                                        hotrod_load_first(head_size - d, k + (key + j) * width + d)))
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
        const int64_t count = key < seq_k ? head_size - column - h * 16 : 0;
        _mm512_storeu_ps(to + h * 16, hotrod_round_bf16(hotrod_load_first(count, v + key * width + column + h * 16)));
      }
    }
}

void hotrod_attention_queries(const float* q, int64_t width, int64_t rows, int64_t head_size, int64_t depth,
                              float* queries) {
  for (int64_t r = 0; r < 32; r++)
    for (int64_t d = 0; d < depth; d += 16) {
      const int64_t count = r < rows ? head_size - d : 0;
      _mm512_storeu_ps(queries + r * depth + d, hotrod_round_bf16(hotrod_load_first(count, q + r * width + d)));
    }
}

void hotrod_attention_scores(const float* queries, const float* keys, int64_t rows, int64_t seq_k, int64_t padded_k,
                             int64_t depth, float* scores) {
  for (int64_t row = 0; row < rows; row += HOTROD_DOT_ROWS) {
    const int64_t count = rows - row < HOTROD_DOT_ROWS ? rows - row : HOTROD_DOT_ROWS;
    for (int64_t key = 0; key < seq_k; key += 32)
      FMAS[count - 1](queries + row * depth, depth, keys + key * depth, depth / 4, scores + row * padded_k + key,
                      padded_k);
  }
}

void hotrod_attention_weigh(const float* numerators, const float* values, int64_t rows, int64_t padded_k,
                            int64_t head_size, int64_t depth, float* sums) {
  for (int64_t row = 0; row < rows; row += HOTROD_DOT_ROWS) {
    const int64_t count = rows - row < HOTROD_DOT_ROWS ? rows - row : HOTROD_DOT_ROWS;
    for (int64_t column = 0; column < head_size; column += 32)
      FMAS[count - 1](numerators + row * padded_k, padded_k, values + column * padded_k, padded_k / 4,
                      sums + row * depth + column, depth);
  }
}
