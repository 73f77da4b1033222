/* hotrod's onnxruntime custom ops, registered by `RegisterCustomOps` in the domain "hotrod":
 * - Q4MatMul (inputs: A float [..., K], the packed weights, their scales, a bias; attributes N, block,
 *   threads, width; output float [..., N]): int4 products (q4gemm.c, built for AVX-512 VNNI (width 512) and
 *   for AVX2 (256); under a width this CPU cannot run, the op answers NaN);
 * - QuantizeRows (input: X float [..., K]; outputs: uint8 [..., K], float scales [..., 1]): per-row int8
 *   quantization of a product's input in one pass (rows.c, AVX2);
 * - Int8MatMul, Int8MatMulRows, Int8MatMulSplit: int8 products on AMX tiles or AVX-512 VNNI (ort_int8.c,
 *   i8gemm.c; the Python side uses them only where the CPU has one of them);
 * - Bf16Attention (inputs: Q, K, V float [B, S, H x D] (K and V also [B, S, H, D]), an optional additive float
 *   mask broadcasting to [B, H, S, S]; attributes num_heads, scale, tiles; output float like Q): encoder
 *   attention with bf16 products on AMX tiles or, without them, on AVX512_BF16 or AVX-512F (attention.c, attention_vectors.c;
 *   the Python side uses it only where the CPU has one of them and the build asked), or with int8 products on
 *   AVX-512 VNNI where the build asked for int8 attention (attention_quads.c); Bf16AttentionQuantized,
 *   the same with two more inputs (a float scale and a uint8 zero point) and a uint8 output, quantized as
 *   QuantizeLinear quantizes (an int8-static graph's next product's input);
 * - LayerNorm, LayerNormRows: LayerNormalization with onnxruntime's arithmetic, several rows at a time, the
 *   second also quantizing its output as QuantizeRows does (ort_norm.c, norm.c, AVX2).
 *
 * Every op runs on onnxruntime's intra-op threads (KernelContext_ParallelFor, from the version-17 table on; on
 * the calling thread alone where the runtime lacks it): no thread of hotrod's spins beside onnxruntime's.
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
#include "dots.h" /* hotrod_has_avx512 */
#include "q4gemm.h"
#include "rows.h"

#include "ort_api.h"

const Entry* hotrod_api;

typedef struct {
  int64_t n, block, threads;
  hotrod_q4_fn matmul;
} Kernel;

/* The build of the int4 kernel for `width` (512: AVX-512 VNNI, 256: AVX2), where this CPU runs it. */
static hotrod_q4_fn q4_build(int64_t width) {
  __builtin_cpu_init();
  if (width == 512 && hotrod_has_avx512() && __builtin_cpu_supports("avx512vnni")) return hotrod_q4_matmul_512;
  if (width == 256 && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return hotrod_q4_matmul_256;
  return NULL;
}

static void* create_kernel(const CustomOp* op, const Entry* table, const OrtKernelInfo* info) {
  (void)op, (void)table;
  Kernel* kernel = calloc(1, sizeof(Kernel));
  int64_t width = 0;
  if (kernel == NULL) return NULL;
  if (failed(CALL(ATTRIBUTE_INT64, AttributeFn, info, "N", &kernel->n)) ||
      failed(CALL(ATTRIBUTE_INT64, AttributeFn, info, "block", &kernel->block)) ||
      failed(CALL(ATTRIBUTE_INT64, AttributeFn, info, "threads", &kernel->threads)) ||
      failed(CALL(ATTRIBUTE_INT64, AttributeFn, info, "width", &width)) || kernel->n <= 0 ||
      kernel->block <= 0 || kernel->block % 32 != 0 || kernel->threads < 1) {
    free(kernel);
    return NULL;
  }
  kernel->matmul = q4_build(width); /* NULL for a width this CPU cannot run: compute answers NaN */
  return kernel;
}

/* Whether the packed weights, scales and bias have the shapes that A's K and the attributes call for. */
static int fits(const Kernel* kernel, int64_t k, const OrtValue* weights, const OrtValue* scales,
                const OrtValue* bias) {
  const int64_t blocks = (k + kernel->block - 1) / kernel->block;
  const int64_t padded_n = (kernel->n + HOTROD_Q4_COLS - 1) / HOTROD_Q4_COLS * HOTROD_Q4_COLS;
  int64_t w[8], s[8], b[8];
  return k > 0 && dims_of(weights, w) == 3 && w[0] == padded_n / HOTROD_Q4_COLS &&
         w[1] == blocks * kernel->block / 8 && w[2] == HOTROD_Q4_COLS * 4 && dims_of(scales, s) == 2 &&
         s[0] == blocks && s[1] == padded_n && dims_of(bias, b) == 1 && b[0] == padded_n;
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
   * answer (a build this CPU cannot run, inputs that do not fit the packed weights, memory that ran out). */
  if (kernel->matmul == NULL || x == NULL || w == NULL || s == NULL || b == NULL ||
      !fits(kernel, k, weights, scales, bias) ||
      kernel->matmul(x, rows, k, w, s, b, kernel->n, kernel->block, (int)kernel->threads, out, hotrod_run_parallel,
                     context) != 0)
    for (int64_t i = 0; i < rows * kernel->n; i++) out[i] = __builtin_nanf("");
}

void hotrod_free_kernel(void* kernel) { free(kernel); }
static const char* name(const CustomOp* op) { (void)op; return "Q4MatMul"; }
const char* hotrod_cpu_provider(const CustomOp* op) { (void)op; return "CPUExecutionProvider"; }
static int input_type(const CustomOp* op, size_t i) { (void)op; return i == 1 ? UINT8 : FLOAT; }
static size_t inputs(const CustomOp* op) { (void)op; return 4; }
int hotrod_float_type(const CustomOp* op, size_t i) { (void)op, (void)i; return FLOAT; }
size_t hotrod_one(const CustomOp* op) { (void)op; return 1; }
int hotrod_required(const CustomOp* op, size_t i) { (void)op, (void)i; return REQUIRED; }

static const CustomOp q4_matmul = {API_VERSION,       create_kernel,      name,           hotrod_cpu_provider,
                                   input_type,        inputs,             hotrod_float_type, hotrod_one,
                                   compute,           hotrod_free_kernel, hotrod_required, hotrod_required};

/* -- onnxruntime's threads ------------------------------------------------------------------- */

static const Entry* parallel_api; /* a table that has KernelContext_ParallelFor, or NULL */

/* hotrod_parallel over onnxruntime's intra-op pool (`runner` is the kernel's context). */
void hotrod_run_parallel(void* runner, hotrod_task task, void* data, size_t count) {
  if (count > 1 && parallel_api != NULL &&
      !failed(((ParallelForFn)parallel_api[PARALLEL_FOR])(runner, task, count, 0, data)))
    return;
  for (size_t i = 0; i < count; i++) task(data, i);
}

int hotrod_scalar_input(OrtKernelContext* context, size_t i, void* value, size_t size) {
  const OrtValue* in = NULL;
  int64_t d[8];
  if (failed(CALL(CONTEXT_INPUT, GetInputFn, context, i, &in))) return 0;
  const size_t rank = dims_of(in, d);
  const void* data = data_of(in);
  if (data == NULL || rank > 1 || (rank == 1 && d[0] != 1)) return 0;
  memcpy(value, data, size);
  return 1;
}

/* -- QuantizeRows ------------------------------------------------------------------------------ */

/* The op has no attributes: its kernel holds nothing (onnxruntime takes a NULL kernel for a failure). */
static int rows_kernel;

static void* create_rows(const CustomOp* op, const Entry* table, const OrtKernelInfo* info) {
  (void)op, (void)table, (void)info;
  return &rows_kernel;
}

static void destroy_rows(void* kernel) { (void)kernel; }

#define PARALLEL_VALUES (64 * 1024) /* fewer: quantized on the calling thread */

typedef struct { const float* x; uint8_t* q; float* scales; int64_t rows, k, parts; } RowsTask;

static void quantize_part(void* data, size_t index) {
  const RowsTask* t = data;
  int64_t first;
  const int64_t count = hotrod_task_rows(t->rows, t->parts, index, &first);
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
  RowsTask task = {x, qs, s, rows, k, hotrod_row_tasks(rows, k, PARALLEL_VALUES)};
  hotrod_run_parallel(context, quantize_part, &task, (size_t)task.parts);
}

static const char* rows_name(const CustomOp* op) { (void)op; return "QuantizeRows"; }
static int rows_input_type(const CustomOp* op, size_t i) { (void)op, (void)i; return FLOAT; }
static size_t rows_inputs(const CustomOp* op) { (void)op; return 1; }
int hotrod_quantized_type(const CustomOp* op, size_t i) { (void)op; return i == 0 ? UINT8 : FLOAT; }
size_t hotrod_two(const CustomOp* op) { (void)op; return 2; }
size_t hotrod_three(const CustomOp* op) { (void)op; return 3; }

static const CustomOp quantize_rows = {API_VERSION, create_rows, rows_name, hotrod_cpu_provider, rows_input_type,
                                       rows_inputs, hotrod_quantized_type, hotrod_two, compute_rows, destroy_rows,
                                       hotrod_required, hotrod_required};

/* -- Bf16Attention ----------------------------------------------------------------------------- */

/* The heads, the scale (0: 1 / sqrt(head size)) and the path (the attribute `tiles`, absent for 1: AMX's tiles where
 * granted; 2: AVX512_BF16 without tiles; 0: AVX-512F; 3: int8 on AVX-512 VNNI; fixed for the session, since the
 * paths sum in different orders). */
typedef struct { int64_t heads; float scale; int64_t tiles; } AttentionKernel;

static void* create_attention(const CustomOp* op, const Entry* table, const OrtKernelInfo* info) {
  (void)op, (void)table;
  AttentionKernel* kernel = calloc(1, sizeof(AttentionKernel));
  if (kernel == NULL) return NULL;
  if (failed(CALL(ATTRIBUTE_INT64, AttributeFn, info, "num_heads", &kernel->heads)) ||
      failed(CALL(ATTRIBUTE_FLOAT, FloatAttributeFn, info, "scale", &kernel->scale)) || kernel->heads <= 0) {
    free(kernel);
    return NULL;
  }
  if (failed(CALL(ATTRIBUTE_INT64, AttributeFn, info, "tiles", &kernel->tiles))) kernel->tiles = 1;
  if (kernel->tiles < 0 || kernel->tiles > 3) {
    free(kernel);
    return NULL;
  }
  return kernel;
}

/* K's or V's [B, S_k, W] for Q's [B, S_q, W]: as it is, or from [B, S_k, heads, W / heads] (the same values in
 * the same order); its first two dimensions, or zeros where it is neither. */
static void attention_rows(const AttentionKernel* kernel, const int64_t* q, const OrtValue* x, int64_t* rows) {
  int64_t d[8];
  const size_t count = dims_of(x, d);
  rows[0] = rows[1] = 0;
  if ((count == 3 && d[2] == q[2]) || (count == 4 && d[2] == kernel->heads && d[2] * d[3] == q[2]))
    rows[0] = d[0], rows[1] = d[1];
}

/* K's length S_k where K and V are [B, S_k, W] (or [B, S_k, heads, W / heads]) for Q's [B, S_q, W], W a multiple
 * of the heads; 0 otherwise. */
static int64_t attention_keys(const AttentionKernel* kernel, const int64_t* q, size_t count, const OrtValue* k,
                              const OrtValue* v) {
  int64_t dk[2], dv[2];
  if (count != 3 || q[2] % kernel->heads != 0) return 0;
  attention_rows(kernel, q, k, dk);
  attention_rows(kernel, q, v, dv);
  return dk[0] == q[0] && dv[0] == q[0] && dk[1] == dv[1] ? dk[1] : 0;
}

/* The attention of the context's inputs 0-3 (Q, K, V, an optional mask) into `out`, Q's dimensions in dims;
 * 0 where it was computed. */
static int attend(const AttentionKernel* kernel, OrtKernelContext* context, const int64_t* dims, size_t count,
                  const hotrod_attention_out* out) {
  const OrtValue* in[4] = {NULL, NULL, NULL, NULL};
  int64_t mask_dims[8];
  for (size_t i = 0; i < 4; i++)
    if (failed(CALL(CONTEXT_INPUT, GetInputFn, context, i, &in[i])) && i < 3) return -1;
  const int64_t keys = attention_keys(kernel, dims, count, in[1], in[2]);
  const int64_t head_size = count == 3 ? dims[2] / kernel->heads : 0; /* scale 0: 1 / sqrt(head size) */
  const size_t mask_count = in[3] == NULL ? 0 : dims_of(in[3], mask_dims);
  const float *q = data_of(in[0]), *k = data_of(in[1]), *v = data_of(in[2]);
  const float* mask = in[3] == NULL ? NULL : data_of(in[3]);
  if (keys == 0 || q == NULL || k == NULL || v == NULL || (in[3] != NULL && (mask == NULL || mask_count == 0)))
    return -1;
  return hotrod_bf16_attention(q, k, v, dims[0], dims[1], keys, kernel->heads, head_size,
                               kernel->scale != 0.0f ? kernel->scale : 1.0f / sqrtf((float)head_size), mask,
                               mask_dims, mask_count, out, (int)kernel->tiles, hotrod_run_parallel, context);
}

/* The output, shaped as Q, and its element count (0 where there is none to write). */
static void* attention_output(OrtKernelContext* context, int64_t* dims, size_t* count, int64_t* values) {
  const OrtValue* q = NULL;
  OrtValue* out = NULL;
  *values = 0;
  if (failed(CALL(CONTEXT_INPUT, GetInputFn, context, 0, &q)) || q == NULL) return NULL;
  *count = dims_of(q, dims);
  if (*count == 0 || failed(CALL(CONTEXT_OUTPUT, GetOutputFn, context, 0, dims, *count, &out))) return NULL;
  *values = 1;
  for (size_t i = 0; i < *count; i++) *values *= dims[i];
  return data_of(out);
}

static void compute_attention(void* state, OrtKernelContext* context) {
  int64_t dims[8], values;
  size_t count = 0;
  const hotrod_attention_out out = {attention_output(context, dims, &count, &values), NULL, 0.0f, 0};
  if (out.y == NULL || values == 0) return;
  /* attributes that could not be read (a graph made by hand: `tiles` not 0 to 3), inputs that do not fit, or
   * neither path here, or a mask that cannot be read: NaN, which no caller takes for an answer */
  if (state == NULL || attend(state, context, dims, count, &out) != 0)
    for (int64_t i = 0; i < values; i++) out.y[i] = __builtin_nanf("");
}

/* Bf16AttentionQuantized: the answers quantized to uint8 with the scale and zero point of inputs 4 and 5. */
static void compute_attention_quantized(void* state, OrtKernelContext* context) {
  int64_t dims[8], values;
  size_t count = 0;
  uint8_t zero_point = 0;
  hotrod_attention_out out = {NULL, attention_output(context, dims, &count, &values), 0.0f, 0};
  if (out.q == NULL || values == 0) return;
  const int read = hotrod_scalar_input(context, 4, &out.scale, sizeof(out.scale)) &&
                   hotrod_scalar_input(context, 5, &zero_point, 1);
  out.zero_point = zero_point;
  /* as Bf16Attention's NaN: the zero point, where nothing was computed */
  if (!read || state == NULL || attend(state, context, dims, count, &out) != 0)
    memset(out.q, zero_point, (size_t)values);
}

static const char* attention_name(const CustomOp* op) { (void)op; return "Bf16Attention"; }
static size_t four(const CustomOp* op) { (void)op; return 4; }
static int mask_optional(const CustomOp* op, size_t i) { (void)op; return i == 3 ? OPTIONAL : REQUIRED; }

static const CustomOp bf16_attention = {API_VERSION,       create_attention,   attention_name, hotrod_cpu_provider,
                                        hotrod_float_type, four,               hotrod_float_type, hotrod_one,
                                        compute_attention, hotrod_free_kernel, mask_optional,  hotrod_required};

static const char* quantized_name(const CustomOp* op) { (void)op; return "Bf16AttentionQuantized"; }
static int quantized_input_type(const CustomOp* op, size_t i) { (void)op; return i == 5 ? UINT8 : FLOAT; }
static size_t six(const CustomOp* op) { (void)op; return 6; }
static int uint8_type(const CustomOp* op, size_t i) { (void)op, (void)i; return UINT8; }

static const CustomOp bf16_attention_quantized = {
    API_VERSION,       create_attention, quantized_name,     hotrod_cpu_provider,         quantized_input_type, six,
    uint8_type,        hotrod_one,       compute_attention_quantized, hotrod_free_kernel, mask_optional,
    hotrod_required};

/* -- registration ----------------------------------------------------------------------------- */

typedef OrtStatus* (*CreateDomainFn)(const char*, OrtCustomOpDomain**);
typedef OrtStatus* (*DomainAddFn)(OrtCustomOpDomain*, const CustomOp*);
typedef OrtStatus* (*AddDomainFn)(OrtSessionOptions*, OrtCustomOpDomain*);

/* Called by onnxruntime when a session's options load this library. The domain is kept for the process's
 * life, as onnxruntime's own custom-op libraries keep theirs. */
OrtStatus* RegisterCustomOps(OrtSessionOptions* options, const ApiBase* base) {
  hotrod_api = base->GetApi(API_VERSION);
  if (hotrod_api == NULL) return NULL;  /* cannot happen: every onnxruntime since 1.8 serves version 8 */
  parallel_api = base->GetApi(PARALLEL_API_VERSION);
  OrtCustomOpDomain* domain = NULL;
  OrtStatus* status = CALL(CREATE_DOMAIN, CreateDomainFn, "hotrod", &domain);
  if (status == NULL) status = CALL(DOMAIN_ADD, DomainAddFn, domain, &q4_matmul);
  if (status == NULL) status = CALL(DOMAIN_ADD, DomainAddFn, domain, &quantize_rows);
  if (status == NULL) status = CALL(DOMAIN_ADD, DomainAddFn, domain, &hotrod_int8_matmul);
  if (status == NULL) status = CALL(DOMAIN_ADD, DomainAddFn, domain, &hotrod_int8_matmul_split);
  if (status == NULL) status = CALL(DOMAIN_ADD, DomainAddFn, domain, &hotrod_int8_matmul_rows);
  if (status == NULL) status = CALL(DOMAIN_ADD, DomainAddFn, domain, &hotrod_int8_matmul_quantized);
  if (status == NULL) status = CALL(DOMAIN_ADD, DomainAddFn, domain, &hotrod_bf16_matmul_op);
  if (status == NULL) status = CALL(DOMAIN_ADD, DomainAddFn, domain, &hotrod_bf16_matmul_split_op);
  if (status == NULL) status = CALL(DOMAIN_ADD, DomainAddFn, domain, &hotrod_bf16_matmul_rounded_op);
  if (status == NULL) status = CALL(DOMAIN_ADD, DomainAddFn, domain, &bf16_attention);
  if (status == NULL) status = CALL(DOMAIN_ADD, DomainAddFn, domain, &bf16_attention_quantized);
  if (status == NULL) status = CALL(DOMAIN_ADD, DomainAddFn, domain, &hotrod_layer_norm_op);
  if (status == NULL) status = CALL(DOMAIN_ADD, DomainAddFn, domain, &hotrod_layer_norm_rows_op);
  if (status == NULL) status = CALL(DOMAIN_ADD, DomainAddFn, domain, &hotrod_layer_norm_fixed_op);
  if (status == NULL) status = CALL(DOMAIN_ADD, DomainAddFn, domain, &hotrod_layer_norm_rounded_op);
  if (status == NULL) status = CALL(ADD_DOMAIN, AddDomainFn, options, domain);
  return status;
}
