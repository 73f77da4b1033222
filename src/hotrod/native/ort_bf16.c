/* hotrod's bf16 product ops on AMX (bf16gemm.c), registered by ort_op.c in the domain "hotrod":
 * - Bf16MatMul (inputs: X float [..., K], or bf16 rounded already by the product before (Bf16MatMulRounded's
 *   output, K a multiple of 32), the packed bf16 weights [N' / 32, K' / 32, 1024] (K' and N' padded to
 *   32), the float bias [N'], an optional residual; attributes N and an optional `activation`, 1 for GELU after
 *   the bias as onnxruntime's Gelu computes it; output float [..., N], or the residual's broadcast shape): the
 *   residual is added last, in the epilogue where it has the product's shape;
 * - Bf16MatMulSplit: the same without a residual, its columns in three outputs of N / 3 each (a fused Q/K/V
 *   product's);
 * - Bf16MatMulRounded: the same without a residual, its output rounded to bf16 [..., N] (N a multiple of 32) for
 *   the one product that reads it, which would round it so.
 * The Python side uses them only where the CPU has AMX-BF16 and the graph's build asked for bf16 products
 * (`hotrod.runtime.bf16`). A version-8 op cannot return an error: inputs that do not fit give NaN, which no caller
 * takes for an answer.
 */
#include <stdlib.h>
#include <string.h>

#include "bf16gemm.h"
#include "ort_api.h"

/* N, the outputs its columns are split into, the activation its epilogue applies, its path (the attribute `tiles`,
 * absent for 1: AMX's tiles where granted; 0: AVX-512 BF16; fixed for the session, since the two sum in different
 * orders), and whether its output is rounded to bf16 (Bf16MatMulRounded). */
typedef struct { int64_t n, parts, activation, tiles; int rounded; } Bf16Kernel;

static void* create_bf16(const CustomOp* op, const Entry* table, const OrtKernelInfo* info) {
  (void)table;
  Bf16Kernel* kernel = calloc(1, sizeof(Bf16Kernel));
  if (kernel == NULL) return NULL;
  kernel->parts = (int64_t)op->GetOutputTypeCount(op);
  kernel->rounded = op->GetOutputType(op, 0) == BFLOAT16;
  if (failed(CALL(ATTRIBUTE_INT64, AttributeFn, info, "activation", &kernel->activation)))
    kernel->activation = HOTROD_I8_LINEAR;
  if (failed(CALL(ATTRIBUTE_INT64, AttributeFn, info, "tiles", &kernel->tiles))) kernel->tiles = 1;
  if (failed(CALL(ATTRIBUTE_INT64, AttributeFn, info, "N", &kernel->n)) || kernel->n <= 0 ||
      kernel->n % kernel->parts != 0 || (kernel->parts > 1 && kernel->n / kernel->parts % 16 != 0) ||
      kernel->activation < HOTROD_I8_LINEAR || kernel->activation > HOTROD_I8_GELU || kernel->tiles < 0 ||
      kernel->tiles > 1 ||
      (kernel->rounded && kernel->n % HOTROD_BF16_DEPTH != 0)) {
    free(kernel);
    return NULL;
  }
  return kernel;
}

/* Whether the packed weights and bias fit a depth of k and N. */
static int bf16_fits(int64_t n, int64_t k, const OrtValue* w, const OrtValue* bias) {
  const int64_t padded_n = (n + HOTROD_BF16_COLS - 1) / HOTROD_BF16_COLS * HOTROD_BF16_COLS;
  const int64_t padded_k = (k + HOTROD_BF16_DEPTH - 1) / HOTROD_BF16_DEPTH * HOTROD_BF16_DEPTH;
  int64_t d[8];
  if (k <= 0 || dims_of(w, d) != 3 || d[0] != padded_n / HOTROD_BF16_COLS || d[1] != padded_k / HOTROD_BF16_DEPTH ||
      d[2] != HOTROD_BF16_COLS * HOTROD_BF16_DEPTH)
    return 0;
  return dims_of(bias, d) == 1 && d[0] == padded_n;
}

static void compute_bf16(void* state, OrtKernelContext* context) {
  const Bf16Kernel* kernel = state;
  if (kernel == NULL) return; /* attributes that could not be read (a graph made by hand): no output */
  const OrtValue* in[4] = {NULL};
  for (size_t i = 0; i < 3; i++)
    if (failed(CALL(CONTEXT_INPUT, GetInputFn, context, i, &in[i]))) return;
  if (kernel->parts == 1 && !kernel->rounded && failed(CALL(CONTEXT_INPUT, GetInputFn, context, 3, &in[3])))
    in[3] = NULL;
  int64_t dims[8], out_dims[8], residual_dims[8];
  const size_t count = dims_of(in[0], dims);
  if (count == 0) return;
  const int64_t k = dims[count - 1], width = kernel->n / kernel->parts;
  int64_t rows = 1;
  for (size_t i = 0; i + 1 < count; i++) rows *= dims[i];
  const int type = type_of(in[0]);
  const void* x = data_of(in[0]);
  const float* bias = data_of(in[2]);
  const uint16_t* w = data_of(in[1]);
  int fits = bf16_fits(kernel->n, k, in[1], in[2]) && x != NULL && w != NULL && bias != NULL &&
             (type == FLOAT || (type == BFLOAT16 && k % HOTROD_BF16_DEPTH == 0));
  dims[count - 1] = width;
  memcpy(out_dims, dims, sizeof(dims));
  size_t out_count = count;
  const float* residual = NULL;
  int residual_rank = -1, fused = 0;
  if (in[3] != NULL) {
    residual_rank = rank_of(in[3], residual_dims);
    residual = data_of(in[3]);
    fused = residual_rank == (int)count && memcmp(residual_dims, dims, count * sizeof(int64_t)) == 0;
    if (residual == NULL || residual_rank < 0 ||
        (!fused && !hotrod_broadcast(dims, count, residual_dims, (size_t)residual_rank, out_dims, &out_count)))
      fits = 0;
  }
  int64_t values = 1;
  for (size_t i = 0; i < out_count; i++) values *= out_dims[i];
  void* out[3] = {NULL, NULL, NULL};
  for (int64_t i = 0; i < kernel->parts; i++) {
    OrtValue* y = NULL;
    if (failed(CALL(CONTEXT_OUTPUT, GetOutputFn, context, (size_t)i, out_dims, out_count, &y)) ||
        (out[i] = data_of(y)) == NULL)
      return;
  }
  if (kernel->rounded) {
    /* inputs that do not fit (or neither path runs here, or memory that ran out): bf16 NaN, which no caller takes
     * for an answer */
    if (!fits || hotrod_bf16_matmul(type == FLOAT ? x : NULL, type == BFLOAT16 ? x : NULL, rows, k, w, bias, kernel->n,
                                    NULL, out[0], 1, (int)kernel->activation, NULL, (int)kernel->tiles,
                                    hotrod_run_parallel, context) != 0)
      for (int64_t j = 0; j < values; j++) ((uint16_t*)out[0])[j] = 0x7FC0;
    return;
  }
  const int later = residual != NULL && !fused;
  float* product = later ? malloc((size_t)(rows * width) * sizeof(float)) : NULL;
  /* inputs that do not fit the packed weights (or neither path runs here, or memory that ran out): NaN, which no caller
   * takes for an answer */
  if (!fits || (later && product == NULL) ||
      hotrod_bf16_matmul(type == FLOAT ? x : NULL, type == BFLOAT16 ? x : NULL, rows, k, w, bias, kernel->n,
                         later ? &product : (float* const*)out, NULL, kernel->parts, (int)kernel->activation,
                         fused ? residual : NULL, (int)kernel->tiles, hotrod_run_parallel, context) != 0) {
    for (int64_t i = 0; i < kernel->parts; i++)
      for (int64_t j = 0; j < values; j++) ((float*)out[i])[j] = __builtin_nanf("");
  } else if (later) {
    hotrod_add_broadcast(product, dims, count, residual, residual_dims, (size_t)residual_rank, out[0], out_dims,
                         out_count);
  }
  free(product);
}

static const char* bf16_name(const CustomOp* op) { (void)op; return "Bf16MatMul"; }
static const char* bf16_split_name(const CustomOp* op) { (void)op; return "Bf16MatMulSplit"; }
static const char* bf16_rounded_name(const CustomOp* op) { (void)op; return "Bf16MatMulRounded"; }
/* the rows float, or bf16 rounded by the product before */
static int bf16_input_type(const CustomOp* op, size_t i) {
  (void)op;
  return i == 0 ? ANY_TYPE : i == 1 ? BFLOAT16 : FLOAT;
}
static int bf16_type(const CustomOp* op, size_t i) { (void)op, (void)i; return BFLOAT16; }
static size_t bf16_inputs(const CustomOp* op) { (void)op; return 3; }
static size_t bf16_residual_inputs(const CustomOp* op) { (void)op; return 4; }
static int residual_optional(const CustomOp* op, size_t i) { (void)op; return i == 3 ? OPTIONAL : REQUIRED; }

const CustomOp hotrod_bf16_matmul_op = {API_VERSION,     create_bf16,          bf16_name,         hotrod_cpu_provider,
                                        bf16_input_type, bf16_residual_inputs, hotrod_float_type, hotrod_one,
                                        compute_bf16,    hotrod_free_kernel,   residual_optional, hotrod_required};
const CustomOp hotrod_bf16_matmul_split_op = {
    API_VERSION,       create_bf16,  bf16_split_name, hotrod_cpu_provider, bf16_input_type,   bf16_inputs,
    hotrod_float_type, hotrod_three, compute_bf16,    hotrod_free_kernel,  hotrod_required,   hotrod_required};
const CustomOp hotrod_bf16_matmul_rounded_op = {
    API_VERSION, create_bf16, bf16_rounded_name, hotrod_cpu_provider, bf16_input_type,   bf16_inputs,
    bf16_type,   hotrod_one,  compute_bf16,      hotrod_free_kernel,  hotrod_required,   hotrod_required};
