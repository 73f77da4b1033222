/* bf16 products on AMX tiles (on AVX-512 BF16 without them), fp32 sums (see bf16gemm.c). */
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "i8gemm.h" /* hotrod_parallel, hotrod_amx_ready, HOTROD_I8_LINEAR / HOTROD_I8_GELU */

/* The packed weights' granularity: depth padded with zeros to a multiple of HOTROD_BF16_DEPTH, columns to
 * HOTROD_BF16_COLS. */
#define HOTROD_BF16_DEPTH 32
#define HOTROD_BF16_COLS 32

/* Y[r][j] = sum_k bf16(a[r][k]) * w[k][j] + bias[j] for j < n, with a fp32 [rows, k] rounded to bf16 (to nearest
 * even) as it is read, or, where `rounded` is given, those rows rounded already ([rows, k], k a multiple of
 * HOTROD_BF16_DEPTH: the output of a product before, `y_rounded`); w the packed bf16 weights ([n' / 32, k' / 32,
 * 1024], k' and n' padded), the sums and bias in fp32 (bias padded to n'); `activation` (HOTROD_I8_LINEAR or
 * HOTROD_I8_GELU, gelu.h) applied to each biased value, then residual[r][j] added where a residual ([rows, n], one
 * output only) is given; Y's columns split into `parts` outputs y[0..parts) of n / parts columns each (a multiple
 * of 16 where parts > 1), or, where `y_rounded` is given ([rows, n], n a multiple of HOTROD_BF16_DEPTH, one part),
 * Y rounded to bf16 into it instead, as the next product reads it. On AMX's tiles where `tiles` asks for them and
 * the state is granted (every row through the tiles, however few), else on AVX-512 BF16 (every row through the
 * same steps): either way a row's answer is the same alone and in any batch; the path is the call's, set once,
 * by the op (the two round their sums' order differently). Returns 0, or -1 where neither path runs here, the
 * split, activation, residual or rounding does not fit, or memory for the rounded rows ran out (before any output
 * is written); a unit of work whose buffer for a deep product's partial sums could not be had gives its rows and
 * columns NaN, which no caller takes for an answer. */
int hotrod_bf16_matmul(const float* a, const uint16_t* rounded, int64_t rows, int64_t k, const uint16_t* w,
                       const float* bias, int64_t n, float* const* y, uint16_t* y_rounded, int64_t parts,
                       int activation, const float* residual, int tiles, hotrod_parallel parallel, void* runner);

/* 1 where this CPU has AVX-512 (F, BW, VL) with BF16: the bf16 products run without tiles. */
int hotrod_bf16_vectors_ready(void);

/* out[i] = x[i] rounded to bf16 (to nearest even, NaN kept a NaN) for i < k: as the product rounds its rows, for an
 * op before it that writes them (LayerNormRounded). */
void hotrod_round_row(const float* x, int64_t k, uint16_t* out);
