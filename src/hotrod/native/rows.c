/* Per-row int8 quantization of activations in one pass, the kernel behind hotrod's QuantizeRows op.
 *
 * hotrod's dynamic int8 graphs quantize each product's input per row (`hotrod.optimize.row_scales`):
 *     scale[r] = max |x[r, :]| / 127,    q[r, k] = round_half_even(x[r, k] / scale[r]) + 128  (uint8)
 * spelled out in onnxruntime's ops as Abs, ReduceMax, Div and two QuantizeLinear: five nodes, each its own
 * pass over memory and its own dispatch, for every product's input. Here a row is read once for its maximum
 * and once more, from the cache, to quantize it. Values, divisions and rounding are those of the nodes, so
 * a graph gives the same answers either way. A row whose maximum is 0 gets the scale 0 and q = 0, as the
 * nodes' 0 / 0 saturates (the product multiplies it by that scale: exactly 0).
 *
 * Rows are independent: a row's values are the same alone and in any batch. Large inputs are split by rows
 * among onnxruntime's own threads (ort_op.c); threads of the kernel's own, started while onnxruntime's
 * workers spin on the cores, took longer to start than a [512, 1024] input takes to quantize (about 1.5 ms
 * against 0.35, measured on 2 cores).
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>

#include "quantize.h"
#include "rows.h"

#define LEVELS 127.0f
#define ZERO_POINT 128.0f

/* The row's largest |x|, or NaN where it holds one (the nodes' ReduceMax would give NaN: the row's outputs
 * must be NaN too, never a quiet number). */
static inline float row_max(const float* x, int64_t k) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  __m256 top = _mm256_setzero_ps(), nan = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= k; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    top = _mm256_max_ps(top, _mm256_andnot_ps(sign, v));
    nan = _mm256_or_ps(nan, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
  }
  float lanes[8];
  _mm256_storeu_ps(lanes, top);
  float best = 0.0f;
  int bad = _mm256_movemask_ps(nan);
  for (int j = 0; j < 8; j++) best = lanes[j] > best ? lanes[j] : best;
  for (; i < k; i++) {
    bad |= isnan(x[i]);
    best = fabsf(x[i]) > best ? fabsf(x[i]) : best;
  }
  return bad ? NAN : best;
}

/* round_half_even(x / scale) + 128, saturated to [0, 255], as QuantizeLinear computes it. */
static inline uint8_t one(float x, float scale) {
  float v = nearbyintf(x / scale) + ZERO_POINT;
  return (uint8_t)(v < 0.0f ? 0.0f : (v > 255.0f ? 255.0f : v));
}

static void quantize_row(const float* x, int64_t k, uint8_t* q, float* scale) {
  const float top = row_max(x, k);
  const float s = top / LEVELS;
  *scale = s;
  int64_t i = 0;
  if (!(s > 0.0f)) { /* an all-zero row (or NaN): 0, what the nodes' 0 / 0 (x / NaN) quantizes to */
    for (; i < k; i++) q[i] = 0;
    return;
  }
  const __m256 vs = _mm256_set1_ps(s), zero = _mm256_set1_ps(ZERO_POINT);
  const __m256 low = _mm256_setzero_ps(), high = _mm256_set1_ps(255.0f);
  for (; i + 8 <= k; i += 8) {
    __m256 v = _mm256_div_ps(_mm256_loadu_ps(x + i), vs);
    v = _mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    v = _mm256_min_ps(_mm256_max_ps(_mm256_add_ps(v, zero), low), high);
    const __m256i w = _mm256_cvtps_epi32(v);                                  /* 8 x int32 in 0..255 */
    const __m128i p = _mm_packs_epi32(_mm256_castsi256_si128(w), _mm256_extracti128_si256(w, 1));
    _mm_storel_epi64((__m128i*)(q + i), _mm_packus_epi16(p, p));
  }
  for (; i < k; i++) q[i] = one(x[i], s);
}

/* The same row on AVX-512, 16 values a step, where the CPU has it: the same maximum (order does not change
 * a maximum), the same division and rounding per value, so the same q and scale. */
#define WIDE __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq")))

WIDE static float row_max_wide(const float* x, int64_t k) {
  __m512 top = _mm512_setzero_ps();
  __mmask16 nan = 0;
  int64_t i = 0;
  for (; i + 16 <= k; i += 16) {
    const __m512 v = _mm512_loadu_ps(x + i);
    top = _mm512_max_ps(top, _mm512_abs_ps(v));
    nan |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
  }
  float best = _mm512_reduce_max_ps(top);
  int bad = nan != 0;
  for (; i < k; i++) {
    bad |= isnan(x[i]);
    best = fabsf(x[i]) > best ? fabsf(x[i]) : best;
  }
  return bad ? NAN : best;
}

/* round_half_even(x / s) for 16 values as int32, the quotient's rounding without its division where that cannot
 * differ: a division of 16 floats costs several times the rest of a value's work. y = x * (1 / s) is within
 * |q| 2^-23 of the exact quotient q = x / s (two roundings of 2^-24 each; |q| <= 127 (1 + 2^-23) here, as
 * |x| <= 127 s by the row's maximum), so within 1.6e-5; the divided float is within half an ulp of q, at most
 * 2^-18 below 128. Where y lies farther than NEAR (2^-12: twelve times that sum) from every half-integer, no
 * half-integer separates y, q and the quotient, and all three round to the same integer; the few lanes nearer
 * one (about 1 in 2,000 values) are divided. VREDUCEPS gives y's distance from its nearest integer in one step.
 * `r` is 1 / s, finite, s normal, x finite (the caller's checks). */
#define NEAR 0x1p-12f
#define NEAREST (_MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)

WIDE static inline __m512i divided_rounded(__m512 x, __m512 s, __m512 r) {
  const __m512 y = _mm512_mul_ps(x, r);
  const __m512 residue = _mm512_reduce_ps(y, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __mmask16 near = _mm512_cmp_ps_mask(_mm512_abs_ps(residue), _mm512_set1_ps(0.5f - NEAR), _CMP_GE_OQ);
  const __m512i n = _mm512_cvt_roundps_epi32(y, NEAREST);
  return near ? _mm512_mask_cvt_roundps_epi32(n, near, _mm512_maskz_div_ps(near, x, s), NEAREST) : n;
}

/* The row quantized with its largest |x| (or NaN) known already. */
WIDE static void quantize_row_known(const float* x, int64_t k, float top, uint8_t* q, float* scale) {
  const float s = top / LEVELS;
  *scale = s;
  int64_t i = 0;
  if (!(s > 0.0f)) {
    for (; i < k; i++) q[i] = 0;
    return;
  }
  const float reciprocal = 1.0f / s;
  const __m512 vs = _mm512_set1_ps(s);
  if (isnormal(s) && isfinite(reciprocal)) { /* where the bound above holds: |q| <= 127, no clipping */
    const __m512 vr = _mm512_set1_ps(reciprocal);
    const __m512i zero = _mm512_set1_epi32((int)ZERO_POINT);
    for (; i + 16 <= k; i += 16) {
      const __m512i n = divided_rounded(_mm512_loadu_ps(x + i), vs, vr);
      _mm_storeu_si128((__m128i*)(q + i), _mm512_cvtepi32_epi8(_mm512_add_epi32(n, zero)));
    }
  } else { /* a subnormal or infinite scale: divided throughout, and clipped (x / inf: NaN for an infinite x) */
    const __m512 zero = _mm512_set1_ps(ZERO_POINT), low = _mm512_setzero_ps(), high = _mm512_set1_ps(255.0f);
    for (; i + 16 <= k; i += 16) {
      __m512 v = _mm512_roundscale_ps(_mm512_div_ps(_mm512_loadu_ps(x + i), vs), NEAREST);
      v = _mm512_min_ps(_mm512_max_ps(_mm512_add_ps(v, zero), low), high);
      _mm_storeu_si128((__m128i*)(q + i), _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(v)));
    }
  }
  for (; i < k; i++) q[i] = one(x[i], s);
}

WIDE static void quantize_row_wide(const float* x, int64_t k, uint8_t* q, float* scale) {
  quantize_row_known(x, k, row_max_wide(x, k), q, scale);
}

/* Whether this CPU has the AVX-512 the wide row needs (asked once). */
static int wide_cpu(void) {
  static int wide = -1;
  if (wide < 0) {
    __builtin_cpu_init();
    wide = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  }
  return wide;
}

void hotrod_quantize_rows(const float* x, int64_t rows, int64_t k, uint8_t* q, float* scales) {
  void (*const row)(const float*, int64_t, uint8_t*, float*) = wide_cpu() ? quantize_row_wide : quantize_row;
  for (int64_t r = 0; r < rows; r++) row(x + r * k, k, q + r * k, scales + r);
}

int hotrod_rows_wide(void) { return wide_cpu(); }

void hotrod_quantize_row_known(const float* x, int64_t k, float top, uint8_t* q, float* scale) {
  if (wide_cpu())
    quantize_row_known(x, k, top, q, scale);
  else
    quantize_row(x, k, q, scale);
}

WIDE static void quantize_static_wide(const float* x, int64_t n, float scale, int32_t zero_point, uint8_t* q) {
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = n - i >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - i)) - 1);
    hotrod_quantize_static16(_mm512_maskz_loadu_ps(m, x + i), scale, zero_point, m, q + i);
  }
}

void hotrod_quantize_static(const float* x, int64_t n, float scale, int32_t zero_point, uint8_t* q) {
  if (wide_cpu()) {
    quantize_static_wide(x, n, scale, zero_point, q);
    return;
  }
  for (int64_t i = 0; i < n; i++) q[i] = hotrod_quantize_static1(x[i], scale, zero_point);
}
