/* Encoder self-attention with bf16 products on AMX tiles (see attention.c). */
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "i8gemm.h" /* hotrod_parallel, hotrod_amx_ready */

/* y = softmax(Q K^T * scale + mask) V per batch row and head, with Q [batch, seq_q, heads * head_size], K and V
 * [batch, seq_k, heads * head_size] and y like Q, all fp32 (products in bf16, sums and softmax in fp32); mask
 * NULL or an additive fp32 mask of mask_count dimensions that broadcast to [batch, heads, seq_q, seq_k], its
 * last seq_k. Any head size (padded with zeros to the tiles' 32). Returns 0, or -1 where the tile state is not
 * granted, the scale is not finite or the mask does not fit (memory that ran out gives NaN). */
int hotrod_bf16_attention(const float* q, const float* k, const float* v, int64_t batch, int64_t seq_q,
                          int64_t seq_k, int64_t heads, int64_t head_size, float scale, const float* mask,
                          const int64_t* mask_dims, size_t mask_count, float* y, hotrod_parallel parallel,
                          void* runner);
