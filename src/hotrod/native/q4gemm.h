/* Int4 weight-only products for rows of activations (see q4gemm.c). */
#pragma once
#include <stdint.h>

#include "i8gemm.h" /* hotrod_parallel */

/* Columns the kernel computes at a time: packed weights, scales and bias are padded to a multiple. */
#define HOTROD_Q4_COLS 64

/* y[rows][n] = x[rows][k] times the packed weights, plus bias (padded like the scales' rows); returns 0,
 * or -1 where memory ran out. The columns are shared among `threads` through `parallel` (the caller's threads);
 * a row's answer is the same however they are split. One function a build: on AVX-512 VNNI (_512) and on
 * AVX2 (_256), with the same answers. */
typedef int (*hotrod_q4_fn)(const float* x, int64_t rows, int64_t k, const uint8_t* weights, const float* scales,
                            const float* bias, int64_t n, int64_t block, int threads, float* y,
                            hotrod_parallel parallel, void* runner);
int hotrod_q4_matmul_512(const float* x, int64_t rows, int64_t k, const uint8_t* weights, const float* scales,
                         const float* bias, int64_t n, int64_t block, int threads, float* y, hotrod_parallel parallel,
                         void* runner);
int hotrod_q4_matmul_256(const float* x, int64_t rows, int64_t k, const uint8_t* weights, const float* scales,
                         const float* bias, int64_t n, int64_t block, int threads, float* y, hotrod_parallel parallel,
                         void* runner);
