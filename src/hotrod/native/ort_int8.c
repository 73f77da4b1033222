/* hotrod's int8 product ops on AMX (i8gemm.c), registered by ort_op.c in the domain "hotrod":
 * - Int8MatMul (inputs: Q uint8 [..., K] and its row scales [..., 1] from QuantizeRows, or one scale [1] for
 *   every row (a calibrated graph's: its static scale taken into the column scales, and 1 here), the packed int8
 *   weights, int32 zero-point offsets, float column scales and bias, an optional residual; attributes N and an
 *   optional `activation`, 1 for GELU after the bias as onnxruntime's Gelu computes it; output float
 *   [..., N], or the residual's broadcast shape): the residual is added last, in the epilogue where it has the
 *   product's shape;
 * - Int8MatMulRows: the same (no residual) with its output quantized per row as QuantizeRows would, for the
 *   next product: outputs uint8 [..., N] and float scales [..., 1];
 * - Int8MatMulSplit: the same as Int8MatMul (no residual) with its columns in three outputs of N / 3 each (a
 *   fused Q/K/V product's).
 * The Python side uses them only where the CPU has AMX (`hotrod.runtime.i8`). A version-8 op cannot return an
 * error: inputs that do not fit give NaN, which no caller takes for an answer.
 */
#include <stdlib.h>
#include <string.h>

#include "i8gemm.h"
#include "ort_api.h"

/* -- Int8MatMul, Int8MatMulRows, Int8MatMulSplit ---------------------------------------------- */

/* N, the outputs its columns are split into (1: Int8MatMul and Int8MatMulRows, 3: Int8MatMulSplit), the
 * activation its epilogue applies (the attribute `activation`, absent for none: HOTROD_I8_LINEAR or
 * HOTROD_I8_GELU), and its path (the attribute `tiles`, absent for 1: AMX's tiles where granted; 0: AVX-512
 * VNNI), fixed for the session so that one graph never mixes them. */
typedef struct { int64_t n, parts, activation, tiles; } Int8Kernel;

static void* create_int8(const CustomOp* op, const Entry* table, const OrtKernelInfo* info) {
  (void)table;
  Int8Kernel* kernel = calloc(1, sizeof(Int8Kernel));
  if (kernel == NULL) return NULL;
  /* float outputs are the product's parts; Int8MatMulRows's two (q, scales) are one product's */
  kernel->parts = op->GetOutputType(op, 0) == FLOAT ? (int64_t)op->GetOutputTypeCount(op) : 1;
  if (failed(CALL(ATTRIBUTE_INT64, AttributeFn, info, "activation", &kernel->activation)))
    kernel->activation = HOTROD_I8_LINEAR;
  if (failed(CALL(ATTRIBUTE_INT64, AttributeFn, info, "tiles", &kernel->tiles))) kernel->tiles = 1;
  if (failed(CALL(ATTRIBUTE_INT64, AttributeFn, info, "N", &kernel->n)) || kernel->n <= 0 ||
      kernel->n % kernel->parts != 0 || (kernel->parts > 1 && kernel->n / kernel->parts % 16 != 0) ||
      kernel->activation < HOTROD_I8_LINEAR || kernel->activation > HOTROD_I8_GELU || kernel->tiles < 0 ||
      kernel->tiles > 1) {
    free(kernel);
    return NULL;
  }
  return kernel;
}

/* Whether the row scales [..., 1] are one per row of Q (0), or one for all rows ([1]: 1); -1 where neither. */
static int shared_scale(const int64_t* q, size_t count, const OrtValue* scales) {
  int64_t d[8];
  const size_t rank = dims_of(scales, d);
  if (rank == 1 && d[0] == 1) return 1;
  if (rank != count || d[count - 1] != 1) return -1;
  for (size_t i = 0; i + 1 < count; i++)
    if (d[i] != q[i]) return -1;
  return 0;
}

/* Whether the row scales (`shared`: shared_scale's answer), packed weights, offsets, column scales and bias fit Q's
 * shape and N. */
static int int8_fits(int64_t n, const int64_t* q, size_t count, const OrtValue* const* in, int shared) {
  const int64_t k = q[count - 1], padded_n = (n + HOTROD_I8_COLS - 1) / HOTROD_I8_COLS * HOTROD_I8_COLS;
  int64_t d[8];
  if (k <= 0 || k % HOTROD_I8_DEPTH != 0 || shared < 0) return 0;
  if (dims_of(in[2], d) != 3 || d[0] != padded_n / HOTROD_I8_COLS || d[1] != k / HOTROD_I8_DEPTH ||
      d[2] != HOTROD_I8_COLS * HOTROD_I8_DEPTH)
    return 0;
  for (int i = 3; i < 6; i++)
    if (dims_of(in[i], d) != 1 || d[0] != padded_n) return 0;
  return 1;
}

int hotrod_broadcast(const int64_t* a, size_t na, const int64_t* b, size_t nb, int64_t* out, size_t* n) {
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

void hotrod_add_broadcast(const float* a, const int64_t* ad, size_t na, const float* b, const int64_t* bd, size_t nb,
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

/* One call's inputs (their data: NULL where unreadable), the product's own shape (its outputs' `dims`, `count`
 * of them, `rows` x `width` values), and where it adds an optional residual (input 6): in the epilogue where the
 * residual has that shape, after it where the residual broadcasts otherwise (`out_dims`: the sum's shape).
 * `fits`: every input readable and of a shape the packed weights and N call for. `scale_stride`: 1 for a scale
 * per row, 0 for one shared by every row. */
typedef struct {
  void* data[6];
  int64_t scale_stride;
  int64_t dims[8], out_dims[8], residual_dims[8], rows, k, width;
  size_t count, out_count; /* count 0: the inputs could not be had */
  int residual_rank;       /* -1: none */
  const float* residual;
  int fused, fits;
} Int8Call;

static Int8Call int8_call(const Int8Kernel* kernel, OrtKernelContext* context, int with_residual) {
  Int8Call c = {.residual_rank = -1};
  const OrtValue* in[7] = {NULL};
  for (size_t i = 0; i < 6; i++)
    if (failed(CALL(CONTEXT_INPUT, GetInputFn, context, i, &in[i]))) return c;
  if (with_residual && failed(CALL(CONTEXT_INPUT, GetInputFn, context, 6, &in[6]))) in[6] = NULL;
  c.count = dims_of(in[0], c.dims);
  if (c.count == 0) return c;
  c.k = c.dims[c.count - 1];
  c.rows = 1;
  for (size_t i = 0; i + 1 < c.count; i++) c.rows *= c.dims[i];
  const int shared = shared_scale(c.dims, c.count, in[1]);
  c.fits = int8_fits(kernel->n, c.dims, c.count, in, shared);
  c.scale_stride = shared == 1 ? 0 : 1;
  for (int i = 0; i < 6; i++)
    if ((c.data[i] = data_of(in[i])) == NULL) c.fits = 0;
  c.width = kernel->n / kernel->parts;
  c.dims[c.count - 1] = c.width;
  memcpy(c.out_dims, c.dims, sizeof(c.dims));
  c.out_count = c.count;
  if (in[6] == NULL) return c;
  c.residual_rank = rank_of(in[6], c.residual_dims);
  c.residual = data_of(in[6]);
  c.fused = c.residual_rank == (int)c.count && memcmp(c.residual_dims, c.dims, c.count * sizeof(int64_t)) == 0;
  if (c.residual == NULL || c.residual_rank < 0 ||
      (!c.fused &&
       !hotrod_broadcast(c.dims, c.count, c.residual_dims, (size_t)c.residual_rank, c.out_dims, &c.out_count)))
    c.fits = 0;
  return c;
}

static void compute_int8(void* state, OrtKernelContext* context) {
  const Int8Kernel* kernel = state;
  if (kernel == NULL) return; /* attributes that could not be read (a graph made by hand): no output */
  Int8Call c = int8_call(kernel, context, kernel->parts == 1);
  if (c.count == 0) return;
  int64_t values = 1;
  for (size_t i = 0; i < c.out_count; i++) values *= c.out_dims[i];
  float* out[3] = {NULL, NULL, NULL};
  for (int64_t i = 0; i < kernel->parts; i++) {
    OrtValue* y = NULL;
    if (failed(CALL(CONTEXT_OUTPUT, GetOutputFn, context, (size_t)i, c.out_dims, c.out_count, &y)) ||
        (out[i] = data_of(y)) == NULL)
      values = 0;
  }
  if (values == 0) return;
  const int later = c.residual != NULL && !c.fused;
  float* product = later ? malloc((size_t)(c.rows * c.width) * sizeof(float)) : NULL;
  float* const* targets = later ? &product : out;
  /* inputs that do not fit the packed weights (or neither path runs here, or memory that ran out): NaN, which no caller
   * takes for an answer */
  if (!c.fits || (later && product == NULL) ||
      hotrod_i8_matmul(c.data[0], c.data[1], c.scale_stride, c.rows, c.k, c.data[2], c.data[3], c.data[4], c.data[5],
                       kernel->n, targets, kernel->parts, (int)kernel->activation, c.fused ? c.residual : NULL,
                       (int)kernel->tiles, hotrod_run_parallel, context) != 0) {
    for (int64_t i = 0; i < kernel->parts; i++)
      for (int64_t j = 0; j < values; j++) out[i][j] = __builtin_nanf("");
  } else if (later) {
    hotrod_add_broadcast(product, c.dims, c.count, c.residual, c.residual_dims, (size_t)c.residual_rank, out[0],
                         c.out_dims, c.out_count);
  }
  free(product);
}

/* Int8MatMulRows: Int8MatMul's product (no residual) as the next product's quantized rows and their scales. */
static void compute_int8_rows(void* state, OrtKernelContext* context) {
  const Int8Kernel* kernel = state;
  if (kernel == NULL) return; /* as compute_int8 */
  const Int8Call c = int8_call(kernel, context, 0);
  if (c.count == 0) return;
  int64_t dims[8];
  memcpy(dims, c.dims, sizeof(dims));
  OrtValue *q = NULL, *scales = NULL;
  uint8_t* qs = NULL;
  float* s = NULL;
  if (!failed(CALL(CONTEXT_OUTPUT, GetOutputFn, context, 0, dims, c.count, &q))) {
    dims[c.count - 1] = 1;
    if (!failed(CALL(CONTEXT_OUTPUT, GetOutputFn, context, 1, dims, c.count, &scales)))
      qs = data_of(q), s = data_of(scales);
  }
  /* inputs that do not fit (or neither path runs here, or memory that ran out): NaN scales, which no caller takes
   * for an answer (the next product multiplies by them) */
  if (c.rows > 0 && s != NULL &&
      (!c.fits || qs == NULL ||
       hotrod_i8_matmul_rows(c.data[0], c.data[1], c.scale_stride, c.rows, c.k, c.data[2], c.data[3], c.data[4],
                             c.data[5], kernel->n, (int)kernel->activation, qs, s, (int)kernel->tiles,
                             hotrod_run_parallel, context) != 0))
    for (int64_t r = 0; r < c.rows; r++) s[r] = __builtin_nanf("");
}

/* Int8MatMulQuantized: Int8MatMul's product (no residual) quantized by the QuantizeLinear that read it, with
 * its one scale (input 6) and uint8 zero point (input 7): the uint8 rows the next product reads. */
static void compute_int8_static(void* state, OrtKernelContext* context) {
  const Int8Kernel* kernel = state;
  if (kernel == NULL) return; /* as compute_int8 */
  const Int8Call c = int8_call(kernel, context, 0);
  if (c.count == 0) return;
  OrtValue* y = NULL;
  uint8_t* out = NULL;
  if (failed(CALL(CONTEXT_OUTPUT, GetOutputFn, context, 0, c.dims, c.count, &y)) || (out = data_of(y)) == NULL)
    return;
  float scale = 0.0f;
  uint8_t zero_point = 0;
  const int known = hotrod_scalar_input(context, 6, &scale, sizeof(scale)) &&
                    hotrod_scalar_input(context, 7, &zero_point, 1);
  /* inputs that do not fit the packed weights (a graph edited after hotrod rewrote it), neither path here or no
   * memory for 32 rows, none of which a graph hotrod loads meets: the zero point throughout, what a row of
   * zeros quantizes to */
  if (c.rows > 0 && (!known || !c.fits ||
                     hotrod_i8_matmul_static(c.data[0], c.data[1], c.scale_stride, c.rows, c.k, c.data[2], c.data[3],
                                             c.data[4], c.data[5], kernel->n, (int)kernel->activation, scale,
                                             zero_point, out, (int)kernel->tiles, hotrod_run_parallel, context) != 0))
    memset(out, zero_point, (size_t)(c.rows * c.width));
}

static const char* int8_static_name(const CustomOp* op) { (void)op; return "Int8MatMulQuantized"; }
static int int8_static_input_type(const CustomOp* op, size_t i) {
  (void)op;
  static const int types[8] = {UINT8, FLOAT, INT8, INT32, FLOAT, FLOAT, FLOAT, UINT8};
  return i < 8 ? types[i] : FLOAT;
}
static size_t int8_static_inputs(const CustomOp* op) { (void)op; return 8; }
static int uint8_type(const CustomOp* op, size_t i) { (void)op, (void)i; return UINT8; }

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

const CustomOp hotrod_int8_matmul = {API_VERSION,        create_int8,          int8_name,         hotrod_cpu_provider,
                                     int8_input_type,    int8_residual_inputs, hotrod_float_type, hotrod_one,
                                     compute_int8,       hotrod_free_kernel,   residual_optional, hotrod_required};
const CustomOp hotrod_int8_matmul_rows = {
    API_VERSION,       create_int8,        int8_rows_name,  hotrod_cpu_provider, int8_input_type, int8_inputs,
    hotrod_quantized_type, hotrod_two,     compute_int8_rows, hotrod_free_kernel, hotrod_required, hotrod_required};
const CustomOp hotrod_int8_matmul_split = {API_VERSION,     create_int8,        int8_split_name,   hotrod_cpu_provider,
                                           int8_input_type, int8_inputs,        hotrod_float_type, hotrod_three,
                                           compute_int8,    hotrod_free_kernel, hotrod_required,   hotrod_required};
const CustomOp hotrod_int8_matmul_quantized = {
    API_VERSION,           create_int8,          int8_static_name, hotrod_cpu_provider, int8_static_input_type,
    int8_static_inputs,    uint8_type,           hotrod_one,       compute_int8_static, hotrod_free_kernel,
    hotrod_required,       hotrod_required};
