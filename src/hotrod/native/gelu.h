/* GELU (erf form) on 16 floats, to the bit as onnxruntime's CPU Gelu computes it, so that a product's epilogue
 * can apply it where the graph had a Gelu node and the answers stay the same.
 *
 * onnxruntime's Gelu (ONNX's, and com.microsoft's) computes 0.5 x (1 + erf(x / sqrt 2)) as three steps: t =
 * x * (float)M_SQRT1_2; erf(t) on MLAS's vector kernel (a minimax polynomial in t^2 below |t| = 0.921875,
 * 1 - e^-p(|t|) above it, |t| clamped to 3.925, every step one fused multiply-add; the exponential by a
 * rounding constant and a degree-6 polynomial); then (0.5 x) * (erf + 1). The same operations in the same
 * order, with the same constants (or fewer that give the same bits: see hotrod_erf_big and hotrod_erf), give
 * the same bits: the kernel's tests compare against onnxruntime's own op over every range of x. A version of
 * onnxruntime that changed its erf would fail those tests, not the answers quietly. The file that includes this
 * one is built with -ffp-contract=off: only the fused multiply-adds written here are fused.
 */
#pragma once
#include <immintrin.h>
#include <stdint.h>

#define HOTROD_GELU __attribute__((target("avx512f"))) static inline

HOTROD_GELU __m512 hotrod_splat(float value) { return _mm512_set1_ps(value); }

/* Bitwise logic on floats through the integer forms (the float forms need AVX512DQ, which AVX-512F lacks). */
HOTROD_GELU __m512 hotrod_bits(__m512i v) { return _mm512_castsi512_ps(v); }
HOTROD_GELU __m512i hotrod_ints(__m512 v) { return _mm512_castps_si512(v); }

/* erf(t) where |t| < 0.921875: t + t p(t^2), p of degree 5 (|t| clamped, the sign put back by the caller). */
HOTROD_GELU __m512 hotrod_erf_small(__m512 a) {
  const __m512 s = _mm512_mul_ps(a, a);
  __m512 r = hotrod_splat(-5.99104969e-4f);
  r = _mm512_fmadd_ps(r, s, hotrod_splat(4.99339588e-3f));
  r = _mm512_fmadd_ps(r, s, hotrod_splat(-2.67667342e-2f));
  r = _mm512_fmadd_ps(r, s, hotrod_splat(1.12818025e-1f));
  r = _mm512_fmadd_ps(r, s, hotrod_splat(-3.76124859e-1f));
  r = _mm512_fmadd_ps(r, s, hotrod_splat(1.28379151e-1f));
  return _mm512_fmadd_ps(r, a, a);
}

/* erf(|t|) above the split: 1 - e^-q, q = a + a p(a), p of degree 6; e^x as 2^n e^f, n = round(x / ln 2). Two
 * steps of MLAS's are left out where they cannot change a bit: its clamp of -q at -88.38 (q stays below 18 for
 * every a up to the 3.925 clamp, the lanes under the split included, whose result is not used) and its 2^n made in
 * the exponent bits and multiplied in, which SCALEF does exactly alike (e is near 1, n an integer in [-27, 0]:
 * both products are exact). The tests compare with onnxruntime's Gelu over a sweep of every range of float32 and
 * every float around the split and the clamp (tests/runtime/test_gelu.py). */
HOTROD_GELU __m512 hotrod_erf_big(__m512 a) {
  __m512 q = hotrod_splat(1.72948930e-5f);
  q = _mm512_fmadd_ps(q, a, hotrod_splat(-3.83208680e-4f));
  q = _mm512_fmadd_ps(q, a, hotrod_splat(3.88393435e-3f));
  q = _mm512_fmadd_ps(q, a, hotrod_splat(-2.42545605e-2f));
  q = _mm512_fmadd_ps(q, a, hotrod_splat(1.06777847e-1f));
  q = _mm512_fmadd_ps(q, a, hotrod_splat(6.34846687e-1f));
  q = _mm512_fmadd_ps(q, a, hotrod_splat(1.28717512e-1f));
  q = _mm512_fmadd_ps(q, a, a);
  /* MLAS's exponential of x = -q, each step written with q (g = -f): a fused multiply-add of a negated operand
   * rounds the negated exact sum, so FNMADD(b, c, d) = FMA(-b, c, d) and FMA(b, c, -d) = -FMA(-b, c, d) */
  const __m512 round = hotrod_splat(1.25829120e+7f);
  const __m512 n = _mm512_sub_ps(_mm512_fnmadd_ps(hotrod_splat(1.44269504088896341f), q, round), round);
  __m512 g = _mm512_fmadd_ps(hotrod_splat(6.93145752e-1f), n, q);
  g = _mm512_fmadd_ps(n, hotrod_splat(1.42860677e-6f), g);
  __m512 e = hotrod_splat(1.38319808e-3f);
  e = _mm512_fnmadd_ps(e, g, hotrod_splat(8.37550033e-3f));
  e = _mm512_fnmadd_ps(e, g, hotrod_splat(4.16689515e-2f));
  e = _mm512_fnmadd_ps(e, g, hotrod_splat(1.66664466e-1f));
  e = _mm512_fnmadd_ps(e, g, hotrod_splat(4.99999851e-1f));
  e = _mm512_fnmadd_ps(e, g, hotrod_splat(1.0f));
  e = _mm512_fnmadd_ps(e, g, hotrod_splat(1.0f));
  return _mm512_sub_ps(hotrod_splat(1.0f), _mm512_scalef_ps(e, n));
}

/* erf(t): both sides on every lane, each lane taking its own side's; |erf| with t's sign (neither side gives a
 * negative value or -0 for a >= 0, so this is MLAS's OR of the sign). A NaN t gives erf(3.925), as MLAS's
 * clamp (its minimum takes the bound for NaN); the caller's x * (erf + 1) is NaN again. */
HOTROD_GELU __m512 hotrod_erf(__m512 t) {
  const __m512i sign = _mm512_set1_epi32(INT32_MIN);
  const __m512 a = _mm512_min_ps(hotrod_bits(_mm512_andnot_si512(sign, hotrod_ints(t))), hotrod_splat(3.925f));
  const __mmask16 big = _mm512_cmp_ps_mask(hotrod_splat(0.921875f), a, _CMP_LE_OS);
  const __m512 erf = _mm512_mask_blend_ps(big, hotrod_erf_small(a), hotrod_erf_big(a));
  return hotrod_bits(_mm512_ternarylogic_epi32(sign, hotrod_ints(t), hotrod_ints(erf), 0xCA));
}

/* 0.5 x (1 + erf(x / sqrt 2)), in onnxruntime's order: (0.5 x) (erf + 1). */
HOTROD_GELU __m512 hotrod_gelu(__m512 x) {
  const __m512 erf = hotrod_erf(_mm512_mul_ps(x, hotrod_splat(0.70710678118654752440f)));
  return _mm512_mul_ps(_mm512_mul_ps(x, hotrod_splat(0.5f)), _mm512_add_ps(erf, hotrod_splat(1.0f)));
}
