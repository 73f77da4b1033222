/* hotrod's LayerNormalization ops (norm.c), registered by ort_op.c in the domain "hotrod":
 * - LayerNorm (inputs: X float [..., K], gamma and beta float [K]; attribute epsilon; output float like X):
 *   ONNX's LayerNormalization over the last axis with onnxruntime's arithmetic, K a multiple of 8;
 * - LayerNormRows: the same, with each row of the output also quantized for the next product as QuantizeRows
 *   does: outputs float like X, uint8 like X, float scales [..., 1];
 * - LayerNormQuantized: the same, the output also quantized as a calibrated QuantizeLinear does (inputs 3 and 4:
 *   its one scale and uint8 zero point; rows.h): outputs float like X, uint8 like X;
 * - LayerNormRounded: the same, the output also rounded to bf16 as the next bf16 product rounds its rows
 *   (bf16gemm.h): outputs float like X, bf16 like X.
 * Rows are split among onnxruntime's intra-op threads. A version-8 op cannot return an error: inputs that do not
 * fit give NaN, which no caller takes for an answer.
 */
#include <stdlib.h>
#include <string.h>

#include "bf16gemm.h"
#include "norm.h"
#include "ort_api.h"
#include "rows.h"

/* epsilon, and what the op makes of its output too: quantized per row (LayerNormRows: three outputs), with one
 * scale (LayerNormQuantized: two), rounded to bf16 (LayerNormRounded: two, the second bf16), or nothing */
typedef struct { float epsilon; int quantize, fixed, rounded; } NormKernel;

static void* create_norm(const CustomOp* op, const Entry* table, const OrtKernelInfo* info) {
  (void)table;
  NormKernel* kernel = calloc(1, sizeof(NormKernel));
  if (kernel == NULL) return NULL;
  kernel->quantize = op->GetOutputTypeCount(op) == 3;
  kernel->rounded = op->GetOutputTypeCount(op) == 2 && op->GetOutputType(op, 1) == BFLOAT16;
  kernel->fixed = op->GetOutputTypeCount(op) == 2 && !kernel->rounded;
  if (failed(CALL(ATTRIBUTE_FLOAT, FloatAttributeFn, info, "epsilon", &kernel->epsilon))) {
    free(kernel);
    return NULL;
  }
  return kernel;
}

#define PARALLEL_VALUES (32 * 1024) /* fewer: normalized on the calling thread */

typedef struct {
  const float *x, *gamma, *beta;
  float epsilon;
  float* y;
  uint8_t* q;
  float* scales;
  int64_t rows, k, parts;
  uint8_t* fixed; /* where given: the output quantized with one scale and zero point, into it */
  float scale;
  int32_t zero_point;
  uint16_t* rounded; /* where given: the output rounded to bf16, into it */
} NormTask;

static void normalize_part(void* data, size_t index) {
  const NormTask* t = data;
  int64_t first;
  const int64_t count = hotrod_task_rows(t->rows, t->parts, index, &first), at = first * t->k;
  const hotrod_norm_fixed fixed = {t->fixed != NULL ? t->fixed + at : NULL, t->scale, t->zero_point,
                                   t->rounded != NULL ? t->rounded + at : NULL};
  hotrod_layer_norm(t->x + at, count, t->k, t->gamma, t->beta, t->epsilon, t->y + at, t->q ? t->q + at : NULL,
                    t->scales ? t->scales + first : NULL, t->fixed != NULL || t->rounded != NULL ? &fixed : NULL);
}

/* Whether gamma and beta are [K] for X's last dimension K, a multiple of 8. */
static int norm_fits(int64_t k, const OrtValue* gamma, const OrtValue* beta) {
  int64_t g[8], b[8];
  return k > 0 && k % 8 == 0 && dims_of(gamma, g) == 1 && g[0] == k && dims_of(beta, b) == 1 && b[0] == k;
}

static void compute_norm(void* state, OrtKernelContext* context) {
  const NormKernel* kernel = state;
  const OrtValue *in[3] = {NULL, NULL, NULL};
  OrtValue *y = NULL, *q = NULL, *scales = NULL;
  int64_t dims[8];
  for (size_t i = 0; i < 3; i++)
    if (failed(CALL(CONTEXT_INPUT, GetInputFn, context, i, &in[i]))) return;
  const size_t count = dims_of(in[0], dims);
  if (count == 0) return;
  int64_t rows = 1;
  const int64_t k = dims[count - 1];
  for (size_t i = 0; i + 1 < count; i++) rows *= dims[i];
  /* every output asked for first, so that an empty input still makes all of them */
  int made = !failed(CALL(CONTEXT_OUTPUT, GetOutputFn, context, 0, dims, count, &y));
  if (kernel->quantize || kernel->fixed || kernel->rounded)
    made = made && !failed(CALL(CONTEXT_OUTPUT, GetOutputFn, context, 1, dims, count, &q));
  if (kernel->quantize) {
    dims[count - 1] = 1;
    made = made && !failed(CALL(CONTEXT_OUTPUT, GetOutputFn, context, 2, dims, count, &scales));
  }
  float* out = y == NULL ? NULL : data_of(y);
  if (out == NULL || rows * k == 0) return;
  NormTask task = {data_of(in[0]), data_of(in[1]), data_of(in[2]), kernel->epsilon, out, NULL, NULL, rows, k, 1,
                   NULL, 0.0f, 0, NULL};
  if (kernel->rounded && (task.rounded = q == NULL ? NULL : data_of(q)) == NULL) made = 0;
  if (kernel->quantize) {
    task.q = q == NULL ? NULL : data_of(q), task.scales = scales == NULL ? NULL : data_of(scales);
    if (task.q == NULL || task.scales == NULL) made = 0;
  }
  uint8_t zero_point = 0;
  if (kernel->fixed) {
    task.fixed = q == NULL ? NULL : data_of(q);
    made = made && task.fixed != NULL && hotrod_scalar_input(context, 3, &task.scale, sizeof(task.scale)) &&
           hotrod_scalar_input(context, 4, &zero_point, 1);
    task.zero_point = zero_point;
  }
  if (!made || task.x == NULL || task.gamma == NULL || task.beta == NULL || !norm_fits(k, in[1], in[2])) {
    for (int64_t i = 0; i < rows * k; i++) out[i] = __builtin_nanf("");
    for (int64_t r = 0; task.scales != NULL && r < rows; r++) task.scales[r] = __builtin_nanf("");
    /* a quantized output has no NaN: the zero point throughout, what zeros quantize to, beside NaN floats */
    if (task.fixed != NULL) memset(task.fixed, zero_point, (size_t)(rows * k));
    for (int64_t i = 0; task.rounded != NULL && i < rows * k; i++) task.rounded[i] = 0x7FC0; /* bf16 NaN */
    return;
  }
  task.parts = hotrod_row_tasks(rows, k, PARALLEL_VALUES);
  hotrod_run_parallel(context, normalize_part, &task, (size_t)task.parts);
}

static const char* norm_name(const CustomOp* op) { (void)op; return "LayerNorm"; }
static const char* norm_rows_name(const CustomOp* op) { (void)op; return "LayerNormRows"; }
static int norm_rows_type(const CustomOp* op, size_t i) { (void)op; return i == 1 ? UINT8 : FLOAT; }

const CustomOp hotrod_layer_norm_op = {API_VERSION,       create_norm,        norm_name,         hotrod_cpu_provider,
                                       hotrod_float_type, hotrod_three,       hotrod_float_type, hotrod_one,
                                       compute_norm,      hotrod_free_kernel, hotrod_required,   hotrod_required};

const CustomOp hotrod_layer_norm_rows_op = {API_VERSION,       create_norm,        norm_rows_name, hotrod_cpu_provider,
                                            hotrod_float_type, hotrod_three,       norm_rows_type, hotrod_three,
                                            compute_norm,      hotrod_free_kernel, hotrod_required, hotrod_required};

static const char* norm_fixed_name(const CustomOp* op) { (void)op; return "LayerNormQuantized"; }
static int norm_fixed_input_type(const CustomOp* op, size_t i) { (void)op; return i == 4 ? UINT8 : FLOAT; }
static size_t five(const CustomOp* op) { (void)op; return 5; }

const CustomOp hotrod_layer_norm_fixed_op = {
    API_VERSION,          create_norm,  norm_fixed_name, hotrod_cpu_provider, norm_fixed_input_type, five,
    norm_rows_type,       hotrod_two,   compute_norm,    hotrod_free_kernel,  hotrod_required,       hotrod_required};

static const char* norm_rounded_name(const CustomOp* op) { (void)op; return "LayerNormRounded"; }
static int norm_rounded_type(const CustomOp* op, size_t i) { (void)op; return i == 1 ? BFLOAT16 : FLOAT; }

const CustomOp hotrod_layer_norm_rounded_op = {
    API_VERSION,       create_norm,  norm_rounded_name, hotrod_cpu_provider, hotrod_float_type, hotrod_three,
    norm_rounded_type, hotrod_two,   compute_norm,      hotrod_free_kernel,  hotrod_required,   hotrod_required};
