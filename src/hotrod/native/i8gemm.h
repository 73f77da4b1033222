/* Int8 products on AMX tiles (on AVX-512 VNNI without them), for rows quantized per row (see i8gemm.c). */
#pragma once
#include <stddef.h>
#include <stdint.h>

/* The packed weights' granularity: k a multiple of HOTROD_I8_DEPTH, columns padded to HOTROD_I8_COLS. */
#define HOTROD_I8_DEPTH 64
#define HOTROD_I8_COLS 32

/* What the epilogue applies to each biased value: nothing, or GELU's erf form as onnxruntime computes it. */
#define HOTROD_I8_LINEAR 0
#define HOTROD_I8_GELU 1

/* Runs task(data, i) for every i < count, on whatever threads the caller has (each i exactly once). */
typedef void (*hotrod_task)(void* data, size_t index);
typedef void (*hotrod_parallel)(void* runner, hotrod_task task, void* data, size_t count);

/* The interface of these kernels' ops, attributes and entry points: the Python side uses a library only where
 * this matches its own (`hotrod.runtime.native.KERNELS_VERSION`); bumped as it changes. */
#define HOTROD_KERNELS_VERSION 8
int hotrod_kernels_version(void);

/* 1 where Linux grants this process the AMX tile state (asked once), 0 elsewhere. */
int hotrod_amx_ready(void);

/* 1 where this CPU has AVX-512 (F, BW, VL) with VNNI: the int8 products run without tiles. */
int hotrod_vnni_ready(void);

/* This thread's tiles configured as hotrod's AMX kernels use them: all eight 16 rows of 64 bytes. */
void hotrod_configure_tiles(void);

/* Y[r][j] = ((float)(sum_k q[r][k] * w[k][j] - offsets[j]) * w_scale[j]) * a_scale[r * scale_stride] + bias[j] for
 * j < n (scale_stride 1: a scale per row; 0: one for every row, a calibrated graph's),
 * with q uint8 (k a multiple of HOTROD_I8_DEPTH), w the packed int8 weights, offsets, scales and bias padded
 * to a multiple of HOTROD_I8_COLS; Y's columns split into `parts` outputs y[0..parts) of n / parts columns
 * each (a multiple of 16 where parts > 1); with `activation` applied to each Y[r][j], then residual[r][j] added
 * where a residual ([rows, n], one output only) is given; on AMX's tiles where `tiles` asks for them and the
 * state is granted, else on AVX-512 VNNI (the same answers: the sums are exact). The path is the call's: set once,
 * by the op. Returns 0, or -1 where neither path runs here, or the split, activation or residual does not fit
 * (memory that ran out gives NaN). */
int hotrod_i8_matmul(const uint8_t* q, const float* a_scale, int64_t scale_stride, int64_t rows, int64_t k,
                     const int8_t* w, const int32_t* offsets, const float* w_scale, const float* bias, int64_t n,
                     float* const* y, int64_t parts, int activation, const float* residual, int tiles,
                     hotrod_parallel parallel, void* runner);

/* The same product (one output, no residual) quantized per row as the next product's input, as
 * hotrod_quantize_rows quantizes it (rows.h): q_out [rows][n] and scales_out [rows], Y itself not kept. Where
 * there are enough rows, each unit of work makes whole rows in its own buffer, in the core's cache, and
 * quantizes them from there. Returns as hotrod_i8_matmul (also -1 where memory for the whole product ran
 * out); a unit whose buffer could not be had gives its rows NaN scales, which no caller takes for an answer. */
int hotrod_i8_matmul_rows(const uint8_t* q, const float* a_scale, int64_t scale_stride, int64_t rows, int64_t k,
                          const int8_t* w, const int32_t* offsets, const float* w_scale, const float* bias, int64_t n,
                          int activation, uint8_t* q_out, float* scales_out, int tiles, hotrod_parallel parallel,
                          void* runner);

/* The same product (one output, no residual) quantized as onnxruntime's QuantizeLinear quantizes floats to
 * uint8 with one scale and zero point (0..255), into out [rows][n]; Y itself not kept. Returns as
 * hotrod_i8_matmul (also -1 where the zero point is out of range or memory for 32 rows ran out, before any
 * output is written). */
int hotrod_i8_matmul_static(const uint8_t* q, const float* a_scale, int64_t scale_stride, int64_t rows, int64_t k,
                            const int8_t* w, const int32_t* offsets, const float* w_scale, const float* bias,
                            int64_t n, int activation, float scale, int32_t zero_point, uint8_t* out, int tiles,
                            hotrod_parallel parallel, void* runner);

/* y[i] = GELU(x[i]) for i < n, as the epilogue computes it (gelu.h), for the kernel's tests to compare with
 * onnxruntime's own Gelu. Returns 0, or -1 where this CPU lacks AVX-512 or the library the AMX kernels. */
int hotrod_gelu_values(const float* x, int64_t n, float* y);

/* q[i] = GELU(x[i]) quantized with `scale` and `zero_point` for i < n, as int8-static's epilogue computes them
 * (gelu_static.h), for the tests to compare with onnxruntime's Gelu and QuantizeLinear. Returns how many groups of
 * 16 were computed again on the exact arithmetic; -1 as hotrod_gelu_values, or where the zero point is not 0-255. */
int64_t hotrod_gelu_static_values(const float* x, int64_t n, float scale, int32_t zero_point, uint8_t* q);

/* y[i] = the table's GELU (gelu_static.h's hotrod_gelu_near) for i < n, for the tests to bound its distance from
 * onnxruntime's. Returns as hotrod_gelu_values. */
int hotrod_gelu_near_values(const float* x, int64_t n, float* y);
