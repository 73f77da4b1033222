/* LayerNormalization with onnxruntime's arithmetic (see norm.c). */
#pragma once
#include <stdint.h>

/* y[rows][k] = LayerNorm(x[rows][k]) with gamma[k], beta[k] (k a multiple of 8), on the calling thread; where q
 * is not NULL, each row of y also quantized as QuantizeRows does (q[rows][k], scales[rows]). */
void hotrod_layer_norm(const float* x, int64_t rows, int64_t k, const float* gamma, const float* beta,
                       float epsilon, float* y, uint8_t* q, float* scales);
