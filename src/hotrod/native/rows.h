/* Per-row int8 quantization of activations (see rows.c). */
#pragma once
#include <stdint.h>

/* q[rows][k] (uint8, zero point 128) and scales[rows] of x[rows][k], on the calling thread. */
void hotrod_quantize_rows(const float* x, int64_t rows, int64_t k, uint8_t* q, float* scales);

/* 1 where this CPU has the AVX-512 (F, BW, VL, DQ) of the wide row code, 0 elsewhere (asked once). */
int hotrod_rows_wide(void);

/* One row quantized as hotrod_quantize_rows quantizes it, its largest |x| (NaN where x holds one) given by a
 * caller that had it from the pass that made x; on a CPU without hotrod_rows_wide it is found again. */
void hotrod_quantize_row_known(const float* x, int64_t k, float top, uint8_t* q, float* scale);

/* x[n] quantized to uint8 with one scale and zero point (0..255) as onnxruntime's QuantizeLinear quantizes it
 * (quantize.h), on the calling thread: where the graph's next product reads a calibrated quantization. */
void hotrod_quantize_static(const float* x, int64_t n, float scale, int32_t zero_point, uint8_t* q);
