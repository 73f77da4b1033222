/* LayerNormalization with onnxruntime's arithmetic (see norm.c). */
#pragma once
#include <stdint.h>

/* Where given (q not NULL), a LayerNorm's output quantized to uint8 with one scale and zero point, as
 * QuantizeLinear quantizes it (quantize.h): an int8-static graph's next product's input; and where given
 * (rounded not NULL), the output rounded to bf16 (nearest even) as a bf16 product rounds its rows (bf16gemm.h):
 * a bf16-products graph's next product's input. */
typedef struct {
  uint8_t* q;
  float scale;
  int32_t zero_point;
  uint16_t* rounded;
} hotrod_norm_fixed;

/* y[rows][k] = LayerNorm(x[rows][k]) with gamma[k], beta[k] (k a multiple of 8), on the calling thread; where q
 * is not NULL, each row of y also quantized as QuantizeRows does (q[rows][k], scales[rows]); where fixed is not
 * NULL, y also quantized with its one scale and zero point into fixed->q[rows][k] and rounded to bf16 into
 * fixed->rounded[rows][k], where each is given. */
void hotrod_layer_norm(const float* x, int64_t rows, int64_t k, const float* gamma, const float* beta,
                       float epsilon, float* y, uint8_t* q, float* scales, const hotrod_norm_fixed* fixed);
