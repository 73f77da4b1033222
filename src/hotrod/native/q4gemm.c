/* Int4 weight-only matrix products for rows of activations, the kernel behind hotrod's Q4MatMul op.
 *
 * On a Xeon with AVX-512 VNNI, onnxruntime's MatMulNBits is compute bound on one row (a decoding step), short
 * of the memory's bandwidth, and this kernel streams the weights faster (on a Zen 4 too). Which is faster turns
 * on the CPU and the shapes: `hotrod tune` measures the two on each machine and keeps the winner.
 *
 * Weights: 4-bit symmetric (zero point 8), one fp32 scale per column and block of `block` rows of K.
 * Packed for AVX-512 VNNI: for each group of 16 columns and each 8 consecutive k, 64 bytes; byte b of
 * column j's dword holds k + b in its low nibble and k + 4 + b in its high one. So one load, two masks and
 * two vpdpbusd give 16 columns x 8 k, with no horizontal sums. A step takes 64 columns (four such lines) at
 * 8 k, and the four lie side by side ([n / 64][k / 8][4][64]): the weights stream from memory in the order
 * they lie, the pattern every CPU's prefetchers follow best.
 * Activations: each row quantized to int8 per block (scale = max |x| / 127), as MatMulNBits' int8 compute
 * does. Every row and column is computed alone, in the same order, whatever the rows beside it and however
 * the columns are split between threads: a row's outputs are the same alone and in any batch.
 *
 * This file is built twice: for AVX-512 VNNI (hotrod_q4_matmul_512) and for AVX2 (hotrod_q4_matmul_256), on
 * the same packed weights. AVX2 has no vpdpbusd: vpmaddubsw then vpmaddwd give each column's dword the same
 * sum of four products, exactly (4-bit weights times int8 activations stay far inside int16), so both builds
 * compute the same int32 sums and the same floats from them. The AVX2 build takes the rows of a tile one at
 * a time (eight 8-column sums a row fill its 16 registers), each over a block's weights while they are in L1.
 */
#include <immintrin.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "q4gemm.h"

#if defined(__AVX512VNNI__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define WIDE 1
#define ENTRY hotrod_q4_matmul_512
#else
#define WIDE 0
#define ENTRY hotrod_q4_matmul_256
#endif

#define GROUP_COLS HOTROD_Q4_COLS /* 4 groups of 16 columns */
#define SHORT_SUMS 4              /* AVX2: groups of 8 k summed in int16 before widening (a block has 4 or more) */
#define UNITS_A_THREAD 4

/* -- activations -------------------------------------------------------------------------------- */

/* The lanes of the 8 values from i on that lie within a row of k, as maskload takes them. */
static inline __m256i within(int64_t i, int64_t k) {
  const int64_t left = k - i;
  const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(left > 8 ? 8 : left < 0 ? 0 : left)), lanes);
}

static inline float max_of(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  return _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
}

static inline int32_t sum_of(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
  return _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1)));
}

/* Row `x` (k values, zero beyond) to int8 per block: q (padded_k bytes), its scales and sums. Rounding is
 * to nearest even (the default mode of cvtps2dq), as nearbyintf would round. Eight lanes in both builds: a
 * row is quantized once a product, beside the weights' thousands of times its bytes. */
static void quantize_row(const float* x, int64_t k, int64_t blocks, int64_t block, int8_t* q, float* scale,
                         int32_t* sum) {
  const __m256 magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  for (int64_t b = 0; b < blocks; b++) {
    const int64_t start = b * block;
    __m256 amax = _mm256_setzero_ps();
    for (int64_t i = start; i < start + block; i += 8)
      amax = _mm256_max_ps(amax, _mm256_and_ps(_mm256_maskload_ps(x + i, within(i, k)), magnitude));
    const float top = max_of(amax);
    const __m256 inv = _mm256_set1_ps(top > 0.0f ? 127.0f / top : 0.0f);
    __m256i total = _mm256_setzero_si256();
    for (int64_t i = start; i < start + block; i += 8) {
      __m256i v = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_maskload_ps(x + i, within(i, k)), inv));
      v = _mm256_max_epi32(_mm256_min_epi32(v, _mm256_set1_epi32(127)), _mm256_set1_epi32(-127));
      total = _mm256_add_epi32(total, v);
      const __m128i words = _mm_packs_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
      _mm_storel_epi64((__m128i*)(q + i), _mm_packs_epi16(words, words));
    }
    scale[b] = top / 127.0f;
    sum[b] = sum_of(total);
  }
}

/* -- the kernel ----------------------------------------------------------------------------------- */

typedef struct {
  const uint8_t* weights;  /* [padded_n / 64][padded_k / 8][4][64] */
  const float* scales;     /* [blocks][padded_n] */
  const float* bias;       /* [padded_n] */
  const int8_t* q;         /* [rows][padded_k] */
  const float* xscale;     /* [rows][blocks] */
  const int32_t* xsum;     /* [rows][blocks] */
  float* out;              /* row r, chunk c at out + r * stride + (c - first) * GROUP_COLS */
  float* tail;             /* [rows][GROUP_COLS]: the last chunk, where it reaches past n */
  int64_t stride, first;
  int64_t rows, padded_k, padded_n, blocks, block, n;
} Job;

#if WIDE
/* Rows [r0, r0 + R) and column chunks [c0, c1) (GROUP_COLS each): y = bias + the sum over blocks of
 * (sum_k w_u x_q - 8 sum_k x_q) * w_scale * x_scale. */
static inline __attribute__((always_inline)) void tile(const Job* job, int64_t r0, const int R, int64_t c0,
                                                       int64_t c1) {
  const __m512i low = _mm512_set1_epi8(0x0F);
  const int64_t kgroups = job->padded_k / 8, per_block = job->block / 8;
  const size_t chunk_stride = (size_t)kgroups * 4 * 64;
  for (int64_t c = c0; c < c1; c++) {
    const int64_t col = c * GROUP_COLS;
    for (int r = 0; r < R; r++)
      for (int j = 0; j < 4; j++)
        _mm512_storeu_ps(job->out + (r0 + r) * job->stride + (c - job->first) * GROUP_COLS + 16 * j,
                         _mm512_loadu_ps(job->bias + col + 16 * j));
    for (int64_t b = 0; b < job->blocks; b++) {
      __m512i acc[4][4];
      for (int r = 0; r < R; r++)
        for (int j = 0; j < 4; j++) acc[r][j] = _mm512_setzero_si512();
      const uint8_t* w = job->weights + (size_t)c * chunk_stride + (size_t)b * per_block * 4 * 64;
      for (int64_t g = 0; g < per_block; g++, w += 4 * 64) {
        __m512i lo[4], hi[4];
        for (int j = 0; j < 4; j++) {
          __m512i v = _mm512_loadu_si512(w + j * 64);
          lo[j] = _mm512_and_si512(v, low);
          hi[j] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
        }
        for (int r = 0; r < R; r++) {
          int32_t xq[2];  /* 8 int8 activations as two dwords, read without aliasing them */
          memcpy(xq, job->q + (r0 + r) * job->padded_k + (b * per_block + g) * 8, sizeof xq);
          __m512i xl = _mm512_set1_epi32(xq[0]), xh = _mm512_set1_epi32(xq[1]);
          for (int j = 0; j < 4; j++) {
            acc[r][j] = _mm512_dpbusd_epi32(acc[r][j], lo[j], xl);
            acc[r][j] = _mm512_dpbusd_epi32(acc[r][j], hi[j], xh);
          }
        }
      }
      const float* ws = job->scales + b * job->padded_n + col;
      for (int r = 0; r < R; r++) {
        const int64_t row = r0 + r;
        __m512i offset = _mm512_set1_epi32(8 * job->xsum[row * job->blocks + b]);
        __m512 xs = _mm512_set1_ps(job->xscale[row * job->blocks + b]);
        float* y = job->out + row * job->stride + (c - job->first) * GROUP_COLS;
        for (int j = 0; j < 4; j++) {
          __m512 dot = _mm512_cvtepi32_ps(_mm512_sub_epi32(acc[r][j], offset));
          __m512 s = _mm512_mul_ps(_mm512_loadu_ps(ws + 16 * j), xs);
          _mm512_storeu_ps(y + 16 * j, _mm512_fmadd_ps(dot, s, _mm512_loadu_ps(y + 16 * j)));
        }
      }
    }
  }
}

#else
/* As above, on AVX2: each row of the tile in turn over a block's weights, 8 columns to a register. */
static inline __attribute__((always_inline)) void tile(const Job* job, int64_t r0, const int R, int64_t c0,
                                                       int64_t c1) {
  const __m256i low = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
  const int64_t kgroups = job->padded_k / 8, per_block = job->block / 8;
  const size_t chunk_stride = (size_t)kgroups * 4 * 64;
  for (int64_t c = c0; c < c1; c++) {
    const int64_t col = c * GROUP_COLS;
    for (int r = 0; r < R; r++)
      for (int j = 0; j < 8; j++)
        _mm256_storeu_ps(job->out + (r0 + r) * job->stride + (c - job->first) * GROUP_COLS + 8 * j,
                         _mm256_loadu_ps(job->bias + col + 8 * j));
    for (int64_t b = 0; b < job->blocks; b++) {
      const uint8_t* block = job->weights + (size_t)c * chunk_stride + (size_t)b * per_block * 4 * 64;
      const float* ws = job->scales + b * job->padded_n + col;
      for (int r = 0; r < R; r++) {
        const int64_t row = r0 + r;
        const int8_t* xq = job->q + row * job->padded_k + b * job->block;
        __m256i acc[8];
        for (int j = 0; j < 8; j++) acc[j] = _mm256_setzero_si256();
        const uint8_t* w = block;
        for (int64_t g = 0; g < per_block; g += SHORT_SUMS) {
          __m256i part[8]; /* int16 sums of SHORT_SUMS groups: at most 4 x 2 x 2 x 15 x 127 = 30480 */
          for (int j = 0; j < 8; j++) part[j] = _mm256_setzero_si256();
#pragma GCC unroll 1 /* unrolled, gcc computes every product first and spills them all to the stack */
          for (int u = 0; u < SHORT_SUMS; u++, w += 4 * 64) {
            int32_t xq2[2]; /* 8 int8 activations as two dwords, read without aliasing them */
            memcpy(xq2, xq + (g + u) * 8, sizeof xq2);
            const __m256i xl = _mm256_set1_epi32(xq2[0]), xh = _mm256_set1_epi32(xq2[1]);
            for (int j = 0; j < 8; j++) {
              const __m256i v = _mm256_loadu_si256((const __m256i*)(w + 32 * j));
              const __m256i lo = _mm256_and_si256(v, low), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
              part[j] = _mm256_add_epi16(part[j], _mm256_add_epi16(_mm256_maddubs_epi16(lo, xl),
                                                                   _mm256_maddubs_epi16(hi, xh)));
            }
          }
          for (int j = 0; j < 8; j++) acc[j] = _mm256_add_epi32(acc[j], _mm256_madd_epi16(part[j], ones));
        }
        const __m256i offset = _mm256_set1_epi32(8 * job->xsum[row * job->blocks + b]);
        const __m256 xs = _mm256_set1_ps(job->xscale[row * job->blocks + b]);
        float* y = job->out + row * job->stride + (c - job->first) * GROUP_COLS;
        for (int j = 0; j < 8; j++) {
          const __m256 dot = _mm256_cvtepi32_ps(_mm256_sub_epi32(acc[j], offset));
          const __m256 s = _mm256_mul_ps(_mm256_loadu_ps(ws + 8 * j), xs);
          _mm256_storeu_ps(y + 8 * j, _mm256_fmadd_ps(dot, s, _mm256_loadu_ps(y + 8 * j)));
        }
      }
    }
  }
}
#endif

/* Column chunks [c0, c1) for every row, four rows at a time. */
static void rows_of(const Job* job, int64_t c0, int64_t c1) {
  int64_t r = 0;
  for (; r + 4 <= job->rows; r += 4) tile(job, r, 4, c0, c1);
  switch (job->rows - r) {
    case 3: tile(job, r, 3, c0, c1); break;
    case 2: tile(job, r, 2, c0, c1); break;
    case 1: tile(job, r, 1, c0, c1); break;
    default: break;
  }
}

/* As rows_of, straight into y; a last chunk reaching past n goes through the job's tail tile first. */
static void run_columns(const Job* job, int64_t c0, int64_t c1) {
  const int64_t chunks = job->padded_n / GROUP_COLS, tail = job->n % GROUP_COLS;
  if (c1 < chunks || tail == 0) {
    rows_of(job, c0, c1);
    return;
  }
  rows_of(job, c0, c1 - 1);
  Job last = *job;
  last.out = job->tail, last.stride = GROUP_COLS, last.first = c1 - 1;
  rows_of(&last, c1 - 1, c1);
  for (int64_t r = 0; r < job->rows; r++)
    memcpy(job->out + r * job->stride + (c1 - 1 - job->first) * GROUP_COLS, job->tail + r * GROUP_COLS,
           sizeof(float) * tail);
}

/* -- entry point ---------------------------------------------------------------------------------- */

/* Each thread's buffers (its rows' int8 activations, their scales and sums, the tail tile), kept from
 * call to call (a step's products come in quick succession) and freed when the thread ends. */
typedef struct {
  int8_t* q;
  float* scale;
  int32_t* sum;
  float* tail;
  int64_t q_size, blocks, rows;
} Buffers;

static pthread_key_t buffers_key;
static pthread_once_t buffers_once = PTHREAD_ONCE_INIT;
static __thread Buffers* own;

static void free_buffers(void* state) {
  Buffers* b = state;
  free(b->q), free(b->scale), free(b->sum), free(b->tail), free(b);
}

static void make_key(void) { pthread_key_create(&buffers_key, free_buffers); }

/* Growing each buffer to its need; 0 where memory ran out. */
static Buffers* buffers(int64_t q_size, int64_t blocks, int64_t rows) {
  if (own == NULL) {
    pthread_once(&buffers_once, make_key);
    own = calloc(1, sizeof(Buffers));
    if (own == NULL) return NULL;
    pthread_setspecific(buffers_key, own);
  }
  Buffers* b = own;
  if (q_size > b->q_size) {
    free(b->q);
    b->q = aligned_alloc(64, (size_t)((q_size + 63) / 64 * 64));
    b->q_size = b->q ? q_size : 0;
  }
  if (blocks > b->blocks) {
    free(b->scale), free(b->sum);
    b->scale = malloc(sizeof(float) * blocks), b->sum = malloc(sizeof(int32_t) * blocks);
    b->blocks = b->scale && b->sum ? blocks : 0;
  }
  if (rows > b->rows) {
    free(b->tail);
    b->tail = aligned_alloc(64, sizeof(float) * GROUP_COLS * rows);
    b->rows = b->tail ? rows : 0;
  }
  return b->q_size >= q_size && b->blocks >= blocks && b->rows >= rows ? b : NULL;
}

/* A share of the column chunks, [chunks * i / units, chunks * (i + 1) / units). */
typedef struct {
  const Job* job;
  int64_t chunks, units;
} Shares;

static void share(void* data, size_t i) {
  const Shares* s = data;
  run_columns(s->job, s->chunks * (int64_t)i / s->units, s->chunks * ((int64_t)i + 1) / s->units);
}

int ENTRY(const float* x, int64_t rows, int64_t k, const uint8_t* weights, const float* scales, const float* bias,
          int64_t n, int64_t block, int threads, float* y, hotrod_parallel parallel, void* runner) {
  const int64_t blocks = (k + block - 1) / block, padded_k = blocks * block;
  const int64_t padded_n = (n + GROUP_COLS - 1) / GROUP_COLS * GROUP_COLS, chunks = padded_n / GROUP_COLS;
  Buffers* b = buffers(rows * padded_k, rows * blocks, rows);
  if (b == NULL) return -1;
  for (int64_t r = 0; r < rows; r++)
    quantize_row(x + r * k, k, blocks, block, b->q + r * padded_k, b->scale + r * blocks, b->sum + r * blocks);
  Job job = {weights, scales, bias, b->q, b->scale, b->sum, y, b->tail, n, 0, rows, padded_k, padded_n, blocks,
             block, n};
  /* Below about 64k weight-rows of work, handing half to another thread costs more than it saves. A few
   * shares a thread let a thread that finishes early take another; each is a contiguous run of weights. */
  int64_t units = threads > 1 && rows * padded_k * padded_n >= 65536 ? (int64_t)threads * UNITS_A_THREAD : 1;
  if (units > chunks) units = chunks;
  Shares shares = {&job, chunks, units};
  parallel(runner, share, &shares, (size_t)units);
  return 0;
}
