/* bf16 products on AMX tiles, the kernel behind hotrod's Bf16MatMul op.
 *
 * An fp32 encoder's products, computed with both operands rounded to bf16 (8 significant bits) and the sums kept
 * in fp32: on a CPU with AMX-BF16 a core's tiles multiply bf16 several times faster than its fp32 units, and
 * on a trained model the answers stay those of fp32 where 8-bit activations do not (benchmarks/README.md:
 * "bf16 products"). The graph's own weights stay fp32; they are rounded and packed once, as the graph is loaded
 * (`hotrod.runtime.bf16`): for each 32 columns and each 32 of depth, two 16 x 64-byte tiles, a row of which holds
 * 2 consecutive depths of 16 columns, the layout TDPBF16PS reads.
 *
 * A call first rounds its rows to bf16 (to nearest even, as numpy's ml_dtypes rounds) into a buffer of its own,
 * 32 rows a unit of work, its depth padded with zeros; then a step of the inner loop loads two tiles of rows (32
 * rows x 32 depths) and two of weights, and accumulates 32 x 32 fp32 sums with four TDPBF16PS. The epilogue adds
 * the bias, applies a following GELU (gelu.h: onnxruntime's arithmetic) and adds a following residual, and
 * writes only the rows and columns that exist, spread among the next block's tile steps. Every row goes through
 * the tiles (a short call's last tile padded with zero rows), so a row's sums are the same alone and in any batch.
 * On a CPU with AVX-512 BF16 but no tiles (a Zen 4) the same packed weights are read by VDPBF16PS, 8 rows at a
 * time, every row through the same steps.
 *
 * Work is split into blocks of rows by blocks of columns, run on the caller's threads (onnxruntime's pool, through
 * `parallel`): a block of weights stays in a core's cache while its rows go through.
 */
#include <immintrin.h>
#include <stdlib.h>
#include <string.h>

#include "bf16gemm.h"
#include "dots.h"
#include "gelu.h"
#include "lanes.h"
#include "tiles.h"

#define TILE_ROWS 16
#define BLOCK_ROWS 32                   /* rows of one 2 x 2 step: two tiles of rows */
#define UNIT_ROWS 1024                  /* rows of one unit of work, at most */
#define UNIT_ROW_BYTES (1 << 20)        /* and at most this many bytes of rounded rows: they stay in L2 (2 MiB) */
#define PARTIAL_BYTES (256 << 10)       /* a deep product's unit keeps at most this much of partial sums, in L2 */
#define CHUNK_ROWS 256                  /* rows of a unit at least: a deeper product goes through its depth in chunks */
#define TILE_HALVES (TILE_ROWS * 32)    /* bf16 values in one tile: 16 rows of 32 */
#define STEP_HALVES (2 * TILE_HALVES)   /* the two weight tiles of 32 columns at one depth step */
#define VECTOR_ROWS HOTROD_DOT_ROWS     /* rows a step on AVX-512 BF16, without tiles */

typedef struct {
  const float* x;       /* the fp32 rows */
  const uint16_t* a;    /* the same rounded to bf16: [rows][kp], padded to BLOCK_ROWS where rounded here */
  const uint16_t* tail; /* where the rows came rounded: their last block, padded to BLOCK_ROWS; or NULL */
  const uint16_t* w;
  const float* bias;
  float* const* y;      /* the outputs, each `width` of the n columns */
  uint16_t* rounded;    /* where given: Y rounded to bf16 into it instead, [rows][n], for the next product */
  const float* residual; /* [rows, n], added last; or NULL */
  int64_t rows, k, kp, n, padded_n, width, unit_rows, unit_cols, col_units;
  int64_t chunk; /* the depth a unit's rows go through at a time: kp, or less where CHUNK_ROWS of it would not fit */
  int activation;
  int tiles; /* 1: on AMX's tiles; 0: on AVX-512 BF16 (a CPU without them, or the op's choice) */
} Problem;

int hotrod_bf16_vectors_ready(void) {
  return hotrod_has_avx512() && __builtin_cpu_supports("avx512bf16");
}

void hotrod_round_row(const float* x, int64_t k, uint16_t* out) {
  for (int64_t d = 0; d < k; d += 32) {
    const __m512 low = hotrod_load_first(k - d, x + d), high = hotrod_load_first(k - d - 16, x + d + 16);
    const __m512i pair = (__m512i)_mm512_cvtne2ps_pbh(high, low);
    _mm512_mask_storeu_epi16(out + d, k - d >= 32 ? (__mmask32)0xFFFFFFFF : (__mmask32)((1ull << (k - d)) - 1), pair);
  }
}

/* Rows [32 index, 32 index + 32) rounded to bf16 into `a`, depth padded with zeros to kp; rows past the last are
 * zeros. */
static void round_rows(void* data, size_t index) {
  const Problem* p = data;
  for (int64_t r = (int64_t)index * BLOCK_ROWS; r < ((int64_t)index + 1) * BLOCK_ROWS; r++) {
    uint16_t* out = (uint16_t*)p->a + r * p->kp;
    const int64_t made = r < p->rows ? p->k : 0;
    if (made) hotrod_round_row(p->x + r * p->k, p->k, out);
    memset(out + made, 0, (size_t)(p->kp - made) * sizeof(uint16_t));
  }
}

/* Where column `col` of row `row` goes (16 from a multiple of 16 lie within one output). */
static inline float* place(const Problem* p, int64_t row, int64_t col) {
  const int64_t part = col / p->width;
  return p->y[part] + row * p->width + (col - part * p->width);
}

/* A finished 32 x 32 block of sums whose epilogue is still to run: its row-halves (16 columns of one row) are
 * emitted a few at a time between the next block's tile steps (`emit_until`), as hotrod's int8 kernel does: the
 * tiles multiply on their own unit, and an epilogue (a GELU's above all) spread among their steps runs beside
 * them rather than after them. */
typedef struct {
  const float* sums;
  int64_t row, col;
  int halves, next, total; /* row-halves: per row, done, in all */
} Pending;

static inline void pending(const Problem* p, Pending* e, const float* sums, int64_t row, int64_t col) {
  const int64_t rows = p->rows - row < BLOCK_ROWS ? p->rows - row : BLOCK_ROWS;
  e->sums = sums, e->row = row, e->col = col, e->halves = col + 16 < p->n ? 2 : 1, e->next = 0;
  e->total = (int)rows * e->halves;
}

/* 16 columns' sums of Y's row `row` from column `c` (a multiple of 16): biased, through the GELU where asked, plus
 * the residual where given, into Y. */
static inline void emit(const Problem* p, __m512 sum, int64_t row, int64_t c) {
  const __mmask16 mask = hotrod_first(p->n - c);
  __m512 v = _mm512_add_ps(sum, _mm512_loadu_ps(p->bias + c));
  if (p->activation == HOTROD_I8_GELU) v = hotrod_gelu(v);
  if (p->residual != NULL) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(mask, p->residual + row * p->n + c));
  if (p->rounded != NULL) /* as round_rows rounds: the next product's rows */
    _mm256_mask_storeu_epi16(p->rounded + row * p->n + c, mask, (__m256i)_mm512_cvtneps_pbh(v));
  else
    _mm512_mask_storeu_ps(place(p, row, c), mask, v);
}

/* The pending block's row-halves before `until`, into Y. */
static inline void emit_until(const Problem* p, Pending* e, int until) {
  for (; e->next < until; e->next++) {
    const int64_t r = e->next / e->halves, half = e->next % e->halves;
    emit(p, _mm512_load_ps(e->sums + r * 32 + half * 16), e->row + r, e->col + half * 16);
  }
}

/* sums[r][0..32) = rows r < count of `a` (bf16, a row stride on) times a column block's weights `w` over `steps` steps
 * of 32 depths, on AVX-512 BF16, for a CPU without tiles: each row's pair of bf16 at a depth broadcast against a
 * tile row of weights (16 columns x 2 depths, the layout VDPBF16PS reads), in the same order for a row however many
 * go with it. Made one function per count (dots.h). */
static inline __attribute__((always_inline)) void dot_rows(const uint16_t* a, int64_t stride, const uint16_t* w,
                                                          int64_t steps, const int count, float* sums) {
  __m512 acc[VECTOR_ROWS][2];
  for (int r = 0; r < count; r++) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
  for (int64_t step = 0; step < steps; step++, a += 32, w += STEP_HALVES) {
#pragma GCC unroll 16 /* constant offsets: the core's ports go to the products, not to addresses */
    for (int pair = 0; pair < 16; pair++) {
      const __m512bh left = (__m512bh)_mm512_loadu_si512(w + pair * 32);
      const __m512bh right = (__m512bh)_mm512_loadu_si512(w + TILE_HALVES + pair * 32);
      for (int r = 0; r < count; r++) {
        int32_t both;
        memcpy(&both, a + r * stride + pair * 2, 4);
        const __m512bh x = (__m512bh)_mm512_set1_epi32(both);
        acc[r][0] = _mm512_dpbf16_ps(acc[r][0], x, left);
        acc[r][1] = _mm512_dpbf16_ps(acc[r][1], x, right);
      }
    }
  }
  for (int r = 0; r < count; r++)
    for (int h = 0; h < 2; h++) _mm512_store_ps(sums + r * 32 + h * 16, acc[r][h]);
}

HOTROD_DOTS(dot_rows, uint16_t, uint16_t, float)

/* Rows [first_row, last_row) by columns [first_col, last_col) on AVX-512 BF16, for a CPU without tiles: 8 rows at a
 * time (in the core's L1 cache) through each column block's weights (streaming from its L2), into Y. */
static void vectors(const Problem* p, int64_t first_row, int64_t last_row, int64_t first_col, int64_t last_col) {
  float sums[VECTOR_ROWS * 32] __attribute__((aligned(64)));
  for (int64_t row = first_row; row < last_row; row += VECTOR_ROWS) {
    const int64_t count = last_row - row < VECTOR_ROWS ? last_row - row : VECTOR_ROWS;
    for (int64_t col = first_col; col < last_col; col += 32) {
      DOTS[count - 1](p->a + row * p->kp, p->kp, p->w + (col / 32) * (p->kp / 32) * STEP_HALVES, p->kp / 32, sums);
      for (int half = 0; half < 2 && col + half * 16 < p->n; half++)
        for (int r = 0; r < count; r++) emit(p, _mm512_load_ps(sums + r * 32 + half * 16), row + r, col + half * 16);
    }
  }
}

/* The 32 x 32 block at (row, col) over depths [from, to): its sums in tiles 0-3, starting from zero or, for a later
 * chunk of the depth, from the sums so far (`partial`); with the pending block's epilogue spread over its steps
 * (done by the end), and the next column block's weights asked for into L2 a few lines a step (`ahead`, `lines` a
 * step). */
static void multiply(const Problem* p, int64_t row, int64_t col, int64_t from, int64_t to, const float* partial,
                     Pending* e, const char* ahead, int lines) {
  const uint16_t* a = p->tail != NULL && row + BLOCK_ROWS > p->rows ? p->tail : p->a + row * p->kp;
  const uint16_t* w = p->w + ((col / 32) * (p->kp / 32) + from / 32) * STEP_HALVES;
  const size_t stride = (size_t)p->kp * sizeof(uint16_t);
  const int per_step = (int)((e->total + (to - from) / 32 - 1) / ((to - from) / 32));
  int until = 0;
  if (partial == NULL)
    hotrod_tiles_zero();
  else
    hotrod_tiles_load(partial);
  for (int64_t depth = from; depth < to; depth += 32, w += STEP_HALVES) {
    for (int line = 0; line < lines; line++) _mm_prefetch(ahead + line * 64, _MM_HINT_T1);
    ahead += lines * 64;
    _tile_loadd(4, a + depth, stride);
    _tile_loadd(5, a + TILE_ROWS * p->kp + depth, stride);
    _tile_loadd(6, w, 64);
    _tile_loadd(7, w + TILE_HALVES, 64);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
    until += per_step;
    emit_until(p, e, until < e->total ? until : e->total);
  }
  emit_until(p, e, e->total);
}

/* Rows [first_row, last_row) by columns [first_col, last_col) as NaN (bf16 NaN where Y is rounded): memory that ran
 * out, which no caller takes for an answer. */
static void fail(const Problem* p, int64_t first_row, int64_t last_row, int64_t first_col, int64_t last_col) {
  for (int64_t r = first_row; r < last_row; r++)
    for (int64_t c = first_col; c < last_col && c < p->n; c++)
      if (p->rounded != NULL)
        p->rounded[r * p->n + c] = 0x7FC0;
      else
        *place(p, r, c) = __builtin_nanf("");
}

/* One unit: up to unit_rows rows by unit_cols columns, a chunk of the depth at a time (the whole, mostly), a block
 * of 32 columns at a time through every row block (its weights read from memory once, by the first, and kept in
 * the core's cache for the others). While a column block goes through its row blocks, the next one's weights are
 * asked for into L2, a share each row block, so the wait for memory is spread over the tile work (the hardware's
 * own prefetch stops at every 4 KB page). The sums of a chunk before the last wait in a buffer of the unit's. */
static void unit(void* data, size_t index) {
  const Problem* p = data;
  const int64_t first_row = (int64_t)index / p->col_units * p->unit_rows;
  const int64_t first_col = (int64_t)index % p->col_units * p->unit_cols;
  const int64_t last_row = first_row + p->unit_rows < p->rows ? first_row + p->unit_rows : p->rows;
  const int64_t last_col = first_col + p->unit_cols < p->padded_n ? first_col + p->unit_cols : p->padded_n;
  if (!p->tiles) { /* without tiles */
    vectors(p, first_row, last_row, first_col, last_col);
    return;
  }
  const int64_t blocks = (last_row - first_row + BLOCK_ROWS - 1) / BLOCK_ROWS;
  float* partials = NULL;
  if (p->chunk < p->kp &&
      (partials = aligned_alloc(64, (size_t)(blocks * (last_col - first_col) * BLOCK_ROWS) * sizeof(float))) == NULL) {
    fail(p, first_row, last_row, first_col, last_col);
    return;
  }
  float sums[BLOCK_ROWS * 32] __attribute__((aligned(64))); /* read by the next multiply before it is stored */
  Pending e = {.total = 0};
  hotrod_configure_tiles(); /* per call: the thread may be any of the pool's */
  for (int64_t from = 0; from < p->kp; from += p->chunk) {
    const int64_t to = from + p->chunk < p->kp ? from + p->chunk : p->kp, steps = (to - from) / 32;
    const int64_t share = (steps * STEP_HALVES * 2 / 64 + blocks - 1) / blocks; /* lines of the next, per row block */
    const int per_step = (int)((share + steps - 1) / steps);
    for (int64_t col = first_col; col < last_col; col += 32) {
      const char* next = (const char*)(p->w + ((col / 32 + 1) * (p->kp / 32) + from / 32) * STEP_HALVES);
      for (int64_t b = 0; b < blocks; b++) {
        const int64_t row = first_row + b * BLOCK_ROWS;
        float* partial = partials == NULL ? NULL : partials + ((col - first_col) / 32 * blocks + b) * BLOCK_ROWS * 32;
        /* none past the unit's columns (the last share may run a few lines past the next block: no harm) */
        multiply(p, row, col, from, to, from == 0 ? NULL : partial, &e, next + b * share * 64,
                 col + 32 < last_col ? per_step : 0);
        if (to < p->kp) {
          hotrod_tiles_store(partial);
        } else {
          hotrod_tiles_store(sums);
          pending(p, &e, sums, row, col);
        }
      }
    }
  }
  emit_until(p, &e, e.total);
  _tile_release();
  free(partials);
}

int hotrod_bf16_matmul(const float* a, const uint16_t* rounded, int64_t rows, int64_t k, const uint16_t* w,
                       const float* bias, int64_t n, float* const* y, uint16_t* y_rounded, int64_t parts,
                       int activation, const float* residual, int tiles, hotrod_parallel parallel, void* runner) {
  tiles = tiles && hotrod_amx_ready(); /* the call's path, set once */
  if (!(tiles || hotrod_bf16_vectors_ready()) || k <= 0 || n <= 0 || rows < 0 || parts < 1 ||
      n % parts != 0 || (parts > 1 && n / parts % 16 != 0) || (residual != NULL && parts > 1) ||
      activation < HOTROD_I8_LINEAR || activation > HOTROD_I8_GELU || (rounded != NULL && k % HOTROD_BF16_DEPTH != 0) ||
      (y_rounded != NULL && (parts > 1 || n % HOTROD_BF16_DEPTH != 0)))
    return -1;
  if (rows == 0) return 0;
  const int64_t padded_k = (k + HOTROD_BF16_DEPTH - 1) / HOTROD_BF16_DEPTH * HOTROD_BF16_DEPTH;
  const int64_t padded_n = (n + HOTROD_BF16_COLS - 1) / HOTROD_BF16_COLS * HOTROD_BF16_COLS;
  Problem p = {a, rounded, NULL, w, bias, y, y_rounded, residual, rows, k, padded_k, n, padded_n, n / parts, UNIT_ROWS,
               padded_n, 0, padded_k, activation, tiles};
  const int64_t blocks = (rows + BLOCK_ROWS - 1) / BLOCK_ROWS;
  uint16_t* made = NULL; /* the rows rounded here, or the given rows' last block padded */
  if (rounded == NULL) {
    if ((made = aligned_alloc(64, (size_t)(blocks * BLOCK_ROWS * p.kp) * sizeof(uint16_t))) == NULL) return -1;
    p.a = made;
    parallel(runner, round_rows, &p, (size_t)blocks);
  } else if (tiles && rows % BLOCK_ROWS != 0) { /* tiles read 32 whole rows: the last block's copy, padded */
    const int64_t have = rows % BLOCK_ROWS;
    if ((made = calloc((size_t)(BLOCK_ROWS * p.kp), sizeof(uint16_t))) == NULL) return -1;
    memcpy(made, rounded + (rows - have) * p.kp, (size_t)(have * p.kp) * sizeof(uint16_t));
    p.tail = made;
  }
  /* a unit's rows go through the tiles once per column block: as many as stay in the core's cache, and at least
   * CHUNK_ROWS, a chunk of their depth at a time where the whole would not fit (both set by the depth alone, so
   * that a row's sums are made the same way in any batch) */
  const int64_t chunk = UNIT_ROW_BYTES / (CHUNK_ROWS * (int64_t)sizeof(uint16_t)); /* a multiple of the depth step */
  p.chunk = p.kp > chunk ? chunk : p.kp;
  p.unit_rows = UNIT_ROW_BYTES / (p.chunk * (int64_t)sizeof(uint16_t)) / BLOCK_ROWS * BLOCK_ROWS;
  p.unit_rows = p.unit_rows < BLOCK_ROWS ? BLOCK_ROWS : p.unit_rows > UNIT_ROWS ? UNIT_ROWS : p.unit_rows;
  const int64_t row_units = (rows + p.unit_rows - 1) / p.unit_rows;
  /* a unit's weights go through the core once, a column block at a time: units as wide as the product, narrowed
   * only until there are enough to share among threads */
  while (p.unit_cols > HOTROD_BF16_COLS && row_units * ((p.padded_n + p.unit_cols - 1) / p.unit_cols) < 8)
    p.unit_cols = (p.unit_cols / HOTROD_BF16_COLS + 1) / 2 * HOTROD_BF16_COLS; /* whole column blocks */
  if (p.chunk < p.kp) { /* and no wider than keeps the partial sums in L2 beside the rows */
    const int64_t widest = PARTIAL_BYTES / (p.unit_rows * (int64_t)sizeof(float)) / HOTROD_BF16_COLS * HOTROD_BF16_COLS;
    p.unit_cols = p.unit_cols > widest && widest >= HOTROD_BF16_COLS ? widest : p.unit_cols;
  }
  p.col_units = (p.padded_n + p.unit_cols - 1) / p.unit_cols;
  parallel(runner, unit, &p, (size_t)(row_units * p.col_units));
  free(made);
  return 0;
}
