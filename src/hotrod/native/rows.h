/* Per-row int8 quantization of activations (see rows.c). */
#pragma once
#include <stdint.h>

/* q[rows][k] (uint8, zero point 128) and scales[rows] of x[rows][k], on the calling thread. */
void hotrod_quantize_rows(const float* x, int64_t rows, int64_t k, uint8_t* q, float* scales);
