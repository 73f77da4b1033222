/* hotrod's onnxruntime custom ops, registered by `RegisterCustomOps` in the domain "hotrod":
 * - Q4MatMul (inputs: A float [..., K], the packed weights, their scales, a bias; attributes N, block,
 *   threads; output float [..., N]): int4 products (q4gemm.c, AVX-512 VNNI; the Python side uses it only
 *   where the CPU has those instructions);
 * - QuantizeRows (input: X float [..., K]; outputs: uint8 [..., K], float scales [..., 1]): per-row int8
 *   quantization of a product's input in one pass (rows.c, AVX2).
 *
 * onnxruntime's C API is a table of function pointers whose order is fixed (new entries are only ever
 * appended), and a library asks for the table of the version it was written against. This one asks for
 * version 8 and declares the few entries it calls by their positions in that table, with their types,
 * so it builds without onnxruntime's headers, which its Python package does not carry.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

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

/* -- QuantizeRows ------------------------------------------------------------------------------ */

/* The op has no attributes: its kernel holds nothing (onnxruntime takes a NULL kernel for a failure). */
static int rows_kernel;

static void* create_rows(const CustomOp* op, const Entry* table, const OrtKernelInfo* info) {
  (void)op, (void)table, (void)info;
  return &rows_kernel;
}

static void destroy_rows(void* kernel) { (void)kernel; }

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
  hotrod_quantize_rows(x, rows, k, qs, s);
}

static const char* rows_name(const CustomOp* op) { (void)op; return "QuantizeRows"; }
static int rows_input_type(const CustomOp* op, size_t i) { (void)op, (void)i; return FLOAT; }
static size_t rows_inputs(const CustomOp* op) { (void)op; return 1; }
static int rows_output_type(const CustomOp* op, size_t i) { (void)op; return i == 0 ? UINT8 : FLOAT; }
static size_t rows_outputs(const CustomOp* op) { (void)op; return 2; }

static const CustomOp quantize_rows = {API_VERSION, create_rows, rows_name, provider, rows_input_type, rows_inputs,
                                       rows_output_type, rows_outputs, compute_rows, destroy_rows, required, required};

/* -- registration ----------------------------------------------------------------------------- */

typedef OrtStatus* (*CreateDomainFn)(const char*, OrtCustomOpDomain**);
typedef OrtStatus* (*DomainAddFn)(OrtCustomOpDomain*, const CustomOp*);
typedef OrtStatus* (*AddDomainFn)(OrtSessionOptions*, OrtCustomOpDomain*);

/* Called by onnxruntime when a session's options load this library. The domain is kept for the process's
 * life, as onnxruntime's own custom-op libraries keep theirs. */
OrtStatus* RegisterCustomOps(OrtSessionOptions* options, const ApiBase* base) {
  api = base->GetApi(API_VERSION);
  if (api == NULL) return NULL;  /* cannot happen: every onnxruntime since 1.8 serves version 8 */
  OrtCustomOpDomain* domain = NULL;
  OrtStatus* status = CALL(CREATE_DOMAIN, CreateDomainFn, "hotrod", &domain);
  if (status == NULL) status = CALL(DOMAIN_ADD, DomainAddFn, domain, &q4_matmul);
  if (status == NULL) status = CALL(DOMAIN_ADD, DomainAddFn, domain, &quantize_rows);
  if (status == NULL) status = CALL(ADD_DOMAIN, AddDomainFn, options, domain);
  return status;
}
