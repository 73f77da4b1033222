/* hotrod's int8 kernel on an encoder's rows (hundreds to thousands of them), through its own entry points and
 * epilogues, on its path without tiles (AVX-512 VNNI: every CPU without AMX, and one with AMX where the op is told
 * to leave the tiles): how fast one product runs at a shape, its output made as each of an encoder's products
 * makes it. Build it once per version of the kernel to compare
 * (i8gemm.c as it is, or as another commit had it), then run the builds in turn, several rounds, on an idle machine:
 *
 *     cc -O3 -pthread -Isrc/hotrod/native -mavx512f -mavx512bw -mavx512vl -mavx512vnni -mfma -mprfchw -mamx-tile \
 *         -mamx-int8 -ffp-contract=off -o encoder_products benchmarks/encoder_products.c \
 *         src/hotrod/native/i8gemm.c src/hotrod/native/rows.c -lm
 *     ./encoder_products ROWS K N [THREADS [OUTPUT [COPIES]]]
 *
 * OUTPUT: 0 floats (the Q/K/V product's), 1 floats plus a residual (the attention's output product and the
 * second feed-forward product, as the int8 builds fuse them), 2 bytes quantized with one scale (int8-static's
 * next input), 3 the same after the GELU (int8-static's first feed-forward product). The threads take units of
 * work as onnxruntime's pool hands them out (a contiguous shard each, then the others'). COPIES (default 1): each
 * call takes the next of that many copies of the weights, in turn, so that with enough of them (a model's worth,
 * past the last-level cache) each call's weights come from memory, as a layer's do in a model. Prints the best of 12 calls (of COPIES,
 * where more): ms and T int8 operations (2 x rows x K x N) a second. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "i8gemm.h"

#define CALLS 12

#define MAX_THREADS 256

/* onnxruntime's pool divides the units into one contiguous shard per thread: each thread takes its own shard's
 * units in order, then helps with the others'. A thread's next unit is most often the one after its last. */
typedef struct {
  hotrod_task task;
  void* data;
  size_t count;
  struct { atomic_size_t next; size_t end; char pad[48]; } shards[MAX_THREADS];
} Job;

static Job* job;
static int threads = 1;
/* The threads spin between calls, as onnxruntime's pool does: a call is handed out and gathered in a few hundred
 * nanoseconds, not a futex's wake-up (tens of microseconds, a tenth of a 128-row product). */
static atomic_long started, finished;

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

static void drain(Job* j, int home) {
  for (int s = 0; s < threads; s++) {
    const int shard = (home + s) % threads;
    for (size_t i; (i = atomic_fetch_add(&j->shards[shard].next, 1)) < j->shards[shard].end;) j->task(j->data, i);
  }
}

static void* worker(void* home) {
  for (long seen = 0;;) {
    while (atomic_load_explicit(&started, memory_order_acquire) == seen) __builtin_ia32_pause();
    seen++;
    drain(job, (int)(intptr_t)home);
    atomic_fetch_add_explicit(&finished, 1, memory_order_release);
  }
  return NULL;
}

static void pool(void* runner, hotrod_task task, void* data, size_t count) {
  (void)runner;
  static Job j;
  j.task = task, j.data = data, j.count = count;
  for (int s = 0; s < threads; s++) {
    atomic_store(&j.shards[s].next, count * (size_t)s / (size_t)threads);
    j.shards[s].end = count * (size_t)(s + 1) / (size_t)threads;
  }
  job = &j;
  const long goal = atomic_load(&finished) + threads - 1;
  atomic_fetch_add_explicit(&started, 1, memory_order_release);
  drain(&j, 0);
  while (atomic_load_explicit(&finished, memory_order_acquire) < goal) __builtin_ia32_pause();
}

static void* zeroed(size_t bytes) {
  void* p = aligned_alloc(64, (bytes + 63) / 64 * 64);
  if (p == NULL) {
    fprintf(stderr, "encoder_products: out of memory\n");
    exit(1);
  }
  memset(p, 0, bytes);
  return p;
}

int main(int argc, char** argv) {
  const int64_t rows = argc > 3 ? atoll(argv[1]) : 0, k = argc > 3 ? atoll(argv[2]) : 0;
  const int64_t n = argc > 3 ? atoll(argv[3]) : 0;
  threads = argc > 4 ? atoi(argv[4]) : 1;
  const int output = argc > 5 ? atoi(argv[5]) : 0, copies = argc > 6 ? atoi(argv[6]) : 1;
  if (rows < 1 || k < 64 || k % 64 != 0 || n < 1 || n % 32 != 0 || threads < 1 || threads > MAX_THREADS || output < 0 ||
      output > 3 || copies < 1 || copies > 1024) {
    fprintf(stderr, "usage: encoder_products ROWS K N [THREADS [OUTPUT [COPIES]]] (K a multiple of 64, N of 32; "
                    "OUTPUT 0-3; COPIES 1-1024)\n");
    return 2;
  }
  if (!hotrod_vnni_ready()) {
    fprintf(stderr, "encoder_products: this CPU lacks AVX-512 VNNI\n");
    return 1;
  }
  for (int t = 1; t < threads; t++) {
    pthread_t thread;
    pthread_create(&thread, NULL, worker, (void*)(intptr_t)t);
  }
  uint8_t* q = zeroed((size_t)(rows * k));
  int8_t* all = zeroed((size_t)(k * n * copies));
  srand(1);
  for (int64_t i = 0; i < rows * k; i++) q[i] = (uint8_t)rand();
  for (int64_t i = 0; i < k * n * copies; i++) all[i] = (int8_t)(rand() % 129 - 64); /* the int8 builds' 7 bits */
  float *scales = zeroed((size_t)rows * sizeof(float)), *w_scale = zeroed((size_t)n * sizeof(float));
  for (int64_t i = 0; i < rows; i++) scales[i] = 0.01f;
  /* sums near N(0, 1.1e5) at k = 384: scaled to about N(0, 1.5), as an encoder's values before its GELU lie, for the
   * table GELU's margin to send back as many groups as it does there (gelu_static.h) */
  for (int64_t i = 0; i < n; i++) w_scale[i] = 0.0014f;
  int32_t* offsets = zeroed((size_t)n * sizeof(int32_t));
  float *bias = zeroed((size_t)n * sizeof(float)), *y = zeroed((size_t)(rows * n) * sizeof(float));
  float* residual = zeroed((size_t)(rows * n) * sizeof(float));
  uint8_t* bytes = zeroed((size_t)(rows * n));
  double best = 1e30;
  for (int call = 0; call < (copies > CALLS ? copies : CALLS); call++) { /* each copy used at least once */
    const int8_t* w = all + (int64_t)(call % copies) * k * n;
    const double started = now();
    const int status =
        output <= 1 ? hotrod_i8_matmul(q, scales, 1, rows, k, w, offsets, w_scale, bias, n, &y, 1, HOTROD_I8_LINEAR,
                                       output == 1 ? residual : NULL, 0, pool, NULL)
                    : hotrod_i8_matmul_static(q, scales, 1, rows, k, w, offsets, w_scale, bias, n,
                                              output == 3 ? HOTROD_I8_GELU : HOTROD_I8_LINEAR, 0.05f, 128, bytes, 0,
                                              pool, NULL);
    if (status != 0) {
      fprintf(stderr, "encoder_products: the kernel refused the product\n");
      return 1;
    }
    const double took = now() - started;
    best = took < best ? took : best;
  }
  printf("rows %ld k %ld n %ld threads %d output %d copies %d: %.3f ms %.3f T ops/s\n", (long)rows, (long)k, (long)n,
         threads, output, copies, best * 1e3, 2.0 * (double)rows * (double)k * (double)n / best / 1e12);
  return 0;
}
