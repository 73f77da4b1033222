/* hotrod's onnxruntime custom ops, registered by `RegisterCustomOps` in the domain "hotrod":
 * - Q4MatMul (inputs: A float [..., K], the packed weights, their scales, a bias; attributes N, block,
 *   threads; output float [..., N]): int4 products (q4gemm.c, AVX-512 VNNI; the Python side uses it only
 *   where the CPU has those instructions);
 * - QuantizeRows (input: X float [..., K]; outputs: uint8 [..., K], float scales [..., 1]): per-row int8
 *   quantization of a product's input in one pass (rows.c, AVX2);
 * - Int8MatMul (inputs: Q uint8 [..., K] and its row scales [..., 1] from QuantizeRows, the packed int8
 *   weights, int32 zero-point offsets, float column scales and bias; attribute N; output float [..., N]):
 *   int8 products on AMX tiles (i8gemm.c; the Python side uses it only where the CPU has AMX);
 *   an optional attribute `activation` (1: GELU after the bias, as onnxruntime's Gelu computes it) and an
 *   optional seventh input, a residual added last (in the epilogue where it has the product's shape);
 * - Int8MatMulRows: the same (no residual) with its output quantized per row as QuantizeRows would, for the
 *   next product: outputs uint8 [..., N] and float scales [..., 1];
 * - Int8MatMulSplit: the same with its columns in three outputs of N / 3 each (a fused Q/K/V product's);
 * - Bf16Attention (inputs: Q, K, V float [B, S, H x D], an optional additive float mask broadcasting to
 *   [B, H, S, S]; attributes num_heads, scale; output float like Q): encoder self-attention with bf16 products
 *   on AMX tiles (attention.c; the Python side uses it only where the CPU has AMX-BF16 and the build asked).
 *
 * QuantizeRows, Int8MatMul and Bf16Attention run on onnxruntime's intra-op threads (KernelContext_ParallelFor, from the
 * version-17 table on; on the calling thread alone where the runtime lacks it). Q4MatMul brings its own.
 *
 * onnxruntime's C API is a table of function pointers whose order is fixed (new entries are only ever
 * appended), and a library asks for the table of the version it was written against. This one asks for
 * version 8 and declares the few entries it calls by their positions in that table, with their types,
 * so it builds without onnxruntime's headers, which its Python package does not carry.
 */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "attention.h"
#include "i8gemm.h"
#include "q4gemm.h"
#include "rows.h"

#include "ort_api.h"

typedef struct { int64_t n, block, threads; } Kernel;

static void* create_kernel(const CustomOp* op, const Entry* table, const OrtKernelInfo* info) {
  (void)op, (void)table;
  Kernel* kernel = calloc(1, sizeof(Kernel));
  if (kernel == NULL) return NULL;
  if (failed(CALL(ATTRIBUTE_INT64, AttributeFn, info, "N", &kernel->n)) ||
      failed(CALL(ATTRIBUTE_INT64, AttributeFn, info, "block", &kernel->block)) ||
      failed(CALL(ATTRIBUTE_INT64, AttributeFn, info, "threads", &kernel->threads)) || kernel->n <= 0 ||
      kernel->block <= 0 || kernel->block % 32 != 0 || kernel->threads < 1) {
    free(kernel);
    return NULL;
  }
  return kernel;
}

/* Whether the packed weights, scales and bias have the shapes that A's K and the attributes call for. */
static int fits(const Kernel* kernel, int64_t k, const OrtValue* weights, const OrtValue* scales,
                const OrtValue* bias) {
  const int64_t blocks = (k + kernel->block - 1) / kernel->block;
  const int64_t padded_n = (kernel->n + HOTROD_Q4_COLS - 1) / HOTROD_Q4_COLS * HOTROD_Q4_COLS;
  int64_t w[8], s[8], b[8];
  return k > 0 && dims_of(weights, w) == 3 && w[0] == padded_n / 16 && w[1] == blocks * kernel->block / 8 &&
         w[2] == 64 && dims_of(scales, s) == 2 && s[0] == blocks && s[1] == padded_n && dims_of(bias, b) == 1 &&
         b[0] == padded_n;
}

static void compute(void* state, OrtKernelContext* context) {
  const Kernel* kernel = state;
  const OrtValue *a = NULL, *weights = NULL, *scales = NULL, *bias = NULL;
  OrtValue* y = NULL;
  int64_t dims[8];
  if (kernel == NULL || failed(CALL(CONTEXT_INPUT, GetInputFn, context, 0, &a)) ||
      failed(CALL(CONTEXT_INPUT, GetInputFn, context, 1, &weights)) ||
      failed(CALL(CONTEXT_INPUT, GetInputFn, context, 2, &scales)) ||
      failed(CALL(CONTEXT_INPUT, GetInputFn, context, 3, &bias)))
    return;
  size_t count = dims_of(a, dims);
  if (count == 0) return;
  int64_t k = dims[count - 1], rows = 1;
  for (size_t i = 0; i + 1 < count; i++) rows *= dims[i];
  dims[count - 1] = kernel->n;
  if (failed(CALL(CONTEXT_OUTPUT, GetOutputFn, context, 0, dims, count, &y))) return;
  float* out = data_of(y);
  if (out == NULL || rows == 0) return;
  const float* x = data_of(a);
  const uint8_t* w = data_of(weights);
  const float* s = data_of(scales);
  const float* b = data_of(bias);
  /* A version-8 op cannot return an error: a call it cannot make gives NaN, which no caller takes for an
   * answer (inputs that do not fit the packed weights, or memory that ran out). */
  if (x == NULL || w == NULL || s == NULL || b == NULL || !fits(kernel, k, weights, scales, bias) ||
      hotrod_q4_matmul(x, rows, k, w, s, b, kernel->n, kernel->block, (int)kernel->threads, out) != 0)
    for (int64_t i = 0; i < rows * kernel->n; i++) out[i] = __builtin_nanf("");
}

static void destroy(void* kernel) { free(kernel); }
static const char* name(const CustomOp* op) { (void)op; return "Q4MatMul"; }
static const char* provider(const CustomOp* op) { (void)op; return "CPUExecutionProvider"; }
static int input_type(const CustomOp* op, size_t i) { (void)op; return i == 1 ? UINT8 : FLOAT; }
static size_t inputs(const CustomOp* op) { (void)op; return 4; }
static int output_type(const CustomOp* op, size_t i) { (void)op, (void)i; return FLOAT; }
static size_t outputs(const CustomOp* op) { (void)op; return 1; }
static int required(const CustomOp* op, size_t i) { (void)op, (void)i; return 0; }

static const CustomOp q4_matmul = {API_VERSION, create_kernel, name, provider, input_type, inputs, output_type,
                                   outputs, compute, destroy, required, required};

/* -- onnxruntime's threads ------------------------------------------------------------------- */

static const Entry* parallel_api; /* a table that has KernelContext_ParallelFor, or NULL */

/* hotrod_parallel over onnxruntime's intra-op pool (`runner` is the kernel's context). */
static void run_parallel(void* runner, hotrod_task task, void* data, size_t count) {
  if (count > 1 && parallel_api != NULL &&
      !failed(((ParallelForFn)parallel_api[PARALLEL_FOR])(runner, task, count, 0, data)))
    return;
  for (size_t i = 0; i < count; i++) task(data, i);
}

/* -- QuantizeRows ------------------------------------------------------------------------------ */

/* The op has no attributes: its kernel holds nothing (onnxruntime takes a NULL kernel for a failure). */
static int rows_kernel;

static void* create_rows(const CustomOp* op, const Entry* table, const OrtKernelInfo* info) {
  (void)op, (void)table, (void)info;
  return &rows_kernel;
}

static void destroy_rows(void* kernel) { (void)kernel; }

/* Inputs this small are quantized on the calling thread: waking the pool would cost more. */
#define PARALLEL_VALUES (64 * 1024)
#define ROWS_PER_TASK 16

typedef struct { const float* x; uint8_t* q; float* scales; int64_t rows, k, parts; } RowsTask;

static void quantize_part(void* data, size_t index) {
  const RowsTask* t = data;
  const int64_t per = t->parts == 1 ? t->rows : ROWS_PER_TASK, first = (int64_t)index * per;
  const int64_t count = first + per < t->rows ? per : t->rows - first;
  hotrod_quantize_rows(t->x + first * t->k, count, t->k, t->q + first * t->k, t->scales + first);
}

static void compute_rows(void* state, OrtKernelContext* context) {
  (void)state;
  const OrtValue* a = NULL;
  OrtValue *q = NULL, *scales = NULL;
  int64_t dims[8];
  if (failed(CALL(CONTEXT_INPUT, GetInputFn, context, 0, &a))) return;
  size_t count = dims_of(a, dims);
  if (count == 0) return;
  int64_t k = dims[count - 1], rows = 1;
  for (size_t i = 0; i + 1 < count; i++) rows *= dims[i];
  if (failed(CALL(CONTEXT_OUTPUT, GetOutputFn, context, 0, dims, count, &q))) return;
  dims[count - 1] = 1;
  if (failed(CALL(CONTEXT_OUTPUT, GetOutputFn, context, 1, dims, count, &scales))) return;
  const float* x = data_of(a);
  uint8_t* qs = data_of(q);
  float* s = data_of(scales);
  if (rows == 0 || k == 0) return;
  if (x == NULL || qs == NULL || s == NULL) { /* cannot happen for tensors it was given: NaN scales if it does */
    for (int64_t r = 0; s != NULL && r < rows; r++) s[r] = __builtin_nanf("");
    return;
  }
  RowsTask task = {x, qs, s, rows, k, rows * k >= PARALLEL_VALUES ? (rows + ROWS_PER_TASK - 1) / ROWS_PER_TASK : 1};
  run_parallel(context, quantize_part, &task, (size_t)task.parts);
}

static const char* rows_name(const CustomOp* op) { (void)op; return "QuantizeRows"; }
static int rows_input_type(const CustomOp* op, size_t i) { (void)op, (void)i; return FLOAT; }
static size_t rows_inputs(const CustomOp* op) { (void)op; return 1; }
static int rows_output_type(const CustomOp* op, size_t i) { (void)op; return i == 0 ? UINT8 : FLOAT; }
static size_t rows_outputs(const CustomOp* op) { (void)op; return 2; }

static const CustomOp quantize_rows = {API_VERSION, create_rows, rows_name, provider, rows_input_type, rows_inputs,
                                       rows_output_type, rows_outputs, compute_rows, destroy_rows, required, required};

/* -- Int8MatMul, Int8MatMulRows, Int8MatMulSplit ---------------------------------------------- */

/* N, the outputs its columns are split into (1: Int8MatMul and Int8MatMulRows, 3: Int8MatMulSplit), and the
 * activation its epilogue applies (the attribute `activation`, absent for none: HOTROD_I8_LINEAR or
 * HOTROD_I8_GELU). */
typedef struct { int64_t n, parts, activation; } Int8Kernel;

static void* create_int8(const CustomOp* op, const Entry* table, const OrtKernelInfo* info) {
  (void)table;
  Int8Kernel* kernel = calloc(1, sizeof(Int8Kernel));
  if (kernel == NULL) return NULL;
  /* float outputs are the product's parts; Int8MatMulRows's two (q, scales) are one product's */
  kernel->parts = op->GetOutputType(op, 0) == FLOAT ? (int64_t)op->GetOutputTypeCount(op) : 1;
  if (failed(CALL(ATTRIBUTE_INT64, AttributeFn, info, "activation", &kernel->activation)))
    kernel->activation = HOTROD_I8_LINEAR;
  if (failed(CALL(ATTRIBUTE_INT64, AttributeFn, info, "N", &kernel->n)) || kernel->n <= 0 ||
      kernel->n % kernel->parts != 0 || (kernel->parts > 1 && kernel->n / kernel->parts % 16 != 0) ||
      kernel->activation < HOTROD_I8_LINEAR || kernel->activation > HOTROD_I8_GELU) {
    free(kernel);
    return NULL;
  }
  return kernel;
}

/* Whether the row scales, packed weights, offsets, column scales and bias fit Q's shape and N. */
static int int8_fits(int64_t n, const int64_t* q, size_t count, const OrtValue* const* in) {
  const int64_t k = q[count - 1], padded_n = (n + HOTROD_I8_COLS - 1) / HOTROD_I8_COLS * HOTROD_I8_COLS;
  int64_t d[8];
  if (k <= 0 || k % HOTROD_I8_DEPTH != 0 || dims_of(in[1], d) != count || d[count - 1] != 1) return 0;
  for (size_t i = 0; i + 1 < count; i++)
    if (d[i] != q[i]) return 0;
  if (dims_of(in[2], d) != 3 || d[0] != padded_n / HOTROD_I8_COLS || d[1] != k / HOTROD_I8_DEPTH ||
      d[2] != HOTROD_I8_COLS * HOTROD_I8_DEPTH)
    return 0;
  for (int i = 3; i < 6; i++)
    if (dims_of(in[i], d) != 1 || d[0] != padded_n) return 0;
  return 1;
}

/* numpy's broadcast of shapes a and b (right-aligned) into out; 0, out untouched, where they do not
 * broadcast. */
static int broadcast(const int64_t* a, size_t na, const int64_t* b, size_t nb, int64_t* out, size_t* n) {
  const size_t count = na > nb ? na : nb;
  int64_t dims[8];
  for (size_t i = 0; i < count; i++) {
    const int64_t x = i < count - na ? 1 : a[i - (count - na)], y = i < count - nb ? 1 : b[i - (count - nb)];
    if (x != y && x != 1 && y != 1) return 0;
    dims[i] = x == 1 ? y : x;
  }
  memcpy(out, dims, count * sizeof(int64_t));
  *n = count;
  return 1;
}

/* Element strides of a tensor of shape d (na dimensions) read at out's n-dimensional indices: 0 along the
 * dimensions it is broadcast over. */
static void strides(const int64_t* d, size_t na, size_t n, int64_t* s) {
  int64_t stride = 1;
  for (size_t i = n; i-- > 0;) {
    const int64_t dim = i < n - na ? 1 : d[i - (n - na)];
    s[i] = dim == 1 ? 0 : stride;
    stride *= dim;
  }
}

/* out = a + b, each broadcast to out's shape (a residual that is not of the product's own shape: rare, so
 * index by index). */
static void add_broadcast(const float* a, const int64_t* ad, size_t na, const float* b, const int64_t* bd, size_t nb,
                          float* out, const int64_t* od, size_t n) {
  int64_t sa[8], sb[8], index[8] = {0}, total = 1, ia = 0, ib = 0;
  strides(ad, na, n, sa);
  strides(bd, nb, n, sb);
  for (size_t i = 0; i < n; i++) total *= od[i];
  for (int64_t e = 0; e < total; e++) {
    out[e] = a[ia] + b[ib];
    for (size_t i = n; i-- > 0;) { /* the next index, odometer-wise */
      ia += sa[i], ib += sb[i];
      if (++index[i] < od[i]) break;
      ia -= sa[i] * od[i], ib -= sb[i] * od[i], index[i] = 0;
    }
  }
}

/* The product's own shape (its outputs' `dims`, `count` of them, `rows` x `width` values), and where it adds
 * an optional residual (input 6): in the epilogue where the residual has that shape, after it where the
 * residual broadcasts otherwise (`out_dims`: the sum's shape). */
typedef struct {
  int64_t dims[8], out_dims[8], residual_dims[8], rows, k, width;
  size_t count, out_count;
  int residual_rank; /* -1: none */
  const float* residual;
  int fused, fits;
} Int8Call;

static Int8Call int8_call(const Int8Kernel* kernel, const OrtValue* const* in) {
  Int8Call c = {.residual_rank = -1};
  c.count = dims_of(in[0], c.dims);
  if (c.count == 0) return c;
  c.k = c.dims[c.count - 1];
  c.rows = 1;
  for (size_t i = 0; i + 1 < c.count; i++) c.rows *= c.dims[i];
  c.fits = int8_fits(kernel->n, c.dims, c.count, in);
  c.width = kernel->n / kernel->parts;
  c.dims[c.count - 1] = c.width;
  memcpy(c.out_dims, c.dims, sizeof(c.dims));
  c.out_count = c.count;
  if (in[6] == NULL) return c;
  c.residual_rank = rank_of(in[6], c.residual_dims);
  c.residual = data_of(in[6]);
  c.fused = c.residual_rank == (int)c.count && memcmp(c.residual_dims, c.dims, c.count * sizeof(int64_t)) == 0;
  if (c.residual == NULL || c.residual_rank < 0 ||
      (!c.fused && !broadcast(c.dims, c.count, c.residual_dims, (size_t)c.residual_rank, c.out_dims, &c.out_count)))
    c.fits = 0;
  return c;
}

static void compute_int8(void* state, OrtKernelContext* context) {
  const Int8Kernel* kernel = state;
  const OrtValue* in[7] = {NULL};
  for (size_t i = 0; i < 6; i++)
    if (failed(CALL(CONTEXT_INPUT, GetInputFn, context, i, &in[i]))) return;
  if (kernel->parts == 1 && failed(CALL(CONTEXT_INPUT, GetInputFn, context, 6, &in[6]))) in[6] = NULL;
  const Int8Call c = int8_call(kernel, in);
  if (c.count == 0) return;
  int64_t values = 1;
  for (size_t i = 0; i < c.out_count; i++) values *= c.out_dims[i];
  float* out[3] = {NULL, NULL, NULL};
  for (int64_t i = 0; i < kernel->parts; i++) {
    OrtValue* y = NULL;
    if (failed(CALL(CONTEXT_OUTPUT, GetOutputFn, context, (size_t)i, c.out_dims, c.out_count, &y)) ||
        (out[i] = data_of(y)) == NULL)
      return;
  }
  if (values == 0) return;
  void* data[6];
  for (int i = 0; i < 6; i++) data[i] = data_of(in[i]);
  const int later = c.residual != NULL && !c.fused;
  float* product = later ? malloc((size_t)(c.rows * c.width) * sizeof(float)) : NULL;
  float* const* targets = later ? &product : out;
  /* inputs that do not fit the packed weights (or no tile state, or memory that ran out): NaN, which no caller
   * takes for an answer */
  if (!c.fits || data[0] == NULL || data[1] == NULL || data[2] == NULL || data[3] == NULL || data[4] == NULL ||
      data[5] == NULL || (later && product == NULL) ||
      hotrod_i8_matmul(data[0], data[1], c.rows, c.k, data[2], data[3], data[4], data[5], kernel->n, targets,
                       kernel->parts, (int)kernel->activation, c.fused ? c.residual : NULL, run_parallel,
                       context) != 0) {
    for (int64_t i = 0; i < kernel->parts; i++)
      for (int64_t j = 0; j < values; j++) out[i][j] = __builtin_nanf("");
  } else if (later) {
    add_broadcast(product, c.dims, c.count, c.residual, c.residual_dims, (size_t)c.residual_rank, out[0], c.out_dims,
                  c.out_count);
  }
  free(product);
}

/* Int8MatMulRows: Int8MatMul's product (no residual) as the next product's quantized rows and their scales. */
static void compute_int8_rows(void* state, OrtKernelContext* context) {
  const Int8Kernel* kernel = state;
  const OrtValue* in[7] = {NULL};
  for (size_t i = 0; i < 6; i++)
    if (failed(CALL(CONTEXT_INPUT, GetInputFn, context, i, &in[i]))) return;
  const Int8Call c = int8_call(kernel, in);
  if (c.count == 0) return;
  int64_t dims[8];
  memcpy(dims, c.dims, sizeof(dims));
  OrtValue *q = NULL, *scales = NULL;
  if (failed(CALL(CONTEXT_OUTPUT, GetOutputFn, context, 0, dims, c.count, &q))) return;
  dims[c.count - 1] = 1;
  if (failed(CALL(CONTEXT_OUTPUT, GetOutputFn, context, 1, dims, c.count, &scales))) return;
  uint8_t* qs = data_of(q);
  float* s = data_of(scales);
  if (c.rows == 0 || s == NULL) return;
  void* data[6];
  for (int i = 0; i < 6; i++) data[i] = data_of(in[i]);
  /* inputs that do not fit (or no tile state, or memory that ran out): NaN scales, which no caller takes for an
   * answer (the next product multiplies by them) */
  if (!c.fits || qs == NULL || data[0] == NULL || data[1] == NULL || data[2] == NULL || data[3] == NULL ||
      data[4] == NULL || data[5] == NULL ||
      hotrod_i8_matmul_rows(data[0], data[1], c.rows, c.k, data[2], data[3], data[4], data[5], kernel->n,
                            (int)kernel->activation, qs, s, run_parallel, context) != 0)
    for (int64_t r = 0; r < c.rows; r++) s[r] = __builtin_nanf("");
}

static const char* int8_name(const CustomOp* op) { (void)op; return "Int8MatMul"; }
static const char* int8_rows_name(const CustomOp* op) { (void)op; return "Int8MatMulRows"; }
static const char* int8_split_name(const CustomOp* op) { (void)op; return "Int8MatMulSplit"; }
static int int8_input_type(const CustomOp* op, size_t i) {
  (void)op;
  static const int types[6] = {UINT8, FLOAT, INT8, INT32, FLOAT, FLOAT};
  return i < 6 ? types[i] : FLOAT;
}
static size_t int8_inputs(const CustomOp* op) { (void)op; return 6; }
static size_t int8_residual_inputs(const CustomOp* op) { (void)op; return 7; }
static int residual_optional(const CustomOp* op, size_t i) { (void)op; return i == 6 ? OPTIONAL : REQUIRED; }
static size_t three(const CustomOp* op) { (void)op; return 3; }

static const CustomOp int8_matmul = {API_VERSION, create_int8, int8_name, provider, int8_input_type,
                                     int8_residual_inputs, output_type, outputs, compute_int8, destroy,
                                     residual_optional, required};
static const CustomOp int8_matmul_rows = {API_VERSION, create_int8, int8_rows_name, provider, int8_input_type,
                                          int8_inputs, rows_output_type, rows_outputs, compute_int8_rows, destroy,
                                          required, required};
static const CustomOp int8_matmul_split = {API_VERSION, create_int8, int8_split_name, provider, int8_input_type,
                                           int8_inputs, output_type, three, compute_int8, destroy, required,
                                           required};

/* -- Bf16Attention ----------------------------------------------------------------------------- */

typedef struct { int64_t heads; float scale; } AttentionKernel;

static void* create_attention(const CustomOp* op, const Entry* table, const OrtKernelInfo* info) {
  (void)op, (void)table;
  AttentionKernel* kernel = calloc(1, sizeof(AttentionKernel));
  if (kernel == NULL) return NULL;
  if (failed(CALL(ATTRIBUTE_INT64, AttributeFn, info, "num_heads", &kernel->heads)) ||
      failed(CALL(ATTRIBUTE_FLOAT, FloatAttributeFn, info, "scale", &kernel->scale)) || kernel->heads <= 0) {
    free(kernel);
    return NULL;
  }
  return kernel;
}

/* K's length S_k where K and V are [B, S_k, W] for Q's [B, S_q, W], W a multiple of the heads; 0 otherwise. */
static int64_t attention_keys(const AttentionKernel* kernel, const int64_t* q, size_t count, const OrtValue* k,
                              const OrtValue* v) {
  int64_t dk[8], dv[8];
  if (count != 3 || q[2] % kernel->heads != 0 || dims_of(k, dk) != 3 || dims_of(v, dv) != 3) return 0;
  return dk[0] == q[0] && dv[0] == q[0] && dk[2] == q[2] && dv[2] == q[2] && dk[1] == dv[1] ? dk[1] : 0;
}

static void compute_attention(void* state, OrtKernelContext* context) {
  const AttentionKernel* kernel = state;
  const OrtValue *in[4] = {NULL, NULL, NULL, NULL};
  OrtValue* out = NULL;
  int64_t dims[8], mask_dims[8];
  for (size_t i = 0; i < 4; i++)
    if (failed(CALL(CONTEXT_INPUT, GetInputFn, context, i, &in[i])) && i < 3) return;
  const size_t count = in[0] == NULL ? 0 : dims_of(in[0], dims);
  if (count == 0 || failed(CALL(CONTEXT_OUTPUT, GetOutputFn, context, 0, dims, count, &out))) return;
  float* y = data_of(out);
  int64_t values = 1;
  for (size_t i = 0; i < count; i++) values *= dims[i];
  if (y == NULL || values == 0) return;
  const int64_t keys = attention_keys(kernel, dims, count, in[1], in[2]);
  const int64_t head_size = count == 3 ? dims[2] / kernel->heads : 0; /* scale 0: 1 / sqrt(head size) */
  const size_t mask_count = in[3] == NULL ? 0 : dims_of(in[3], mask_dims);
  const float *q = data_of(in[0]), *k = data_of(in[1]), *v = data_of(in[2]);
  const float* mask = in[3] == NULL ? NULL : data_of(in[3]);
  /* inputs that do not fit (or no tile state, or a mask that cannot be read): NaN, which no caller takes
   * for an answer */
  if (keys == 0 || q == NULL || k == NULL || v == NULL || (in[3] != NULL && (mask == NULL || mask_count == 0)) ||
      hotrod_bf16_attention(q, k, v, dims[0], dims[1], keys, kernel->heads, head_size,
                            kernel->scale != 0.0f ? kernel->scale : 1.0f / sqrtf((float)head_size), mask, mask_dims,
                            mask_count, y, run_parallel, context) != 0)
    for (int64_t i = 0; i < values; i++) y[i] = __builtin_nanf("");
}

static const char* attention_name(const CustomOp* op) { (void)op; return "Bf16Attention"; }
static size_t four(const CustomOp* op) { (void)op; return 4; }
static int mask_optional(const CustomOp* op, size_t i) { (void)op; return i == 3 ? OPTIONAL : REQUIRED; }

static const CustomOp bf16_attention = {API_VERSION, create_attention, attention_name, provider, output_type, four,
                                        output_type, outputs, compute_attention, destroy, mask_optional, required};

/* -- registration ----------------------------------------------------------------------------- */

typedef OrtStatus* (*CreateDomainFn)(const char*, OrtCustomOpDomain**);
typedef OrtStatus* (*DomainAddFn)(OrtCustomOpDomain*, const CustomOp*);
typedef OrtStatus* (*AddDomainFn)(OrtSessionOptions*, OrtCustomOpDomain*);

/* Called by onnxruntime when a session's options load this library. The domain is kept for the process's
 * life, as onnxruntime's own custom-op libraries keep theirs. */
OrtStatus* RegisterCustomOps(OrtSessionOptions* options, const ApiBase* base) {
  api = base->GetApi(API_VERSION);
  if (api == NULL) return NULL;  /* cannot happen: every onnxruntime since 1.8 serves version 8 */
  parallel_api = base->GetApi(PARALLEL_API_VERSION);
  OrtCustomOpDomain* domain = NULL;
  OrtStatus* status = CALL(CREATE_DOMAIN, CreateDomainFn, "hotrod", &domain);
  if (status == NULL) status = CALL(DOMAIN_ADD, DomainAddFn, domain, &q4_matmul);
  if (status == NULL) status = CALL(DOMAIN_ADD, DomainAddFn, domain, &quantize_rows);
  if (status == NULL) status = CALL(DOMAIN_ADD, DomainAddFn, domain, &int8_matmul);
  if (status == NULL) status = CALL(DOMAIN_ADD, DomainAddFn, domain, &int8_matmul_split);
  if (status == NULL) status = CALL(DOMAIN_ADD, DomainAddFn, domain, &int8_matmul_rows);
  if (status == NULL) status = CALL(DOMAIN_ADD, DomainAddFn, domain, &bf16_attention);
  if (status == NULL) status = CALL(ADD_DOMAIN, AddDomainFn, options, domain);
  return status;
}
