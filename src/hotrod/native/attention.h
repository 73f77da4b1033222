/* Encoder self-attention with bf16 products on AMX tiles or, without them, on AVX512_BF16 or AVX-512F (see
 * attention.c). */
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "i8gemm.h" /* hotrod_parallel, hotrod_amx_ready */

/* Where the answers go: floats into y, or, where y is NULL, uint8 into q, each value quantized with one scale and
 * zero point as onnxruntime's QuantizeLinear quantizes it (quantize.h): an int8-static graph's next product's
 * input, the floats neither written nor read again. */
typedef struct {
  float* y;
  uint8_t* q;
  float scale;
  int32_t zero_point;
} hotrod_attention_out;

/* y = softmax(Q K^T * scale + mask) V per batch row and head, with Q [batch, seq_q, heads * head_size], K and V
 * [batch, seq_k, heads * head_size] and y like Q, all fp32 (products in bf16, sums and softmax in fp32), written
 * as `out` says; mask NULL or an additive fp32 mask of mask_count dimensions that broadcast to [batch, heads,
 * seq_q, seq_k], its last seq_k. Any head size (padded with zeros to the tiles' 32). On AMX's tiles where `tiles`
 * is 1 and the state is granted, on AVX512_BF16's VDPBF16PS without tiles where it is 2 and this CPU has them,
 * else on AVX-512F's FMAs; where it is 3 and this CPU has AVX-512 VNNI, with int8 products instead (each row of Q,
 * K and V quantized with its own scale, the softmax's numerators to uint8: attention_quads.c), else as 0. The path
 * is the call's, set once by the op (they sum in different orders);
 * whichever, a row's answer does not depend on its batch-mates. Returns 0, or -1
 * where neither path runs here, the scale is not finite or the mask does not fit (memory that ran out gives NaN,
 * or the zero point where quantized). */
int hotrod_bf16_attention(const float* q, const float* k, const float* v, int64_t batch, int64_t seq_q,
                          int64_t seq_k, int64_t heads, int64_t head_size, float scale, const float* mask,
                          const int64_t* mask_dims, size_t mask_count, const hotrod_attention_out* out, int tiles,
                          hotrod_parallel parallel, void* runner);

/* 1 where this CPU runs the path on AVX512_BF16 without tiles (`tiles` 2). */
int hotrod_attention_pairs_ready(void);
