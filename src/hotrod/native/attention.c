/* Encoder self-attention with bf16 products on AMX tiles, the kernel behind hotrod's Bf16Attention op.
 *
 * softmax(Q K^T * scale + mask) V for each batch row and head, Q, K and V [batch, sequence, heads x head size]
 * in fp32 (a fused Q/K/V product's three parts). onnxruntime's CPU Attention computes both products in fp32;
 * on a CPU with AMX-BF16 a core's tiles multiply bf16 pairs into fp32 sums many times faster. Here Q, K and V
 * are rounded to bf16 (nearest even), the sums are fp32, the scale, the mask and the softmax are fp32, and the
 * softmax's numerators are rounded to bf16 for the second product, whose sums are divided by the
 * denominator at the end. The answers differ from fp32 attention by bf16's rounding (8 significant bits),
 * finer than the int8 products around it; a graph takes this kernel only where its build asked for it, so
 * the build's verification measured it.
 *
 * A batch row and head is one unit of work, run on the caller's threads (onnxruntime's pool):
 * - K is packed once per unit as the second operand of Q K^T: for each 16 keys and each 32 of depth, a tile
 *   whose row r holds, for each of the 16 keys, its depths 2r and 2r + 1 (the pair layout TDPBF16PS reads);
 * - V likewise for P V: for each 32 keys and 16 columns, a tile whose row r holds keys 2r and 2r + 1 of each
 *   column;
 * - queries go 32 at a time: their scores for all keys (32 a step: two tiles of queries by two of keys, four
 *   tiles of sums), the softmax of each row in fp32 with its numerators in bf16, then P V (32 columns a step:
 *   two tiles of numerators by two of values). Each operand tile is loaded once a step and read by two
 *   products, as the int8 products' 2 x 2 steps are.
 * On a CPU without the tiles (or where the op was told to leave them), the same packed bf16 operands go through
 * AVX512_BF16's VDPBF16PS where the op asks for that path (PAIRS: two products a lane an instruction, a row's
 * sums in registers through the whole depth), or else the two products run on AVX-512F (attention_vectors.c)
 * from values rounded to bf16 the same way (but for subnormals, which the bf16 conversion instructions flush to
 * zero), multiplied as floats; the same softmax on every path.
 * Where the build asked for int8 attention, the op's path is QUADS: int8 products on AVX-512 VNNI
 * (attention_quads.c), and on a CPU without VNNI the path on AVX-512F.
 * The paths sum in different orders, so an op keeps one (its `tiles` attribute) for its session.
 * A head size that is not a multiple of 32 is padded with zero depths (and columns), which add nothing.
 * Keys are padded to a multiple of 32 with zeros whose numerators are 0: a row's answer does not depend on
 * the padding, nor on its batch-mates, nor on the other queries of its block.
 */
#include <immintrin.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "attention.h"
#include "attention_problem.h"
#include "attention_quads.h"
#include "attention_vectors.h"
#include "lanes.h"
#include "quantize.h"
#include "transpose.h"

#define TILE_ROWS 16
#define QUERY_ROWS HOTROD_ATTENTION_QUERY_ROWS /* queries a block: two tiles of rows */
#define PAIR_KEYS 32    /* keys in one tile of P or of packed V, and a step of Q K^T; keys are padded to a multiple */
#define TILE_HALVES 512 /* bf16 values in a tile: 16 rows of 32 */
#define TILES 1         /* the paths (the op's `tiles`): AMX's tiles, */
#define PAIRS 2         /* their operands on AVX512_BF16's vectors (0: floats on AVX-512F's FMAs), */
#define QUADS 3         /* int8 operands on AVX-512 VNNI (attention_quads.c) */

int hotrod_attention_pairs_ready(void) {
  return hotrod_attention_vectors_ready() && __builtin_cpu_supports("avx512bf16");
}

/* Tiles (hotrod_configure_tiles): 0, 1 queries or P (16 rows each), 2, 3 packed K or V, 4-7 sums. */

typedef hotrod_attention_problem Problem;

/* 16 floats as bf16, rounded to nearest even. */
static inline __m256i bf16(__m512 x) { return (__m256i)_mm512_cvtneps_pbh(x); }

/* 32 floats as bf16 in one vector, low's 16 then high's, rounded as bf16() rounds them. */
static inline __m512i bf16_pair(__m512 low, __m512 high) { return (__m512i)_mm512_cvtne2ps_pbh(high, low); }


/* K's keys of one unit as Q K^T's second operand: tile (block, step) at (block * steps + step) * 512, its row r
 * holding depths 2r and 2r + 1 of each of 16 keys: 16 keys' pairs of a step, one vector a key, transposed. Keys
 * past the last are zeros up to the 32 a step of Q K^T reads; their scores are never read, but zeros keep the
 * tiles free of stale values. */
static void pack_keys(const Problem* p, const float* k, uint16_t* packed) {
  const int64_t steps = p->depth / 32, width = p->heads * p->head_size;
  const int64_t blocks = (p->seq_k + 15) / 16;
  memset(packed + blocks * 16 * p->depth, 0, (size_t)((p->padded_k - blocks * 16) * p->depth) * sizeof(uint16_t));
  hotrod_ask_rows(k, 0, 16, p->seq_k, width, p->head_size);
  for (int64_t block = 0; block < blocks; block++) {
    hotrod_ask_rows(k, (block + 1) * 16, 16, p->seq_k, width, p->head_size); /* the next 16 keys' rows */
    for (int64_t step = 0; step < steps; step++) {
      __m512i keys[16];
      const int64_t left = p->head_size - step * 32;
      for (int64_t j = 0; j < 16; j++) {
        const int64_t key = block * 16 + j;
        keys[j] = _mm512_setzero_si512();
        if (key < p->seq_k) {
          const float* row = k + key * width + step * 32;
          keys[j] = bf16_pair(hotrod_load_first(left, row), hotrod_load_first(left - 16, row + 16));
        }
      }
      hotrod_transpose16(keys);
      uint16_t* tile = packed + (block * steps + step) * TILE_HALVES;
      for (int r = 0; r < 16; r++) _mm512_storeu_si512(tile + r * 32, keys[r]);
    }
  }
}

/* V's keys of one unit as P V's second operand: tile (pair block, column block) at
 * (pair block * blocks + column block) * 512, row r holding keys 2r and 2r + 1 of 16 columns. */
static void pack_values(const Problem* p, const float* v, uint16_t* packed) {
  const int64_t blocks = p->blocks, width = p->heads * p->head_size;
  const __m512i interleave = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22,
                                              6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  hotrod_ask_rows(v, 0, 16, p->seq_k, width, p->head_size);
  for (int64_t key = 0; key < p->padded_k; key += 2) {
    if (key % 16 == 0) hotrod_ask_rows(v, key + 16, 16, p->seq_k, width, p->head_size); /* the next 16 keys' rows */
    for (int64_t block = 0; block < blocks; block++) {
      const __mmask16 columns = hotrod_first(p->head_size - block * 16);
      const __m512 zero = _mm512_setzero_ps();
      const __m512 even = key < p->seq_k ? _mm512_maskz_loadu_ps(columns, v + key * width + block * 16) : zero;
      const __m512 odd = key + 1 < p->seq_k ? _mm512_maskz_loadu_ps(columns, v + (key + 1) * width + block * 16) : zero;
      const __m512i pair = _mm512_permutexvar_epi16(interleave, bf16_pair(even, odd));
      uint16_t* tile = packed + ((key / PAIR_KEYS) * blocks + block) * TILE_HALVES;
      _mm512_storeu_si512(tile + (key % PAIR_KEYS / 2) * 32, pair);
    }
  }
}

/* Q K^T for 32 queries (their bf16 rows in `queries`: per 32 of depth, two tiles of 16 rows) into scores
 * [32, padded_k], 32 keys a step: the two query tiles by the two key tiles, four tiles of sums, each operand
 * loaded once a depth step (keys past the last 32-key group that holds one are skipped: never read). */
static void scores_of(const Problem* p, const uint16_t* queries, const uint16_t* keys, float* scores) {
  const int64_t steps = p->depth / 32, stride = p->padded_k * (int64_t)sizeof(float);
  for (int64_t key = 0; key < p->seq_k; key += PAIR_KEYS) {
    const uint16_t* block = keys + (key / 16) * steps * TILE_HALVES;
    _tile_zero(4);
    _tile_zero(5);
    _tile_zero(6);
    _tile_zero(7);
    for (int64_t step = 0; step < steps; step++) {
      _tile_loadd(0, queries + 2 * step * TILE_HALVES, 64);
      _tile_loadd(2, block + step * TILE_HALVES, 64);
      _tile_loadd(1, queries + (2 * step + 1) * TILE_HALVES, 64);
      _tile_loadd(3, block + (steps + step) * TILE_HALVES, 64);
      _tile_dpbf16ps(4, 0, 2);
      _tile_dpbf16ps(5, 0, 3);
      _tile_dpbf16ps(6, 1, 2);
      _tile_dpbf16ps(7, 1, 3);
    }
    _tile_stored(4, scores + key, stride);
    _tile_stored(5, scores + key + 16, stride);
    _tile_stored(6, scores + TILE_ROWS * p->padded_k + key, stride);
    _tile_stored(7, scores + TILE_ROWS * p->padded_k + key + 16, stride);
  }
}

/* Rows of scores whose softmax runs side by side: each row's chains of dependent steps (its maximum, its sum)
 * overlap the others', where one row at a time waited on them. */
#define SOFTMAX_ROWS 4

/* 16 numerators from element `at` on, as the path's P V reads them: bf16, or floats rounded to bf16 (a constant
 * `tiles` where inlined: the vector path's code holds no BF16 instruction, which its CPUs may lack). */
static inline __attribute__((always_inline)) void put_numerators(int tiles, void* numerators, int64_t at, __m512 e) {
  if (tiles)
    _mm256_storeu_si256((__m256i*)((uint16_t*)numerators + at), bf16(e));
  else
    _mm512_storeu_ps((float*)numerators + at, hotrod_round_bf16(e));
}

/* The softmax of SOFTMAX_ROWS query rows: scores scaled and masked in fp32 (masks[i] NULL: none), numerators
 * e^(s - max) in bf16 (0 past the keys, up to the 32 P V reads), and 1 / their sum in inverse (0 where every key is
 * masked to -inf; NaN where a score is NaN or +inf, as fp32 attention's row would be, rather than a finite row
 * that dropped it: such a score makes a NaN numerator, e^(NaN) or e^(inf - inf), and so a NaN sum). Each row's
 * arithmetic is its own, in the same order as one row alone. */
static inline __attribute__((always_inline)) void softmax_rows(const Problem* p, const int tiles, float* scores,
                                                              const float* const* masks, void* numerators,
                                                              float* inverse) {
  const __m512 scale = _mm512_set1_ps(p->scale);
  __m512 largest[SOFTMAX_ROWS][2]; /* two chains of maxima a row: exact in any order */
  for (int i = 0; i < SOFTMAX_ROWS; i++) largest[i][0] = largest[i][1] = _mm512_set1_ps(-INFINITY);
  for (int64_t key = 0; key < p->seq_k; key += 16) {
    const __mmask16 m = hotrod_first(p->seq_k - key);
    for (int i = 0; i < SOFTMAX_ROWS; i++) {
      float* row = scores + i * p->padded_k + key;
      const __m512 raw = _mm512_maskz_loadu_ps(m, row);
      const __m512 s = masks[i] == NULL ? _mm512_mul_ps(raw, scale)
                                        : _mm512_fmadd_ps(raw, scale, _mm512_maskz_loadu_ps(m, masks[i] + key));
      _mm512_mask_storeu_ps(row, m, s);
      __m512* chain = &largest[i][(key / 16) & 1];
      *chain = _mm512_mask_max_ps(*chain, m, *chain, s);
    }
  }
  __m512 shift[SOFTMAX_ROWS], sum[SOFTMAX_ROWS];
  for (int i = 0; i < SOFTMAX_ROWS; i++) {
    const float top = _mm512_reduce_max_ps(_mm512_max_ps(largest[i][0], largest[i][1]));
    shift[i] = _mm512_set1_ps(top == -INFINITY ? 0.0f : top);
    sum[i] = _mm512_setzero_ps();
  }
  const int64_t whole = p->seq_k / 16 * 16;
  for (int64_t key = 0; key < whole; key += 16) /* whole vectors: no lanes to clear */
    for (int i = 0; i < SOFTMAX_ROWS; i++) {
      const __m512 e = hotrod_exp_neg(_mm512_sub_ps(_mm512_loadu_ps(scores + i * p->padded_k + key), shift[i]));
      sum[i] = _mm512_add_ps(sum[i], e);
      put_numerators(tiles, numerators, i * p->padded_k + key, e);
    }
  for (int i = 0; i < SOFTMAX_ROWS; i++) {
    int64_t key = whole;
    if (key < p->seq_k) {
      const __mmask16 m = hotrod_first(p->seq_k - key);
      const __m512 s = _mm512_maskz_loadu_ps(m, scores + i * p->padded_k + key);
      const __m512 e = _mm512_maskz_mov_ps(m, hotrod_exp_neg(_mm512_sub_ps(s, shift[i])));
      sum[i] = _mm512_add_ps(sum[i], e);
      put_numerators(tiles, numerators, i * p->padded_k + key, e);
      key += 16;
    }
    const size_t size = tiles ? sizeof(uint16_t) : sizeof(float);
    memset((char*)numerators + (size_t)(i * p->padded_k + key) * size, 0, (size_t)(p->padded_k - key) * size);
    const float total = _mm512_reduce_add_ps(sum[i]);
    inverse[i] = isnan(total) ? __builtin_nanf("") : total > 0.0f ? 1.0f / total : 0.0f;
  }
}

/* The softmax made once per path, its numerators' type a constant in each. */
static void softmax_tiles(const Problem* p, float* scores, const float* const* masks, void* numerators,
                          float* inverse) {
  softmax_rows(p, 1, scores, masks, numerators, inverse);
}

static void softmax_vectors(const Problem* p, float* scores, const float* const* masks, void* numerators,
                            float* inverse) {
  softmax_rows(p, 0, scores, masks, numerators, inverse);
}

static void answer(const Problem* p, const float* spill, const float* inverse, int64_t at, int64_t rows);

/* P V for 32 queries (P their bf16 numerators [32, padded_k]) into the output from element `at` on (y's, or
 * quantized into q's), each row times its 1 / sum: 32 columns
 * at a time, the two tiles of P by two tiles of V a step of 32 keys (one where a last block stands alone), the
 * sums stored to `spill` [32, depth]; the rows are scaled into y once every column's sums are stored, not
 * after each 32 columns: a load that follows a tile store to its address closely waits on it. */
static void weighted_values(const Problem* p, const uint16_t* numerators, const uint16_t* values,
                            const float* inverse, int64_t at, int64_t rows, float* spill) {
  const int64_t blocks = p->blocks, stride = p->padded_k * (int64_t)sizeof(uint16_t);
  const size_t spill_stride = (size_t)p->depth * sizeof(float);
  for (int64_t first_block = 0; first_block < blocks; first_block += 2) {
    const int pair = blocks - first_block > 1;
    _tile_zero(4);
    _tile_zero(5);
    _tile_zero(6);
    _tile_zero(7);
    for (int64_t key = 0; key < p->padded_k; key += PAIR_KEYS) {
      const uint16_t* tile = values + ((key / PAIR_KEYS) * blocks + first_block) * TILE_HALVES;
      _tile_loadd(0, numerators + key, stride);
      _tile_loadd(2, tile, 64);
      _tile_loadd(1, numerators + TILE_ROWS * p->padded_k + key, stride);
      _tile_dpbf16ps(4, 0, 2);
      _tile_dpbf16ps(6, 1, 2);
      if (pair) {
        _tile_loadd(3, tile + TILE_HALVES, 64);
        _tile_dpbf16ps(5, 0, 3);
        _tile_dpbf16ps(7, 1, 3);
      }
    }
    float* sums = spill + first_block * 16;
    _tile_stored(4, sums, spill_stride);
    _tile_stored(5, sums + 16, spill_stride);
    _tile_stored(6, sums + TILE_ROWS * p->depth, spill_stride);
    _tile_stored(7, sums + TILE_ROWS * p->depth + 16, spill_stride);
  }
  answer(p, spill, inverse, at, rows);
}

/* -- the same products on AVX512_BF16's VDPBF16PS, without tiles --------------------------------------------
 * The operands as the tiles' path packs them (a 64-byte row of a tile: a pair of depths, or of keys, for 16 keys,
 * or columns), each pair of a row's values broadcast against one such row: one instruction multiplies two
 * depths of 16 keys, where the path on FMAs multiplies one. PAIR_ROWS rows by 32 columns a step, their sums in
 * registers through the whole depth; each row's sums the same whatever rows go with it. */
#define PAIR_ROWS 8

/* The pair of bf16 values at `at` (two halves), in every lane. */
static inline __m512bh pair_at(const uint16_t* at) {
  int32_t word;
  memcpy(&word, at, sizeof word);
  return (__m512bh)_mm512_set1_epi32(word);
}

/* Where pairs are laid out: pair i of row r at rows + r * row_stride + (i / 16) * row_jump + 2 * (i % 16); of the
 * columns at low (and high) + (i / 16) * jump + 32 * (i % 16). */
typedef struct {
  const uint16_t *rows, *low, *high; /* high NULL: 16 columns only */
  int64_t row_stride, row_jump, jump, pairs;
} Pairs;

/* sums[r * sums_stride + 0..32) for rows r < count: each row's pairs against 16 + 16 columns' pairs. */
static inline __attribute__((always_inline)) void pair_rows(const Pairs* o, const int count, float* sums,
                                                           int64_t sums_stride) {
  __m512 acc[PAIR_ROWS][2];
  for (int r = 0; r < count; r++) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
  for (int64_t i = 0; i < o->pairs; i++) {
    const int64_t at = (i / 16) * o->jump + (i % 16) * 32, row_at = (i / 16) * o->row_jump + (i % 16) * 2;
    const __m512bh l = (__m512bh)_mm512_loadu_si512(o->low + at);
    const __m512bh h = o->high != NULL ? (__m512bh)_mm512_loadu_si512(o->high + at) : (__m512bh)_mm512_setzero_si512();
    for (int r = 0; r < count; r++) {
      const __m512bh x = pair_at(o->rows + r * o->row_stride + row_at);
      acc[r][0] = _mm512_dpbf16_ps(acc[r][0], x, l);
      acc[r][1] = _mm512_dpbf16_ps(acc[r][1], x, h);
    }
  }
  for (int r = 0; r < count; r++) {
    _mm512_storeu_ps(sums + r * sums_stride, acc[r][0]);
    if (o->high != NULL) _mm512_storeu_ps(sums + r * sums_stride + 16, acc[r][1]);
  }
}

#define PAIR_ROWS_OF(count)                                                                \
  static __attribute__((noinline)) void pairs##count(const Pairs* o, float* sums, int64_t stride) { \
    pair_rows(o, count, sums, stride);                                                      \
  }
PAIR_ROWS_OF(1) PAIR_ROWS_OF(2) PAIR_ROWS_OF(3) PAIR_ROWS_OF(4) PAIR_ROWS_OF(5) PAIR_ROWS_OF(6) PAIR_ROWS_OF(7)
PAIR_ROWS_OF(8)
static void (*const PAIR_KERNELS[PAIR_ROWS])(const Pairs*, float*, int64_t) = {pairs1, pairs2, pairs3, pairs4,
                                                                       pairs5, pairs6, pairs7, pairs8};

/* Rows [0, rows) of `o` in groups of PAIR_ROWS (each group's rows `o->row_stride` apart), into sums. */
static void pair_groups(Pairs o, int64_t rows, float* sums, int64_t sums_stride) {
  const uint16_t* first = o.rows;
  for (int64_t row = 0; row < rows; row += PAIR_ROWS) {
    const int64_t count = rows - row < PAIR_ROWS ? rows - row : PAIR_ROWS;
    o.rows = first + row * o.row_stride;
    PAIR_KERNELS[count - 1](&o, sums + row * sums_stride, sums_stride);
  }
}

/* Q K^T as scores_of computes it, for the first `rows` queries (load_queries' layout). */
static void scores_of_pairs(const Problem* p, const uint16_t* queries, const uint16_t* keys, int64_t rows,
                            float* scores) {
  const int64_t steps = p->depth / 32;
  for (int64_t key = 0; key < p->seq_k; key += PAIR_KEYS) {
    const uint16_t* block = keys + (key / 16) * steps * TILE_HALVES;
    const Pairs o = {queries, block, block + steps * TILE_HALVES, 32, 2 * TILE_HALVES, TILE_HALVES, 16 * steps};
    pair_groups(o, rows, scores + key, p->padded_k);
  }
}

/* P V as weighted_values computes it, for the first `rows` queries (P their bf16 numerators [32, padded_k]). */
static void weighted_values_pairs(const Problem* p, const uint16_t* numerators, const uint16_t* values,
                                  const float* inverse, int64_t at, int64_t rows, float* spill) {
  const int64_t blocks = p->blocks;
  for (int64_t first_block = 0; first_block < blocks; first_block += 2) {
    const uint16_t* low = values + first_block * TILE_HALVES;
    const Pairs o = {numerators, low, blocks - first_block > 1 ? low + TILE_HALVES : NULL, p->padded_k, 32,
                     blocks * TILE_HALVES, p->padded_k / 2};
    pair_groups(o, rows, spill + first_block * 16, p->depth);
  }
  answer(p, spill, inverse, at, rows);
}

/* Rows' sums in `spill` [rows, depth] times their 1 / sum, into the output from element `at` on (y's, or
 * quantized into q's). */
static void answer(const Problem* p, const float* spill, const float* inverse, int64_t at, int64_t rows) {
  const int64_t blocks = p->blocks, width = p->heads * p->head_size;
  const hotrod_attention_out* out = &p->out;
  for (int64_t r = 0; r < rows; r++) {
    const __m512 factor = _mm512_set1_ps(inverse[r]);
    for (int64_t block = 0; block < blocks; block++) {
      const __m512 y = _mm512_mul_ps(_mm512_loadu_ps(spill + r * p->depth + block * 16), factor);
      const __mmask16 m = hotrod_first(p->head_size - block * 16);
      const int64_t to = at + r * width + block * 16;
      if (out->y != NULL)
        _mm512_mask_storeu_ps(out->y + to, m, y);
      else
        hotrod_quantize_static16(y, out->scale, out->zero_point, m, out->q + to);
    }
  }
}

/* 32 query rows (fewer at the end) as bf16 tiles, two of 16 rows per 32 of depth, zero rows past the end. */
static void load_queries(const Problem* p, const float* q, int64_t rows, uint16_t* queries) {
  const int64_t steps = p->depth / 32, width = p->heads * p->head_size;
  for (int64_t step = 0; step < steps; step++)
    for (int64_t r = 0; r < QUERY_ROWS; r++) {
      const float* row = q + r * width + step * 32;
      const int64_t left = r < rows ? p->head_size - step * 32 : 0;
      const __m512 low = hotrod_load_first(left, row), high = hotrod_load_first(left - 16, row + 16);
      _mm512_storeu_si512(queries + 2 * step * TILE_HALVES + r * 32, bf16_pair(low, high));
    }
}

/* One batch row and head's K and V packed for the path's products (and the tiles configured for this thread,
 * which may be any of the pool's). */
static void pack(const Problem* p, const float* k, const float* v, void* keys, void* values) {
  if (p->tiles) {
    pack_keys(p, k, keys);
    pack_values(p, v, values);
    if (p->tiles == TILES) hotrod_configure_tiles();
    return;
  }
  const int64_t width = p->heads * p->head_size;
  hotrod_attention_pack_keys(k, width, p->seq_k, p->padded_k, p->head_size, p->depth, keys);
  hotrod_attention_pack_values(v, width, p->seq_k, p->padded_k, p->head_size, p->depth, values);
}

/* Up to 32 query rows from `q` rounded into `queries` and their scores for every key into `scores`. Without
 * tiles, only the rows the softmax reads (whole groups of SOFTMAX_ROWS; those past the last are zero queries). */
static void scores_for(const Problem* p, const float* q, int64_t rows, const void* keys, void* queries,
                       float* scores) {
  const int64_t width = p->heads * p->head_size;
  if (p->tiles) {
    load_queries(p, q, rows, queries);
    if (p->tiles == TILES)
      scores_of(p, queries, keys, scores);
    else
      scores_of_pairs(p, queries, keys, (rows + SOFTMAX_ROWS - 1) / SOFTMAX_ROWS * SOFTMAX_ROWS, scores);
    return;
  }
  hotrod_attention_queries(q, width, rows, p->head_size, p->depth, queries);
  hotrod_attention_scores(queries, keys, (rows + SOFTMAX_ROWS - 1) / SOFTMAX_ROWS * SOFTMAX_ROWS, p->seq_k,
                          p->padded_k, p->depth, scores);
}

void hotrod_attention_unanswered(const Problem* p, int64_t at) {
  const int64_t width = p->heads * p->head_size;
  for (int64_t r = 0; r < p->seq_q; r++)
    for (int64_t c = 0; c < p->head_size; c++)
      if (p->out.y != NULL)
        p->out.y[at + r * width + c] = __builtin_nanf("");
      else
        p->out.q[at + r * width + c] = (uint8_t)p->out.zero_point;
}

/* Unit `index` (a batch row and head), asking for unit `next`'s rows (-1: none) while its blocks run. */
static void unit(const Problem* p, int64_t index, int64_t next) {
  const int64_t b = index / p->heads, h = index % p->heads;
  const int64_t blocks = (p->seq_q + QUERY_ROWS - 1) / QUERY_ROWS;
  const int64_t width = p->heads * p->head_size, offset = h * p->head_size;
  const size_t size = p->tiles ? sizeof(uint16_t) : sizeof(float); /* a rounded value's bytes on the path */
  const size_t packed = (size_t)(p->padded_k * p->depth) * size;    /* K's; V's take at most as much */
  const size_t bytes = 2 * packed + QUERY_ROWS * (size_t)p->padded_k * (sizeof(float) + size) +
                       (size_t)(QUERY_ROWS * p->depth) * (size + sizeof(float));
  uint8_t* memory = aligned_alloc(64, (bytes + 63) / 64 * 64);
  const int64_t at = b * p->seq_q * width + offset; /* the unit's first output */
  if (memory == NULL) {
    hotrod_attention_unanswered(p, at);
    return;
  }
  uint8_t *keys = memory, *values = memory + packed;
  float* scores = (float*)(memory + 2 * packed);
  uint8_t* numerators = (uint8_t*)(scores + QUERY_ROWS * p->padded_k);
  uint8_t* queries = numerators + QUERY_ROWS * (size_t)p->padded_k * size;
  float* spill = (float*)(queries + QUERY_ROWS * (size_t)p->depth * size);
  pack(p, p->k + b * p->seq_k * width + offset, p->v + b * p->seq_k * width + offset, keys, values);
  for (int64_t row = 0, block = 0; row < p->seq_q; row += QUERY_ROWS, block++) {
    const int64_t rows = p->seq_q - row < QUERY_ROWS ? p->seq_q - row : QUERY_ROWS;
    float inverse[QUERY_ROWS] = {0};
    const float* q = p->q + (b * p->seq_q + row) * width + offset;
    scores_for(p, q, rows, keys, queries, scores);
    hotrod_ask_rows(q, QUERY_ROWS, QUERY_ROWS, p->seq_q - row, width, p->head_size); /* the next block's */
    hotrod_attention_ask_next(p, next, block, blocks);
    for (int64_t r = 0; r < rows; r += SOFTMAX_ROWS) { /* QUERY_ROWS is a multiple of SOFTMAX_ROWS */
      const float* masks[SOFTMAX_ROWS];
      for (int i = 0; i < SOFTMAX_ROWS; i++) masks[i] = hotrod_attention_mask_row(p, b, h, row + r + i, row + rows);
      (p->tiles ? softmax_tiles : softmax_vectors)(p, scores + r * p->padded_k, masks,
                                                   numerators + (size_t)(r * p->padded_k) * size, inverse + r);
    }
    if (!p->tiles) { /* P V of the rows there are */
      hotrod_attention_weigh((float*)numerators, (float*)values, rows, p->padded_k, p->head_size, p->depth, spill);
      answer(p, spill, inverse, at + row * width, rows);
      continue;
    }
    if (p->tiles == PAIRS) {
      weighted_values_pairs(p, (uint16_t*)numerators, (uint16_t*)values, inverse, at + row * width, rows, spill);
      continue;
    }
    for (int64_t r = rows; r < QUERY_ROWS; r++) { /* past the last query: no row to answer (P V reads zeros) */
      memset(numerators + (size_t)(r * p->padded_k) * size, 0, (size_t)p->padded_k * size);
      inverse[r] = 0.0f;
    }
    weighted_values(p, (uint16_t*)numerators, (uint16_t*)values, inverse, at + row * width, rows, spill);
  }
  if (p->tiles == TILES) _tile_release();
  free(memory);
}

/* Task `task`: its units in turn (hotrod_attention_group), each asking for the next one's rows. */
static void task(void* data, size_t task) {
  const Problem* p = data;
  const int64_t group = hotrod_attention_group(p), first = (int64_t)task * group, units = p->batch * p->heads;
  const int64_t end = first + group < units ? first + group : units;
  for (int64_t index = first; index < end; index++) unit(p, index, index + 1 < end ? index + 1 : -1);
}

/* The mask's strides for [batch, heads, query rows], its dimensions right-aligned to [B, H, Sq, Sk] with 1
 * where broadcast; 0 where they do not fit. */
static int mask_strides(const Problem* p, const int64_t* dims, size_t count, int64_t* strides) {
  const int64_t full[4] = {p->batch, p->heads, p->seq_q, p->seq_k};
  int64_t d[4] = {1, 1, 1, 1};
  if (count < 1 || count > 4) return 0;
  for (size_t i = 0; i < count; i++) d[4 - count + i] = dims[i];
  if (d[3] != p->seq_k) return 0;
  int64_t stride = d[3];
  for (int i = 2; i >= 0; i--) {
    if (d[i] != 1 && d[i] != full[i]) return 0;
    strides[i] = d[i] == 1 ? 0 : stride;
    stride *= d[i];
  }
  return 1;
}

int hotrod_bf16_attention(const float* q, const float* k, const float* v, int64_t batch, int64_t seq_q,
                          int64_t seq_k, int64_t heads, int64_t head_size, float scale, const float* mask,
                          const int64_t* mask_dims, size_t mask_count, const hotrod_attention_out* out, int tiles,
                          hotrod_parallel parallel, void* runner) {
  /* the call's path, set once: the one asked where this CPU has it, else the one on AVX-512F */
  tiles = (tiles == TILES && hotrod_amx_ready()) || (tiles == PAIRS && hotrod_attention_pairs_ready()) ||
                  (tiles == QUADS && hotrod_attention_quads_ready())
              ? tiles
              : 0;
  if (!(tiles || hotrod_attention_vectors_ready()) || head_size <= 0 || seq_k <= 0 || !isfinite(scale)) return -1;
  Problem p = {q, k, v, mask, *out, batch, seq_q, seq_k, heads, head_size, 0, 0, 0, {0, 0, 0}, scale, tiles};
  p.depth = (head_size + 31) / 32 * 32;
  p.blocks = (head_size + 15) / 16;
  p.padded_k = (seq_k + PAIR_KEYS - 1) / PAIR_KEYS * PAIR_KEYS;
  if (mask != NULL && !mask_strides(&p, mask_dims, mask_count, p.mask_stride)) return -1;
  if (batch * heads * seq_q <= 0) return 0;
  parallel(runner, tiles == QUADS ? hotrod_attention_quads_task : task, &p, hotrod_attention_tasks(&p));
  return 0;
}
