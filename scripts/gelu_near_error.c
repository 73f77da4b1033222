/* The largest |hotrod_gelu_near(x) - GELU(x)| over every float32 x, GELU as onnxruntime computes it (gelu.h's
 * hotrod_gelu, equal to it to the bit: tests/runtime/test_gelu.py), and whether the two have the same bits from
 * the clamp on (|x| >= 3.925 sqrt 2, where the table's last piece is 1). gelu_static.h's HOTROD_GELU_NEAR_ERROR
 * is about four times the first figure; rerun this when the table changes:
 *
 *     cc -O2 -Isrc/hotrod/native -mavx512f -mavx512bw -ffp-contract=off -o /tmp/gelu_near_error \
 *         scripts/gelu_near_error.c -lm && /tmp/gelu_near_error
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "gelu_static.h"

int main(void) {
  const float clamp = 3.925f * 1.41421356237f;
  double worst = 0;
  float worst_x = 0;
  uint64_t differ_past_clamp = 0;
  for (uint64_t start = 0; start < (1ull << 32); start += 16) {
    uint32_t bits[16];
    for (int i = 0; i < 16; i++) bits[i] = (uint32_t)(start + i);
    float x[16], near[16], exact[16];
    memcpy(x, bits, sizeof x);
    const __m512 v = _mm512_loadu_ps(x);
    _mm512_storeu_ps(near, hotrod_gelu_near(v));
    _mm512_storeu_ps(exact, hotrod_gelu(v));
    for (int i = 0; i < 16; i++) {
      if (isnan(x[i])) continue;
      if (fabsf(x[i]) >= clamp * 1.0001f) {
        differ_past_clamp += memcmp(&near[i], &exact[i], 4) != 0 && !(isnan(near[i]) && isnan(exact[i]));
      } else if (fabs((double)near[i] - exact[i]) > worst) {
        worst = fabs((double)near[i] - exact[i]), worst_x = x[i];
      }
    }
  }
  printf("largest |near - exact| below the clamp: %.3e (x = %.9g); past it, %llu floats differ in their bits\n",
         worst, worst_x, (unsigned long long)differ_past_clamp);
  return differ_past_clamp != 0;
}
