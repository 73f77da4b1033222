/* Encoder attention with int8 products on AVX-512 VNNI's VPDPBUSD (attention.c's QUADS path): the arithmetic of
 * OpenVINO's full int8 attention, each row with scales of its own.
 *
 * One batch row and head is a unit, as on the other paths:
 * - each key's K row is quantized to int8 with its own scale (its largest magnitude over 127), and packed as
 *   VPDPBUSD's signed operand: per 16 keys and 4 depths, 64 bytes, one lane a key; each key's byte sum times 128
 *   is kept (the instruction's other operand is unsigned: a query row's int8 values are stored plus 128, whose
 *   share of each score is taken away again);
 * - each query row is quantized the same way, 32 rows at a time; its scores Q K^T are exact integers, turned into
 *   floats with the two rows' scales;
 * - the scale, the mask and the softmax in fp32 (the other paths' exponential on a degree-3 polynomial, good to 8e-5:
 *   the numerators are quantized to 8 bits next);
 * - each key's V row quantized with its own scale; a query row's numerators e^(s - max), times each key's V scale
 *   (P V's sum runs over keys, so the key's scale goes with its weight), are quantized to uint8 with the row's
 *   largest as 255, and P V's integer sums are scaled back by that and by 1 / the numerators' fp32 sum.
 * Every scale is a row's own (a query's, a key's, a value's): no row's answer depends on its batch-mates, nor on
 * the other queries of its block, nor on keys past the last (zeros, and their numerators 0). Rounding is to nearest
 * even throughout (the MXCSR's), so the answers are one function of the inputs on any CPU with the instructions.
 */
#include <immintrin.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "attention_problem.h"
#include "attention_quads.h"
#include "lanes.h"
#include "quantize.h"
#include "transpose.h"

#define QUERY_ROWS HOTROD_ATTENTION_QUERY_ROWS /* queries a block */
#define ROWS 8        /* rows a step of either product: 8 x 32 int32 sums in 16 registers */
#define SOFT_ROWS 4   /* rows whose softmax runs side by side (their dependent chains overlap) */

typedef hotrod_attention_problem Problem;

int hotrod_attention_quads_ready(void) {
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
}

typedef struct {
  int64_t quads;   /* the head size in groups of 4 depths (zeros past it), a multiple of UNROLL */
  int64_t columns; /* the head size padded to a multiple of 32 (P V's columns a step) */
  uint8_t* keys;   /* per 16 keys, per 4 depths: 64 bytes, lane j key j's 4 int8 values */
  int32_t* shifts; /* per key: 128 x its int8 values' sum, which a query's +128 adds to the key's score */
  float* key_scales;
  uint8_t* values; /* per 4 keys, per 16 columns: 64 bytes, lane c column c's 4 keys' int8 values */
  float* value_scales;
  uint8_t* queries; /* QUERY_ROWS rows of quads x 4 bytes: each value / its row's scale + 128 */
  float query_scales[QUERY_ROWS];
  float* scores;    /* QUERY_ROWS x padded_k */
  uint8_t* weights; /* QUERY_ROWS x padded_k: the quantized numerators */
  float factors[QUERY_ROWS]; /* each row's weights' scale / its numerators' sum */
  const float* masks[QUERY_ROWS]; /* each row's additive mask (NULL: none) */
  int broken;                     /* a V row holds a NaN or an infinity: every answer NaN, as fp32's P V gives */
  __m512 largest[QUERY_ROWS];     /* each row's largest scores so far, 16 lanes */
} Work;

/* 16 rows' scales at once (rows from `first` on, `width` apart, `count` floats each; those at `last` and after
 * count as rows of zeros): each row's largest magnitude over 127 (0 for a row of zeros; NaN where it holds a NaN,
 * so that the row's answers are NaN, as fp32 attention's would be), and 127 over that largest (0 where it is 0 or
 * infinite). The 16 rows' largest lanes are transposed into one vector rather than each reduced on its own: no
 * chain of shuffles a row. */
static void scales16(const float* x, int64_t first, int64_t last, int64_t width, int64_t count, float* scales,
                     float* inverses) {
  __m512i largest[16];
  __mmask16 unordered = 0;
  for (int j = 0; j < 16; j++) {
    __m512 top = _mm512_setzero_ps();
    for (int64_t c = 0; first + j < last && c < count; c += 16) {
      const __m512 v = hotrod_load_first(count - c, x + (first + j) * width + c);
      top = _mm512_max_ps(top, _mm512_abs_ps(v));
      if (_mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q)) unordered |= (__mmask16)(1u << j);
    }
    largest[j] = _mm512_castps_si512(top);
  }
  hotrod_transpose16(largest);
  __m512 top = _mm512_castsi512_ps(largest[0]);
  for (int j = 1; j < 16; j++) top = _mm512_max_ps(top, _mm512_castsi512_ps(largest[j]));
  const __mmask16 finite = _mm512_cmp_ps_mask(top, _mm512_setzero_ps(), _CMP_GT_OQ) &
                           _mm512_cmp_ps_mask(top, _mm512_set1_ps(INFINITY), _CMP_LT_OQ);
  _mm512_storeu_ps(inverses, _mm512_maskz_div_ps(finite, _mm512_set1_ps(127.0f), top));
  _mm512_storeu_ps(scales, _mm512_mask_mov_ps(_mm512_div_ps(top, _mm512_set1_ps(127.0f)), unordered,
                                              _mm512_set1_ps(__builtin_nanf(""))));
}

/* Lane j: the sum of v[j]'s lanes, for 16 vectors at once (transposed, then added). */
static inline __m512i sum_lanes16(__m512i* v) {
  hotrod_transpose16(v);
  __m512i total = v[0];
  for (int j = 1; j < 16; j++) total = _mm512_add_epi32(total, v[j]);
  return total;
}

/* Up to 64 floats of `row` (`count`; zeros past it) times `inverse`, rounded, as int32 quads: lane t holds values
 * 4t..4t+3 as bytes, each plus `offset` (128: unsigned bytes); their sum (without the offset) added to *sum where
 * `sum` is not NULL (a key's, which its shift takes; a query's is not needed). */
static inline __m512i quantize_quads(const float* row, int64_t count, float inverse, int offset, __m512i* sum) {
  __m128i bytes[4];
  for (int i = 0; i < 4; i++) {
    const __m512 x = hotrod_load_first(count - 16 * i, row + 16 * i);
    const __m512i n = _mm512_cvtps_epi32(_mm512_mul_ps(x, _mm512_set1_ps(inverse)));
    if (sum != NULL) *sum = _mm512_add_epi32(*sum, n);
    bytes[i] = _mm512_cvtepi32_epi8(_mm512_add_epi32(n, _mm512_set1_epi32(offset)));
  }
  __m512i quads = _mm512_castsi128_si512(bytes[0]);
  quads = _mm512_inserti32x4(quads, bytes[1], 1);
  quads = _mm512_inserti32x4(quads, bytes[2], 2);
  return _mm512_inserti32x4(quads, bytes[3], 3);
}

/* K packed, 16 keys at a time: each key's 64 depths at a time quantized into one vector of 16 quads, transposed so
 * that vector t holds quad t of each key; keys past the last are zeros with scale 0. */
static void pack_keys(const Problem* p, const float* k, Work* w) {
  const int64_t width = p->heads * p->head_size;
  float inverse[16];
  __m512i sums[16];
  hotrod_ask_rows(k, 0, 16, p->seq_k, width, p->head_size);
  for (int64_t first = 0; first < p->padded_k; first += 16) {
    hotrod_ask_rows(k, first + 16, 16, p->seq_k, width, p->head_size);
    scales16(k, first, p->seq_k, width, p->head_size, w->key_scales + first, inverse);
    for (int j = 0; j < 16; j++) sums[j] = _mm512_setzero_si512();
    for (int64_t part = 0; part < w->quads; part += 16) {
      __m512i rows[16];
      for (int j = 0; j < 16; j++)
        rows[j] = first + j < p->seq_k
                      ? quantize_quads(k + (first + j) * width + 4 * part, p->head_size - 4 * part, inverse[j], 0,
                                       &sums[j])
                      : _mm512_setzero_si512();
      hotrod_transpose16(rows);
      const int64_t count = w->quads - part < 16 ? w->quads - part : 16;
      for (int64_t t = 0; t < count; t++)
        _mm512_storeu_si512(w->keys + ((first / 16) * w->quads + part + t) * 64, rows[t]);
    }
    _mm512_storeu_si512(w->shifts + first, _mm512_slli_epi32(sum_lanes16(sums), 7)); /* times 128 */
  }
}

/* V packed, 4 keys at a time: each key's row quantized with its own scale to int32 lanes, four keys' lanes
 * interleaved into bytes (lane c: the 4 keys' column c), 16 columns a vector. */
static void pack_values(const Problem* p, const float* v, Work* w) {
  w->broken = 0;
  const int64_t width = p->heads * p->head_size, blocks = w->columns / 16;
  hotrod_ask_rows(v, 0, 16, p->seq_k, width, p->head_size);
  float inverses[16];
  for (int64_t first = 0; first < p->padded_k; first += 4) {
    hotrod_ask_rows(v, first + 16, 4, p->seq_k, width, p->head_size);
    if (first % 16 == 0) scales16(v, first, p->seq_k, width, p->head_size, w->value_scales + first, inverses);
    const float* inverse = inverses + first % 16;
    for (int i = 0; i < 4; i++) w->broken |= !(w->value_scales[first + i] < INFINITY); /* NaN or infinite */
    for (int64_t block = 0; block < blocks; block++) {
      __m512i packed = _mm512_setzero_si512();
      for (int i = 0; i < 4; i++) {
        const int64_t key = first + i, c = block * 16;
        if (key >= p->seq_k) continue;
        const __m512 x = hotrod_load_first(p->head_size - c, v + key * width + c);
        const __m512i n = _mm512_cvtps_epi32(_mm512_mul_ps(x, _mm512_set1_ps(inverse[i])));
        packed = _mm512_or_si512(packed, _mm512_slli_epi32(_mm512_and_si512(n, _mm512_set1_epi32(0xFF)), 8 * i));
      }
      _mm512_storeu_si512(w->values + ((first / 4) * blocks + block) * 64, packed);
    }
  }
}

/* `rows` query rows (of QUERY_ROWS; zero rows past them, up to a whole step) quantized into w->queries. */
static void load_queries(const Problem* p, const float* q, int64_t rows, int64_t filled, Work* w) {
  const int64_t width = p->heads * p->head_size, stride = w->quads * 4;
  float inverses[QUERY_ROWS];
  for (int64_t r = 0; r < filled; r += 16) scales16(q, r, rows, width, p->head_size, w->query_scales + r, inverses + r);
  for (int64_t r = 0; r < filled; r++) {
    const float inverse = inverses[r];
    for (int64_t part = 0; part < w->quads; part += 16) {
      const int64_t count = w->quads - part < 16 ? w->quads - part : 16;
      const __m512i quads = r < rows ? quantize_quads(q + r * width + 4 * part, p->head_size - 4 * part, inverse,
                                                      128, NULL)
                                     : _mm512_set1_epi8((char)128);
      _mm512_mask_storeu_epi32(w->queries + r * stride + 4 * part, hotrod_first(count), quads);
    }
  }
}

/* sums[r * 32 + 0..32) = the r-th of `count` rows (4 bytes of each a step, `stride` apart) times two vectors of 16
 * lanes' 4 bytes (from `low` and `low + apart`, `jump` bytes a step), over `steps` steps (a multiple of UNROLL):
 * the products' one inner loop, its steps unrolled so that their offsets are constants and the sums stay in
 * registers. */
#define UNROLL 8
static inline __attribute__((always_inline)) void quad_rows(const uint8_t* rows, int64_t stride, const int count,
                                                            const uint8_t* low, int64_t apart, int64_t jump,
                                                            int64_t steps, int32_t* sums) {
  __m512i acc[ROWS][2];
  for (int r = 0; r < count; r++) acc[r][0] = acc[r][1] = _mm512_setzero_si512();
  for (int64_t t = 0; t < steps; t += UNROLL, rows += 4 * UNROLL, low += UNROLL * jump) {
#pragma GCC unroll 8
    for (int u = 0; u < UNROLL; u++) {
      const __m512i l = _mm512_loadu_si512(low + u * jump), h = _mm512_loadu_si512(low + apart + u * jump);
      for (int r = 0; r < count; r++) {
        int32_t word;
        memcpy(&word, rows + r * stride + 4 * u, sizeof word);
        const __m512i x = _mm512_set1_epi32(word);
        acc[r][0] = _mm512_dpbusd_epi32(acc[r][0], x, l);
        acc[r][1] = _mm512_dpbusd_epi32(acc[r][1], x, h);
      }
    }
  }
  for (int r = 0; r < count; r++) {
    _mm512_store_si512(sums + r * 32, acc[r][0]);
    _mm512_store_si512(sums + r * 32 + 16, acc[r][1]);
  }
}

/* Scores of ROWS query rows from `row` on (`count` of them) for every 32 keys: each integer sum less its key's
 * shift, times the key's scale, times the query's scale and the attention's scale, plus the mask; each row's
 * largest kept as they are stored. */
static inline __attribute__((always_inline)) void score_rows(const Problem* p, Work* w, int64_t row,
                                                             const int count) {
  const int64_t stride = w->quads * 4;
  __m512 largest[ROWS], factor[ROWS];
  for (int r = 0; r < count; r++) {
    largest[r] = _mm512_set1_ps(-INFINITY);
    factor[r] = _mm512_set1_ps(w->query_scales[row + r] * p->scale);
  }
  for (int64_t key = 0; key < p->seq_k; key += 32) {
    int32_t sums[ROWS * 32] __attribute__((aligned(64)));
    quad_rows(w->queries + row * stride, stride, count, w->keys + (key / 16) * w->quads * 64, w->quads * 64, 64,
              w->quads, sums);
    for (int half = 0; half < 2; half++) {
      const int64_t at = key + 16 * half;
      const __mmask16 m = hotrod_first(p->seq_k - at);
      const __m512i shift = _mm512_loadu_si512(w->shifts + at);
      const __m512 scales = _mm512_loadu_ps(w->key_scales + at);
      for (int r = 0; r < count; r++) {
        const __m512 s = _mm512_mul_ps(
            _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_load_si512(sums + r * 32 + 16 * half), shift)), scales);
        const float* mask = w->masks[row + r];
        const __m512 x = mask == NULL || !m ? _mm512_mul_ps(s, factor[r])
                                            : _mm512_fmadd_ps(s, factor[r], _mm512_maskz_loadu_ps(m, mask + at));
        _mm512_storeu_ps(w->scores + (row + r) * p->padded_k + at, x);
        largest[r] = _mm512_mask_max_ps(largest[r], m, largest[r], x);
      }
    }
  }
  for (int r = 0; r < count; r++) w->largest[row + r] = largest[r];
}

static __attribute__((noinline)) void scores8(const Problem* p, Work* w, int64_t row) { score_rows(p, w, row, 8); }
static __attribute__((noinline)) void scores4(const Problem* p, Work* w, int64_t row) { score_rows(p, w, row, 4); }

/* The softmax of SOFT_ROWS rows from `row` on, side by side (their chains overlap), from their scores (scaled and
 * masked): e^(s - max), each times its key's V scale, quantized to uint8 with the row's largest as 255 (zeros up
 * to padded_k), and the row's factor: that largest / 255 / the numerators' sum (0 where every key is masked to
 * -inf; NaN where a score is NaN or +inf, whose numerators are NaN, or a V row holds a NaN or infinity). */
static void softmax_rows(const Problem* p, Work* w, int64_t row) {
  __m512 shift[SOFT_ROWS], sum[SOFT_ROWS], heaviest[SOFT_ROWS];
  for (int i = 0; i < SOFT_ROWS; i++) {
    const float top = _mm512_reduce_max_ps(w->largest[row + i]);
    shift[i] = _mm512_set1_ps(top == -INFINITY ? 0.0f : top);
    sum[i] = heaviest[i] = _mm512_setzero_ps();
  }
  for (int64_t key = 0; key < p->seq_k; key += 16) {
    const __mmask16 m = hotrod_first(p->seq_k - key);
    const __m512 scales = _mm512_loadu_ps(w->value_scales + key);
    for (int i = 0; i < SOFT_ROWS; i++) {
      float* s = w->scores + (row + i) * p->padded_k + key;
      const __m512 e = _mm512_maskz_mov_ps(m, hotrod_exp_neg_of(_mm512_sub_ps(_mm512_loadu_ps(s), shift[i]), 1));
      sum[i] = _mm512_add_ps(sum[i], e);
      const __m512 weight = _mm512_mul_ps(e, scales);
      _mm512_storeu_ps(s, weight);
      heaviest[i] = _mm512_max_ps(heaviest[i], weight);
    }
  }
  for (int i = 0; i < SOFT_ROWS; i++) {
    const float total = _mm512_reduce_add_ps(sum[i]), top = _mm512_reduce_max_ps(heaviest[i]);
    const __m512 to_bytes = _mm512_set1_ps(top > 0.0f ? 255.0f / top : 0.0f);
    const float* s = w->scores + (row + i) * p->padded_k;
    uint8_t* out = w->weights + (row + i) * p->padded_k;
    int64_t key = 0;
    for (; key < p->seq_k; key += 16)
      _mm_storeu_si128((__m128i*)(out + key),
                       _mm512_cvtusepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(s + key), to_bytes))));
    memset(out + key, 0, (size_t)(p->padded_k - key));
    w->factors[row + i] = isnan(total) || w->broken ? __builtin_nanf("") : total > 0.0f ? top / 255.0f / total : 0.0f;
  }
}

/* P V for ROWS rows from `row` on (`count` of them; `answered` of them written) into the output from element `at`
 * on (y's, or quantized into q's), each row's sums times its factor. */
static inline __attribute__((always_inline)) void weigh_rows(const Problem* p, Work* w, int64_t row, const int count,
                                                             int64_t answered, int64_t at) {
  const int64_t blocks = w->columns / 16, width = p->heads * p->head_size;
  const hotrod_attention_out* out = &p->out;
  for (int64_t block = 0; block < blocks; block += 2) {
    int32_t sums[ROWS * 32] __attribute__((aligned(64)));
    quad_rows(w->weights + row * p->padded_k, p->padded_k, count, w->values + block * 64, 64, blocks * 64,
              p->padded_k / 4, sums);
    for (int r = 0; r < count && r < answered; r++)
      for (int half = 0; half < 2; half++) {
        const int64_t c = (block + half) * 16;
        const __mmask16 m = hotrod_first(p->head_size - c);
        if (!m) continue;
        const __m512 y = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_load_si512(sums + r * 32 + 16 * half)),
                                       _mm512_set1_ps(w->factors[row + r]));
        const int64_t to = at + r * width + c;
        if (out->y != NULL)
          _mm512_mask_storeu_ps(out->y + to, m, y);
        else
          hotrod_quantize_static16(y, out->scale, out->zero_point, m, out->q + to);
      }
  }
}

static __attribute__((noinline)) void weigh8(const Problem* p, Work* w, int64_t row, int64_t answered, int64_t at) {
  weigh_rows(p, w, row, 8, answered, at);
}
static __attribute__((noinline)) void weigh4(const Problem* p, Work* w, int64_t row, int64_t answered, int64_t at) {
  weigh_rows(p, w, row, 4, answered, at);
}

/* The unit's workspace carved from one allocation (NULL where memory ran out). */
static void* workspace(const Problem* p, Work* w) {
  w->quads = (p->head_size + 4 * UNROLL - 1) / (4 * UNROLL) * UNROLL;
  w->columns = (p->head_size + 31) / 32 * 32;
  const size_t keys = (size_t)(p->padded_k * w->quads * 4), values = (size_t)(p->padded_k * w->columns);
  const size_t per_key = (size_t)p->padded_k * (sizeof(int32_t) + 2 * sizeof(float));
  const size_t rows = QUERY_ROWS * ((size_t)w->quads * 4 + (size_t)p->padded_k * (sizeof(float) + 1));
  uint8_t* memory = aligned_alloc(64, (keys + values + per_key + rows + 63) / 64 * 64);
  if (memory == NULL) return NULL;
  w->scores = (float*)memory;
  w->shifts = (int32_t*)(w->scores + QUERY_ROWS * p->padded_k);
  w->key_scales = (float*)(w->shifts + p->padded_k);
  w->value_scales = w->key_scales + p->padded_k;
  w->keys = (uint8_t*)(w->value_scales + p->padded_k);
  w->values = w->keys + keys;
  w->weights = w->values + values;
  w->queries = w->weights + QUERY_ROWS * p->padded_k;
  return memory;
}

/* Unit `index` (a batch row and head) in the task's workspace; the rows of unit `next` (-1: none) asked for a
 * slice a block, so that they are in the cache when it starts. */
static void unit(const Problem* p, int64_t index, int64_t next, Work* w) {
  const int64_t b = index / p->heads, h = index % p->heads;
  const int64_t width = p->heads * p->head_size, at = b * p->seq_q * width + h * p->head_size;
  const int64_t blocks = (p->seq_q + QUERY_ROWS - 1) / QUERY_ROWS;
  pack_keys(p, hotrod_attention_rows(p, p->k, index, p->seq_k), w);
  pack_values(p, hotrod_attention_rows(p, p->v, index, p->seq_k), w);
  for (int64_t row = 0, block = 0; row < p->seq_q; row += QUERY_ROWS, block++) {
    const int64_t rows = p->seq_q - row < QUERY_ROWS ? p->seq_q - row : QUERY_ROWS;
    const int64_t filled = (rows + SOFT_ROWS - 1) / SOFT_ROWS * SOFT_ROWS; /* zero queries past the last */
    const float* q = hotrod_attention_rows(p, p->q, index, p->seq_q) + row * width;
    if (row == 0) hotrod_ask_rows(q, 0, QUERY_ROWS, rows, width, p->head_size);
    load_queries(p, q, rows, filled, w);
    /* the next block's, while this one runs */
    hotrod_ask_rows(q, QUERY_ROWS, QUERY_ROWS, p->seq_q - row, width, p->head_size);
    hotrod_attention_ask_next(p, next, block, blocks);
    for (int64_t r = 0; r < filled; r++) w->masks[r] = hotrod_attention_mask_row(p, b, h, row + r, row + rows);
    for (int64_t r = 0; r < filled; r += ROWS) (filled - r >= ROWS ? scores8 : scores4)(p, w, r);
    for (int64_t r = 0; r < filled; r += SOFT_ROWS) softmax_rows(p, w, r);
    for (int64_t r = 0; r < filled; r += ROWS)
      (filled - r >= ROWS ? weigh8 : weigh4)(p, w, r, rows - r, at + (row + r) * width);
  }
}

void hotrod_attention_quads_task(void* data, size_t task) {
  const Problem* p = data;
  const int64_t group = hotrod_attention_group(p), first = (int64_t)task * group, units = p->batch * p->heads;
  const int64_t end = first + group < units ? first + group : units;
  Work w;
  void* memory = workspace(p, &w);
  for (int64_t index = first; index < end; index++) {
    if (memory == NULL) {
      const int64_t b = index / p->heads, h = index % p->heads;
      hotrod_attention_unanswered(p, b * p->seq_q * p->heads * p->head_size + h * p->head_size);
      continue;
    }
    unit(p, index, index + 1 < end ? index + 1 : -1, &w);
  }
  free(memory);
}
