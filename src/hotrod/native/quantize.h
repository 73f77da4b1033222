/* uint8 quantization with one scale and zero point, to the bit as onnxruntime's QuantizeLinear computes it
 * (MLAS's kernel), for the ops that quantize their own output for the next product (int8-static graphs): the
 * value divided by the scale, clamped to [-zero point, 255 - zero point] (a NaN quotient to the lower bound:
 * MAXPS answers its second operand, as MLAS's clamp does), rounded to nearest even, the zero point added. The
 * tests compare with onnxruntime's QuantizeLinear over every range of float32 and every half-way quotient.
 */
#pragma once
#include <immintrin.h>
#include <math.h>
#include <stdint.h>

#define HOTROD_QUANTIZE __attribute__((target("avx512f,avx512bw"))) static inline

/* 16 values' quotients by the scale, clamped, before their rounding (gelu_static.h checks them there). */
HOTROD_QUANTIZE __m512 hotrod_quotient_static16(__m512 v, float scale, int32_t zero_point) {
  v = _mm512_div_ps(v, _mm512_set1_ps(scale));
  v = _mm512_max_ps(v, _mm512_set1_ps((float)-zero_point));
  return _mm512_min_ps(v, _mm512_set1_ps((float)(255 - zero_point)));
}

/* 16 values at once, `mask`'s lanes stored. */
HOTROD_QUANTIZE void hotrod_quantize_static16(__m512 v, float scale, int32_t zero_point, __mmask16 mask, uint8_t* q) {
  v = hotrod_quotient_static16(v, scale, zero_point);
  const __m512i n = _mm512_add_epi32(_mm512_cvt_roundps_epi32(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC),
                                     _mm512_set1_epi32(zero_point));
  _mm512_mask_cvtepi32_storeu_epi8(q, mask, n);
}

/* One value the same way, where the CPU lacks AVX-512. */
static inline uint8_t hotrod_quantize_static1(float x, float scale, int32_t zero_point) {
  float v = x / scale;
  v = v > (float)-zero_point ? v : (float)-zero_point; /* a NaN to the lower bound */
  v = v < (float)(255 - zero_point) ? v : (float)(255 - zero_point);
  return (uint8_t)((int32_t)nearbyintf(v) + zero_point);
}
