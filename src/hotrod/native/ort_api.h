/* The few entries of onnxruntime's C API (version 8) that hotrod's custom ops call, by their positions in
 * its function table (see ort_op.c), helpers over them, and what the op files share (ort_op.c, ort_int8.c,
 * ort_norm.c). */
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "i8gemm.h" /* hotrod_task */

#define API_VERSION 8

typedef struct OrtStatus OrtStatus;
typedef struct OrtValue OrtValue;
typedef struct OrtKernelInfo OrtKernelInfo;
typedef struct OrtKernelContext OrtKernelContext;
typedef struct OrtSessionOptions OrtSessionOptions;
typedef struct OrtCustomOpDomain OrtCustomOpDomain;
typedef struct OrtShape OrtShape; /* OrtTensorTypeAndShapeInfo */
typedef void (*Entry)(void);
typedef struct { const Entry* (*GetApi)(uint32_t version); const char* (*GetVersionString)(void); } ApiBase;

/* Element types; ANY_TYPE: an input whose type the graph decides (the kernel reads it: type_of). */
enum { ANY_TYPE = 0, FLOAT = 1, UINT8 = 2, INT8 = 3, INT32 = 6, BFLOAT16 = 16 };
/* Positions in the version-8 table. */
enum {
  CREATE_DOMAIN = 26, DOMAIN_ADD = 27, ADD_DOMAIN = 28, TENSOR_DATA = 51, ELEMENT_TYPE = 60,
  DIMENSIONS_COUNT = 61, DIMENSIONS = 62, TENSOR_SHAPE = 65, ATTRIBUTE_FLOAT = 85, ATTRIBUTE_INT64 = 86,
  CONTEXT_INPUT = 90, CONTEXT_OUTPUT = 91, RELEASE_STATUS = 93, RELEASE_SHAPE = 99,
};
/* KernelContext_ParallelFor: onnxruntime's intra-op threads for a custom op, from the version-17 table on. */
#define PARALLEL_API_VERSION 17
enum { PARALLEL_FOR = 274 };

typedef struct CustomOp {
  uint32_t version;
  void* (*CreateKernel)(const struct CustomOp*, const Entry* api, const OrtKernelInfo*);
  const char* (*GetName)(const struct CustomOp*);
  const char* (*GetExecutionProviderType)(const struct CustomOp*);
  int (*GetInputType)(const struct CustomOp*, size_t);
  size_t (*GetInputTypeCount)(const struct CustomOp*);
  int (*GetOutputType)(const struct CustomOp*, size_t);
  size_t (*GetOutputTypeCount)(const struct CustomOp*);
  void (*KernelCompute)(void* kernel, OrtKernelContext*);
  void (*KernelDestroy)(void* kernel);
  int (*GetInputCharacteristic)(const struct CustomOp*, size_t);
  int (*GetOutputCharacteristic)(const struct CustomOp*, size_t);
} CustomOp;

enum { REQUIRED = 0, OPTIONAL = 1 }; /* an input's characteristic */

extern const Entry* hotrod_api; /* the version-8 table, set as the library is registered (ort_op.c) */

#define CALL(index, type, ...) (((type)hotrod_api[index])(__VA_ARGS__))
typedef OrtStatus* (*GetInputFn)(const OrtKernelContext*, size_t, const OrtValue**);
typedef OrtStatus* (*GetOutputFn)(OrtKernelContext*, size_t, const int64_t*, size_t, OrtValue**);
typedef OrtStatus* (*DataFn)(OrtValue*, void**);
typedef OrtStatus* (*ShapeFn)(const OrtValue*, OrtShape**);
typedef OrtStatus* (*CountFn)(const OrtShape*, size_t*);
typedef OrtStatus* (*DimsFn)(const OrtShape*, int64_t*, size_t);
typedef OrtStatus* (*ElementTypeFn)(const OrtShape*, int*);
typedef void (*ReleaseShapeFn)(OrtShape*);
typedef void (*ReleaseStatusFn)(OrtStatus*);
typedef OrtStatus* (*AttributeFn)(const OrtKernelInfo*, const char*, int64_t*);
typedef OrtStatus* (*FloatAttributeFn)(const OrtKernelInfo*, const char*, float*);
typedef OrtStatus* (*ParallelForFn)(const OrtKernelContext*, void (*)(void*, size_t), size_t, size_t, void*);

/* A failed call: its status released, and the kernel told so. */
static inline int failed(OrtStatus* status) {
  if (status == NULL) return 0;
  CALL(RELEASE_STATUS, ReleaseStatusFn, status);
  return 1;
}

static inline void* data_of(const OrtValue* value) {
  void* data = NULL;
  return failed(CALL(TENSOR_DATA, DataFn, (OrtValue*)value, &data)) ? NULL : data;
}

/* A tensor's dimensions (at most 8): their count (0 for a scalar), or -1 where they cannot be read. */
static inline int rank_of(const OrtValue* value, int64_t* dims) {
  OrtShape* shape = NULL;
  size_t count = 0;
  int rank = -1;
  if (failed(CALL(TENSOR_SHAPE, ShapeFn, value, &shape))) return -1;
  if (!failed(CALL(DIMENSIONS_COUNT, CountFn, shape, &count)) && count <= 8 &&
      (count == 0 || !failed(CALL(DIMENSIONS, DimsFn, shape, dims, count))))
    rank = (int)count;
  CALL(RELEASE_SHAPE, ReleaseShapeFn, shape);
  return rank;
}

/* A tensor's element type (FLOAT, BFLOAT16, ...), or ANY_TYPE where it cannot be read. */
static inline int type_of(const OrtValue* value) {
  OrtShape* shape = NULL;
  int type = ANY_TYPE;
  if (failed(CALL(TENSOR_SHAPE, ShapeFn, value, &shape))) return ANY_TYPE;
  if (failed(CALL(ELEMENT_TYPE, ElementTypeFn, shape, &type))) type = ANY_TYPE;
  CALL(RELEASE_SHAPE, ReleaseShapeFn, shape);
  return type;
}

/* A tensor's dimensions (at most 8): their count, or 0 for a scalar or where they cannot be read. */
static inline size_t dims_of(const OrtValue* value, int64_t* dims) {
  const int rank = rank_of(value, dims);
  return rank > 0 ? (size_t)rank : 0;
}


/* -- shared by the op files (defined in ort_op.c) ---------------------------------------------- */

/* task(data, i) for each i < count on onnxruntime's intra-op threads (`runner`: the kernel's context), or on
 * the calling thread where the runtime lacks them: the kernels' hotrod_parallel. */
void hotrod_run_parallel(void* runner, hotrod_task task, void* data, size_t count);

/* Row-wise ops' work split (QuantizeRows, the LayerNorm ops): tasks of HOTROD_TASK_ROWS rows where the input holds
 * at least `parallel_values` values, one task of every row otherwise (waking the pool would cost more). */
#define HOTROD_TASK_ROWS 16

static inline int64_t hotrod_row_tasks(int64_t rows, int64_t k, int64_t parallel_values) {
  return rows * k >= parallel_values ? (rows + HOTROD_TASK_ROWS - 1) / HOTROD_TASK_ROWS : 1;
}

/* Task `index`'s rows of `tasks`: its first (in *first) and how many. */
static inline int64_t hotrod_task_rows(int64_t rows, int64_t tasks, size_t index, int64_t* first) {
  const int64_t per = tasks == 1 ? rows : HOTROD_TASK_ROWS;
  *first = (int64_t)index * per;
  return *first + per < rows ? per : rows - *first;
}

void hotrod_free_kernel(void* kernel);
const char* hotrod_cpu_provider(const CustomOp* op);
int hotrod_float_type(const CustomOp* op, size_t i);
size_t hotrod_one(const CustomOp* op);
int hotrod_required(const CustomOp* op, size_t i);
/* One scalar input's value (shape [] or [1]) at `i`, as `size` bytes into `value`; 0 where it is not one. */
int hotrod_scalar_input(OrtKernelContext* context, size_t i, void* value, size_t size);
int hotrod_quantized_type(const CustomOp* op, size_t i); /* uint8 rows, then float scales */
size_t hotrod_two(const CustomOp* op);
size_t hotrod_three(const CustomOp* op);

/* numpy's broadcast of shapes a and b (right-aligned) into out; 0, out untouched, where they do not broadcast
 * (ort_int8.c). */
int hotrod_broadcast(const int64_t* a, size_t na, const int64_t* b, size_t nb, int64_t* out, size_t* n);
/* out = a + b, each broadcast to out's shape (a residual that is not of a product's own shape: rare, so index by
 * index; ort_int8.c). */
void hotrod_add_broadcast(const float* a, const int64_t* ad, size_t na, const float* b, const int64_t* bd, size_t nb,
                          float* out, const int64_t* od, size_t n);

/* The int8 product ops (ort_int8.c). */
extern const CustomOp hotrod_int8_matmul, hotrod_int8_matmul_rows, hotrod_int8_matmul_split;
extern const CustomOp hotrod_int8_matmul_quantized;
/* The bf16 product ops (ort_bf16.c). */
extern const CustomOp hotrod_bf16_matmul_op, hotrod_bf16_matmul_split_op, hotrod_bf16_matmul_rounded_op;
/* The LayerNormalization ops (ort_norm.c). */
extern const CustomOp hotrod_layer_norm_op, hotrod_layer_norm_rows_op, hotrod_layer_norm_fixed_op;
extern const CustomOp hotrod_layer_norm_rounded_op;
