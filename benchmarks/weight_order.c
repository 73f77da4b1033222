/* What the order of a one-row product's weight reads costs: a decoding step's int8 products (one row of
 * activations, VPDPBUSD on AVX-512 VNNI) over a model's worth of weights in the layout of hotrod's int8 kernel
 * (per 32 columns and 64 of depth, two 1 KB tiles), read from memory two ways:
 *   pairs  a line of each tile in turn (two streams 1 KB apart), one product chain per tile (hotrod's kernel
 *          before KERNELS_VERSION 5);
 *   lines  each tile's 16 lines in the order they lie, two product chains per tile (since).
 * The sums are exact integers, the same either way. The machine's read rate, for comparison, is `hotrod bench`'s.
 * Each thread takes a contiguous share of every product's columns; the threads meet after each product (a spin,
 * as onnxruntime's pool waits), as a graph runs one product after another.
 *
 *     cc -O3 -mavx512f -mavx512bw -mavx512vl -mavx512vnni -pthread -o weight_order benchmarks/weight_order.c
 *     ./weight_order [THREADS [PRODUCTS]]
 *
 * Prints the best of 10 rounds for each way: ms for all products and the rate in GB/s. */
#include <immintrin.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define K 768
#define N 768
#define TILE 1024
#define STEP (2 * TILE)
#define ROUNDS 10
#define MAX_THREADS 64

enum { PAIRS, LINES };
static const char* const NAMES[] = {"pairs", "lines"};
static int8_t* weights;
static uint8_t row[K];
static int32_t sums[MAX_THREADS][32];
static int threads = 2, way;
static long products = 160; /* 768 x 768 each: 94 MB, past any last-level cache here */
static volatile int generation, arrived;
static double best;

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

static void meet(void) {
  const int seen = generation;
  if (__sync_add_and_fetch(&arrived, 1) == threads) {
    arrived = 0;
    __sync_synchronize();
    generation = seen + 1;
  } else
    while (generation == seen) _mm_pause();
}

/* One column block (32 columns, K deep) of one row, the way `how` reads it (a constant where inlined). */
static inline __attribute__((always_inline)) void block_as(const int how, const int8_t* w, int32_t* out) {
  __m512i a = _mm512_setzero_si512(), b = a, c = a, d = a;
  const uint8_t* x = row;
  for (int step = 0; step < K / 64; step++, x += 64, w += STEP) {
#pragma GCC unroll 16
    for (int quad = 0; quad < 16; quad++) {
      int32_t bytes;
      memcpy(&bytes, x + quad * 4, 4);
      const __m512i v = _mm512_set1_epi32(bytes);
      if (how == PAIRS) {
        a = _mm512_dpbusd_epi32(a, v, _mm512_loadu_si512(w + quad * 64));
        b = _mm512_dpbusd_epi32(b, v, _mm512_loadu_si512(w + TILE + quad * 64));
      } else if (quad % 2) {
        c = _mm512_dpbusd_epi32(c, v, _mm512_loadu_si512(w + quad * 64));
      } else {
        a = _mm512_dpbusd_epi32(a, v, _mm512_loadu_si512(w + quad * 64));
      }
    }
    if (how == LINES)
#pragma GCC unroll 16
      for (int quad = 0; quad < 16; quad++) {
        int32_t bytes;
        memcpy(&bytes, x + quad * 4, 4);
        const __m512i v = _mm512_set1_epi32(bytes), line = _mm512_loadu_si512(w + TILE + quad * 64);
        if (quad % 2)
          d = _mm512_dpbusd_epi32(d, v, line);
        else
          b = _mm512_dpbusd_epi32(b, v, line);
      }
  }
  _mm512_storeu_si512(out, _mm512_add_epi32(a, c));
  _mm512_storeu_si512(out + 16, _mm512_add_epi32(b, d));
}

static void block(const int8_t* w, int32_t* out) {
  switch (way) {
    case PAIRS: block_as(PAIRS, w, out); break;
    default: block_as(LINES, w, out); break;
  }
}

static void* work(void* arg) {
  const long id = (long)arg, blocks = N / 32, first = blocks * id / threads, last = blocks * (id + 1) / threads;
  for (int round = 0; round < ROUNDS; round++) {
    meet();
    const double start = now();
    for (long p = 0; p < products; p++) {
      for (long b = first; b < last; b++) block(weights + (p * N / 32 + b) * (K / 64) * STEP, sums[id]);
      meet();
    }
    const double took = now() - start;
    if (id == 0 && took < best) best = took;
  }
  return NULL;
}

int main(int argc, char** argv) {
  if (argc > 1) threads = atoi(argv[1]);
  if (argc > 2) products = atol(argv[2]);
  if (threads < 1 || threads > MAX_THREADS || products < 1) {
    fprintf(stderr, "usage: weight_order [THREADS (1-%d) [PRODUCTS (>= 1)]]\n", MAX_THREADS);
    return 2;
  }
  const size_t bytes = (size_t)products * K * N;
  if ((weights = aligned_alloc(64, bytes)) == NULL) return 1;
  memset(weights, 1, bytes);
  memset(row, 3, sizeof row);
  for (way = PAIRS; way <= LINES; way++) {
    pthread_t others[MAX_THREADS];
    best = 1e30;
    for (long t = 1; t < threads; t++) pthread_create(&others[t], NULL, work, (void*)t);
    work((void*)0);
    for (long t = 1; t < threads; t++) pthread_join(others[t], NULL);
    printf("%-5s %2d threads: %8.3f ms  %5.1f GB/s\n", NAMES[way], threads, best * 1e3, bytes / best / 1e9);
  }
  free(weights);
  return 0;
}
