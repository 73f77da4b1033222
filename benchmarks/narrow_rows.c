/* hotrod's int8 kernel on a decoding step's rows (1 to 8), one thread, over a model's worth of 768 x 768
 * products (94 MB, read from memory), through its own entry point (hotrod_i8_matmul, the epilogue included):
 * how the order of the weight reads (i8gemm.c's STREAM_ROWS: row counts up to it read each tile's lines in the
 * order they lie, more rows a line of each tile in turn) pays at each row count. Build it once per order:
 *
 *     for s in 0 4 8; do cc -O3 -pthread -Isrc/hotrod/native -mavx512f -mavx512bw -mavx512vl -mavx512vnni -mfma \
 *         -mprfchw -mamx-tile -mamx-int8 -ffp-contract=off -DSTREAM_ROWS=$s -o narrow_rows_$s benchmarks/narrow_rows.c \
 *         src/hotrod/native/i8gemm.c src/hotrod/native/rows.c -lm; done
 *     ./narrow_rows_4 ROWS
 *
 * Prints the best of 10 passes over the products: ms and GB/s of weights. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "i8gemm.h"

#define K 768
#define N 768
#define PRODUCTS 160

static void serial(void* runner, hotrod_task task, void* data, size_t count) {
  (void)runner;
  for (size_t i = 0; i < count; i++) task(data, i);
}

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char** argv) {
  const int rows = argc > 1 ? atoi(argv[1]) : 1;
  if (rows < 1 || rows > 15) {
    fprintf(stderr, "usage: narrow_rows ROWS (1-15: a decoding step's, below a tile's 16)\n");
    return 2;
  }
  const size_t bytes = (size_t)PRODUCTS * K * N;
  int8_t* w = aligned_alloc(64, bytes);
  int32_t* offsets = calloc(N, sizeof(int32_t));
  float *w_scale = calloc(N, sizeof(float)), *bias = calloc(N, sizeof(float)), *a_scale = calloc(rows, sizeof(float));
  uint8_t* q = calloc((size_t)rows * K, 1);
  float* y = calloc((size_t)rows * N, sizeof(float));
  if (!w || !offsets || !w_scale || !bias || !a_scale || !q || !y) return 1;
  memset(w, 1, bytes);
  double best = 1e30;
  for (int pass = 0; pass < 10; pass++) {
    const double start = now();
    for (int p = 0; p < PRODUCTS; p++)
      if (hotrod_i8_matmul(q, a_scale, 1, rows, K, w + (size_t)p * K * N, offsets, w_scale, bias, N, &y, 1,
                           HOTROD_I8_LINEAR, NULL, 0, serial, NULL) != 0) {
        fprintf(stderr, "narrow_rows: this CPU lacks AVX-512 VNNI\n");
        return 1;
      }
    const double took = now() - start;
    if (took < best) best = took;
  }
  printf("rows %d: %.2f ms  %.1f GB/s\n", rows, best * 1e3, bytes / best / 1e9);
  return 0;
}
