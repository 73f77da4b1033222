/* GELU then quantization with one scale (int8-static's first feed-forward product), byte for byte as onnxruntime's
 * Gelu and QuantizeLinear give it, at about half of gelu.h's arithmetic.
 *
 * Only the byte has to match, not the float before it. GELU is x Phi(x), Phi(x) = (1 + erf(x / sqrt 2)) / 2;
 * hotrod_gelu_near reads Phi(|x|) off a table of cubics (one permute per coefficient, scripts/erf_table.py) and is
 * within HOTROD_GELU_NEAR_ERROR of onnxruntime's GELU at every float x (scripts/gelu_near_error.c measures it over
 * all of them). The quotient by the scale then lies within a margin of the one onnxruntime rounds; where no lane
 * is within that margin of a half-way point between two integers, both round to the same integer, and the bytes
 * are stored. A vector with a lane inside the margin (a few in a thousand at the scales calibration gives) is
 * computed again on gelu.h's exact arithmetic. From |x| = 3.925 sqrt 2 on, onnxruntime's erf is 1 exactly, and so
 * is the table's last piece: x (x > 0), -0 (x < 0) and NaN (x = -inf, or NaN) come out with the same bits. The
 * int8-static products that fuse the GELU add no residual after it, so this takes none.
 */
#pragma once
#include <immintrin.h>
#include <math.h>
#include <stdint.h>

#include "gelu.h"
#include "quantize.h"

#define HOTROD_GELU_STATIC __attribute__((target("avx512f,avx512bw"))) static inline

/* About four times the largest |hotrod_gelu_near(x) - onnxruntime's GELU(x)| over every float32 x (4.77e-7) */
#define HOTROD_GELU_NEAR_ERROR 2e-6f
/* The division's rounding on both sides (2^-24 relative each) at a quotient of up to 256, four times over; a
 * quotient past the clamp is clamped alike on both sides */
#define HOTROD_GELU_ROUNDING 1.25e-4f

#define HOTROD_GELU_PIECES_PER_X 5.584792614e+00f /* 31 / Z */

/* Phi on 31 equal pieces of [0, 3.925 sqrt 2] and the constant 1 beyond (scripts/erf_table.py prints it) */
static const float hotrod_gelu_table[4][32] __attribute__((aligned(64))) = {
    {/* c0 */
     4.999999702e-01f, 5.710536838e-01f, 6.398713589e-01f, 7.044257522e-01f, 7.630753517e-01f, 8.146833777e-01f,
     8.586660624e-01f, 8.949705362e-01f, 9.239940643e-01f, 9.464666843e-01f, 9.633194208e-01f, 9.755598903e-01f,
     9.841706753e-01f, 9.900373816e-01f, 9.939087033e-01f, 9.963829517e-01f, 9.979144931e-01f, 9.988326430e-01f,
     9.993658066e-01f, 9.996656775e-01f, 9.998289943e-01f, 9.999151230e-01f, 9.999591112e-01f, 9.999809265e-01f,
     9.999913573e-01f, 9.999961853e-01f, 9.999983907e-01f, 9.999993443e-01f, 9.999997616e-01f, 9.999998808e-01f,
     9.999999404e-01f, 1.000000000e+00f,
    },
    {/* c1 */
     7.143457979e-02f, 7.030069828e-02f, 6.700158119e-02f, 6.184205785e-02f, 5.527840555e-02f, 4.785188287e-02f,
     4.011565074e-02f, 3.256861493e-02f, 2.560676821e-02f, 1.949753240e-02f, 1.437717211e-02f, 1.026681345e-02f,
     7.100120652e-03f, 4.755139351e-03f, 3.084095195e-03f, 1.937130583e-03f, 1.178300940e-03f, 6.940959138e-04f,
     3.959572059e-04f, 2.187470818e-04f, 1.170310861e-04f, 6.063520777e-05f, 3.042376557e-05f, 1.478309059e-05f,
     6.956352081e-06f, 3.170017408e-06f, 1.398960308e-06f, 5.978779996e-07f, 2.474475309e-07f, 9.917833665e-08f,
     3.849581987e-08f, 0.000000000e+00f,
    },
    {/* c2 */
     -4.106775577e-06f, -1.141746063e-03f, -2.171273343e-03f, -3.002098761e-03f, -3.573598573e-03f, -3.861947916e-03f,
     -3.879749682e-03f, -3.669301281e-03f, -3.291712143e-03f, -2.814710373e-03f, -2.301778877e-03f, -1.804441097e-03f,
     -1.358416164e-03f, -9.833611548e-04f, -6.852258812e-04f, -4.599943059e-04f, -2.976854157e-04f, -1.858168980e-04f,
     -1.119260851e-04f, -6.508188380e-05f, -3.654355532e-05f, -1.981993955e-05f, -1.038573282e-05f, -5.259012596e-06f,
     -2.573838401e-06f, -1.217689487e-06f, -5.569683594e-07f, -2.463296482e-07f, -1.053520648e-07f, -4.357649885e-08f,
     -1.743344491e-08f, 0.000000000e+00f,
    },
    {/* c3 */
     -3.766901500e-04f, -3.412507358e-04f, -2.758705523e-04f, -1.903649681e-04f, -9.682537348e-05f, -7.259503491e-06f,
     6.850405771e-05f, 1.241933351e-04f, 1.575433998e-04f, 1.698781998e-04f, 1.650885388e-04f, 1.483630331e-04f,
     1.250054192e-04f, 9.956465510e-05f, 7.536727935e-05f, 5.442120528e-05f, 3.758550884e-05f, 2.487748316e-05f,
     1.580493881e-05f, 9.649494132e-06f, 5.667130154e-06f, 3.204150744e-06f, 1.745174359e-06f, 9.161779531e-07f,
     4.638083340e-07f, 2.265104939e-07f, 1.067526796e-07f, 4.856684654e-08f, 2.133466737e-08f, 9.051415617e-09f,
     3.709546670e-09f, 0.000000000e+00f,
    },
};

/* x Phi(|x|) for x >= 0, x (1 - Phi(|x|)) below: GELU within HOTROD_GELU_NEAR_ERROR; from where |x| k reaches 31
 * (the clamp, to a few float steps) the last piece's 1 gives onnxruntime's bits. */
HOTROD_GELU_STATIC __m512 hotrod_gelu_near(__m512 x) {
  const __m512 z = _mm512_abs_ps(x);
  /* a NaN's position is the last piece (MINPS answers its second operand): Phi is 1 there, and x Phi NaN again */
  const __m512 y = _mm512_min_ps(_mm512_mul_ps(z, _mm512_set1_ps(HOTROD_GELU_PIECES_PER_X)), _mm512_set1_ps(31.0f));
  const __m512 piece = _mm512_roundscale_ps(y, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  const __m512 u = _mm512_sub_ps(y, piece);
  const __m512i at = _mm512_cvttps_epi32(piece);
  const float(*t)[32] = hotrod_gelu_table;
  __m512 phi = _mm512_permutex2var_ps(_mm512_load_ps(t[3]), at, _mm512_load_ps(t[3] + 16));
  phi = _mm512_fmadd_ps(phi, u, _mm512_permutex2var_ps(_mm512_load_ps(t[2]), at, _mm512_load_ps(t[2] + 16)));
  phi = _mm512_fmadd_ps(phi, u, _mm512_permutex2var_ps(_mm512_load_ps(t[1]), at, _mm512_load_ps(t[1] + 16)));
  phi = _mm512_fmadd_ps(phi, u, _mm512_permutex2var_ps(_mm512_load_ps(t[0]), at, _mm512_load_ps(t[0] + 16)));
  const __mmask16 negative = _mm512_test_epi32_mask(hotrod_ints(x), _mm512_set1_epi32(INT32_MIN));
  phi = _mm512_mask_sub_ps(phi, negative, _mm512_set1_ps(1.0f), phi);
  return _mm512_mul_ps(x, phi);
}

/* The margin around the quotients at `scale`: how far the one from the table can lie from onnxruntime's. */
static inline float hotrod_gelu_margin(float scale) {
  return scale > 0 && isfinite(scale) ? HOTROD_GELU_NEAR_ERROR / scale + HOTROD_GELU_ROUNDING : INFINITY;
}

/* GELU(x) quantized as hotrod_quantize_static16, `mask`'s lanes stored; 1 where the vector was computed again on
 * the exact arithmetic. */
HOTROD_GELU_STATIC int hotrod_gelu_quantize_static16(__m512 x, float scale, int32_t zero_point, float margin,
                                                     __mmask16 mask, uint8_t* q) {
  const __m512 v = hotrod_quotient_static16(hotrod_gelu_near(x), scale, zero_point);
  const __m512 n = _mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 off = _mm512_abs_ps(_mm512_sub_ps(v, n));
  if (_mm512_mask_cmp_ps_mask(mask, off, _mm512_set1_ps(0.5f - margin), _CMP_LT_OQ) != mask) {
    hotrod_quantize_static16(hotrod_gelu(x), scale, zero_point, mask, q);
    return 1;
  }
  _mm512_mask_cvtepi32_storeu_epi8(q, mask, _mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(zero_point)));
  return 0;
}
