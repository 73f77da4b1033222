/* LayerNormalization with onnxruntime's own arithmetic, several rows at a time; the kernel behind hotrod's
 * LayerNorm and LayerNormRows ops.
 *
 * onnxruntime's CPU LayerNormalization (its AVX2 code, the one it runs on CPUs with AVX2, those with AVX-512
 * included) computes a row of k values as:
 *     mean  = (float)(sum / (double)k), sum in double over four lanes (lane j adds x[4i + j] in order), the lanes
 *             then added as (l0 + l2) + (l1 + l3);
 *     var   = sum of fma(d, d, .) over eight float lanes, d = x - mean (lane j takes x[8i + j] in order), the lanes
 *             then added as ((v0 + v4) + (v2 + v6)) + ((v1 + v5) + (v3 + v7)); var / (float)k + epsilon;
 *     inv   = 1 / sqrt(var);
 *     y     = fma((x - mean) * inv, gamma, beta).
 * Each of its rows is two chains of additions, each waiting on the last (a few cycles each): a row at a time,
 * the core idles most of the while. Here the same chains, in the same order, run for GROUP rows side by side,
 * so the core issues one row's step while another's completes: the same bits, a fraction of the time. The
 * Python side uses this op only where a probe found onnxruntime's LayerNormalization giving these bits
 * (`hotrod.runtime.norm`), and only for k a multiple of 8 (onnxruntime's tails take other paths).
 *
 * LayerNormRows also quantizes each row of y for the next product as QuantizeRows does (rows.c), while the row
 * is in the cache; on AVX-512 the pass that makes y also finds its largest |y|, which the quantization needs.
 * LayerNormQuantized quantizes y with one scale and zero point (quantize.h); on AVX-512 in the same pass.
 * LayerNormRounded rounds each row of y to bf16 for the next bf16 product (bf16gemm.h), while the row is in the
 * cache.
 * Rows are independent: a row's values are the same alone and in any batch.
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>

#include "bf16gemm.h"
#include "norm.h"
#include "quantize.h"
#include "rows.h"

#define GROUP 8 /* rows whose chains run side by side (measured: 8 beside 4 and 2) */

/* Each row's mean and 1 / sqrt(var + epsilon), for `count` rows (`x[g]`, `k` values each): GROUP, or for a last
 * short group, the fewer rows it has (each count its own code: the sums stay in registers). */
static inline __attribute__((always_inline)) void statistics(const float* const* x, const int count, int64_t k,
                                                           float epsilon, float* mean, float* inv) {
  __m256d sums[GROUP];
  for (int g = 0; g < count; g++) sums[g] = _mm256_setzero_pd();
  for (int64_t i = 0; i < k; i += 4)
    for (int g = 0; g < count; g++) sums[g] = _mm256_add_pd(sums[g], _mm256_cvtps_pd(_mm_loadu_ps(x[g] + i)));
  __m256 squares[GROUP], means[GROUP];
  for (int g = 0; g < count; g++) {
    double lanes[4];
    _mm256_storeu_pd(lanes, sums[g]);
    mean[g] = (float)(((lanes[0] + lanes[2]) + (lanes[1] + lanes[3])) / (double)k);
    means[g] = _mm256_set1_ps(mean[g]);
    squares[g] = _mm256_setzero_ps();
  }
  for (int64_t i = 0; i < k; i += 8)
    for (int g = 0; g < count; g++) {
      const __m256 d = _mm256_sub_ps(_mm256_loadu_ps(x[g] + i), means[g]);
      squares[g] = _mm256_fmadd_ps(d, d, squares[g]);
    }
  for (int g = 0; g < count; g++) {
    const __m128 half = _mm_add_ps(_mm256_castps256_ps128(squares[g]), _mm256_extractf128_ps(squares[g], 1));
    const __m128 pairs = _mm_add_ps(half, _mm_movehl_ps(half, half));
    const float var = _mm_cvtss_f32(_mm_add_ss(pairs, _mm_movehdup_ps(pairs))) / (float)k + epsilon;
    inv[g] = 1.0f / sqrtf(var);
  }
}

/* y = fma((x - mean) * inv, gamma, beta) for one row. */
static void normalize(const float* x, int64_t k, float mean, float inv, const float* gamma, const float* beta,
                      float* y) {
  const __m256 m = _mm256_set1_ps(mean), s = _mm256_set1_ps(inv);
  for (int64_t i = 0; i < k; i += 8) {
    const __m256 t = _mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(x + i), m), s);
    _mm256_storeu_ps(y + i, _mm256_fmadd_ps(t, _mm256_loadu_ps(gamma + i), _mm256_loadu_ps(beta + i)));
  }
}

#define WIDE __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq")))

/* normalize on AVX-512 where the CPU has it, 16 values a step: each value's arithmetic is normalize's, so the
 * same y. It also gives the row's largest |y| (NaN where y holds one), so that the quantization after it does
 * not read y again to find it, and quantizes y with one scale and zero point into `fixed` (NULL: not). */
WIDE static float normalize_wide(const float* x, int64_t k, float mean, float inv, const float* gamma,
                                 const float* beta, float* y, uint8_t* fixed, float scale, int32_t zero_point) {
  const __m512 m = _mm512_set1_ps(mean), s = _mm512_set1_ps(inv);
  __m512 top = _mm512_setzero_ps();
  __mmask16 nan = 0;
  for (int64_t i = 0; i < k; i += 16) {
    const __mmask16 lanes = k - i >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (k - i)) - 1);
    const __m512 t = _mm512_mul_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(lanes, x + i), m), s);
    const __m512 g = _mm512_maskz_loadu_ps(lanes, gamma + i), b = _mm512_maskz_loadu_ps(lanes, beta + i);
    const __m512 v = _mm512_fmadd_ps(t, g, b);
    _mm512_mask_storeu_ps(y + i, lanes, v);
    if (fixed != NULL) hotrod_quantize_static16(v, scale, zero_point, lanes, fixed + i);
    top = _mm512_mask_max_ps(top, lanes, top, _mm512_abs_ps(v));
    nan |= _mm512_mask_cmp_ps_mask(lanes, v, v, _CMP_UNORD_Q);
  }
  return nan ? __builtin_nanf("") : _mm512_reduce_max_ps(top);
}

static void group_statistics(const float* const* x, int count, int64_t k, float epsilon, float* mean, float* inv) {
  switch (count) {
    case GROUP: statistics(x, GROUP, k, epsilon, mean, inv); break;
    case 4: statistics(x, 4, k, epsilon, mean, inv); break;
    case 2: statistics(x, 2, k, epsilon, mean, inv); break;
    default: statistics(x, 1, k, epsilon, mean, inv); break;
  }
}

void hotrod_layer_norm(const float* x, int64_t rows, int64_t k, const float* gamma, const float* beta,
                       float epsilon, float* y, uint8_t* q, float* scales, const hotrod_norm_fixed* fixed) {
  const int wide = hotrod_rows_wide();
  for (int64_t first = 0; first < rows;) {
    const int64_t left = rows - first;
    const int count = left >= GROUP ? GROUP : left >= 4 ? 4 : left >= 2 ? 2 : 1;  /* a decoding step's one row alone */
    const float* group[GROUP];
    float mean[GROUP], inv[GROUP];
    for (int g = 0; g < count; g++) group[g] = x + (first + g) * k;
    group_statistics(group, count, k, epsilon, mean, inv);
    for (int g = 0; g < count; g++) {
      const int64_t r = first + g;
      uint8_t* fixed_row = fixed == NULL || fixed->q == NULL ? NULL : fixed->q + r * k;
      if (wide) {
        const float scale = fixed_row == NULL ? 1.0f : fixed->scale;
        const int32_t zero_point = fixed_row == NULL ? 0 : fixed->zero_point;
        const float top = normalize_wide(group[g], k, mean[g], inv[g], gamma, beta, y + r * k, fixed_row, scale,
                                         zero_point);
        if (q != NULL) hotrod_quantize_row_known(y + r * k, k, top, q + r * k, scales + r);
      } else {
        normalize(group[g], k, mean[g], inv[g], gamma, beta, y + r * k);
        if (q != NULL) hotrod_quantize_rows(y + r * k, 1, k, q + r * k, scales + r);
        if (fixed_row != NULL) hotrod_quantize_static(y + r * k, k, fixed->scale, fixed->zero_point, fixed_row);
      }
      if (fixed != NULL && fixed->rounded != NULL) /* while the row is in the cache */
        hotrod_round_row(y + r * k, k, fixed->rounded + r * k);
    }
    first += count;
  }
}
