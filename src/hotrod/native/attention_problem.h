/* What attention.c's paths share: one call's problem, the rows asked for ahead, the units' tasks, and the softmax's
 * exponential. */
#pragma once
#include <immintrin.h>
#include <stdint.h>

#include "attention.h"

typedef struct {
  const float *q, *k, *v, *mask;
  hotrod_attention_out out;
  int64_t batch, seq_q, seq_k, heads, head_size;
  int64_t padded_k; /* keys padded to a multiple of PAIR_KEYS */
  int64_t depth, blocks; /* the head size padded with zeros to a multiple of 32; its blocks of 16 columns */
  int64_t mask_stride[3]; /* floats between the mask's batch rows, heads, query rows; 0 where broadcast */
  float scale;
  int tiles; /* 1: on AMX's tiles, the numerators bf16; 2: the same operands on AVX512_BF16's VDPBF16PS (PAIRS);
              * 0: on AVX-512F, the numerators floats rounded to bf16;
              * 3: int8 on AVX-512 VNNI (QUADS, attention_quads.c) */
} hotrod_attention_problem;

#define HOTROD_ATTENTION_QUERY_ROWS 32 /* queries a block, on every path */

/* The additive mask row of query `row` of batch row `b` and head `h` (NULL where there is no mask), rows past the
 * last query (`rows` of them) taking the last one's: they are never answered. */
static inline const float* hotrod_attention_mask_row(const hotrod_attention_problem* p, int64_t b, int64_t h,
                                                     int64_t row, int64_t rows) {
  if (p->mask == NULL) return NULL;
  return p->mask + b * p->mask_stride[0] + h * p->mask_stride[1] + (row < rows ? row : rows - 1) * p->mask_stride[2];
}

/* Rows [first, first + count) of a unit's Q, K or V (below `rows`; `head` floats each, `width` apart) asked for ahead
 * (PREFETCHT0): each row of a batch row's head lies a whole row of every head away from the last, further than the
 * core's prefetchers follow, so without this each row's first line waits on memory once the tensors outgrow the
 * cache (a batch of 384-token rows). */
static inline void hotrod_ask_rows(const float* x, int64_t first, int64_t count, int64_t rows, int64_t width,
                                   int64_t head) {
  for (int64_t r = first; r < first + count && r < rows; r++) {
    const char* start = (const char*)(x + r * width);
    for (const char* line = start; line < (const char*)(x + r * width + head); line += 64)
      _mm_prefetch(line, _MM_HINT_T0);
    _mm_prefetch((const char*)(x + r * width + head) - 1, _MM_HINT_T0); /* a row that ends past a line's start */
  }
}

/* Units a task runs, one after the other: each asks for the next one's rows while its own blocks run, where the
 * units (batch rows x heads) are enough to leave every thread several tasks. */
static inline int64_t hotrod_attention_group(const hotrod_attention_problem* p) {
  const int64_t units = p->batch * p->heads;
  return units >= 64 ? 4 : units >= 32 ? 2 : 1;
}

static inline size_t hotrod_attention_tasks(const hotrod_attention_problem* p) {
  const int64_t group = hotrod_attention_group(p);
  return (size_t)((p->batch * p->heads + group - 1) / group);
}

/* The first row of unit `index`'s Q, K or V (x, `seq` rows a batch row). */
static inline const float* hotrod_attention_rows(const hotrod_attention_problem* p, const float* x, int64_t index,
                                                 int64_t seq) {
  const int64_t b = index / p->heads, h = index % p->heads;
  return x + b * seq * p->heads * p->head_size + h * p->head_size;
}

/* Unit `next`'s rows (none where it is -1) asked for a slice at each of the current unit's `blocks` blocks of
 * queries (this is block `block`): its K and V, and at the last its first block of Q, in the cache when it starts. */
static inline void hotrod_attention_ask_next(const hotrod_attention_problem* p, int64_t next, int64_t block,
                                             int64_t blocks) {
  if (next < 0) return;
  const int64_t width = p->heads * p->head_size, slice = (p->seq_k + blocks - 1) / blocks;
  hotrod_ask_rows(hotrod_attention_rows(p, p->k, next, p->seq_k), block * slice, slice, p->seq_k, width, p->head_size);
  hotrod_ask_rows(hotrod_attention_rows(p, p->v, next, p->seq_k), block * slice, slice, p->seq_k, width, p->head_size);
  if (block == blocks - 1)
    hotrod_ask_rows(hotrod_attention_rows(p, p->q, next, p->seq_q), 0, HOTROD_ATTENTION_QUERY_ROWS, p->seq_q, width,
                    p->head_size);
}

/* A unit whose workspace could not be had (memory ran out), its answers from element `at` on: NaN, which no caller
 * takes for an answer (the zero point where quantized). */
void hotrod_attention_unanswered(const hotrod_attention_problem* p, int64_t at);

/* e^x for x <= 0 (larger values are not asked for): 2^n 2^f with n = round(x log2 e), f in [-1/2, 1/2] on a
 * polynomial: of degree 5 (relative error below 3e-6, far below bf16's 4e-3), or of degree 3 where `coarse` (below
 * 8e-5, far below the int8 path's uint8 numerators' 4e-3); -inf and anything below about -104 give 0, so a masked
 * key's numerator is exactly 0; NaN gives NaN. n is rounded by adding and taking away 1.5 * 2^23: to nearest even
 * for |t| <= 2^22, as a rounding instruction would, in two single-cycle steps; below -2^22, 2^n is 0 whatever n
 * and f come out as (|f| stays below 1). */
static inline __attribute__((always_inline)) __m512 hotrod_exp_neg_of(__m512 x, const int coarse) {
  /* written with explicit rounding: each step rounded on its own, never fused into a multiply-add */
  const int nearest = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
  const __m512 t = _mm512_mul_round_ps(_mm512_max_ps(_mm512_set1_ps(-1e30f), x), _mm512_set1_ps(1.44269504f), nearest);
  const __m512 round = _mm512_set1_ps(12582912.0f);
  const __m512 n = _mm512_sub_round_ps(_mm512_add_round_ps(t, round, nearest), round, nearest);
  const __m512 f = _mm512_sub_round_ps(t, n, nearest);
  __m512 p;
  if (coarse) { /* minimax of the relative error on [-1/2, 1/2] */
    p = _mm512_set1_ps(5.5171665e-2f);
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.4261113e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.9326097e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.9992806e-1f));
  } else {
    p = _mm512_set1_ps(1.3333558e-3f);
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.6181291e-3f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.5504109e-2f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.4022651e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.9314718e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
  }
  return _mm512_scalef_ps(p, n);
}

static inline __m512 hotrod_exp_neg(__m512 x) { return hotrod_exp_neg_of(x, 0); }
