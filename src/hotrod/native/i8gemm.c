/* Int8 products on AMX tiles, the kernel behind hotrod's Int8MatMul op.
 *
 * hotrod's dynamic int8 graphs quantize each product's input per row (uint8, zero point 128: QuantizeRows)
 * and multiply it by int8 weights quantized per column. onnxruntime's kernel for that (MatMulIntegerToFloat)
 * runs on AVX-512 VNNI at best; on a CPU with AMX, one core's tiles multiply int8 several times faster. Here
 * the weights are packed once, as the graph is loaded, into the tiles' layout: for each 32 columns and each
 * 64 of depth, two 16 x 64-byte tiles, a row of which holds 4 consecutive depths of 16 columns. A step of
 * the inner loop loads two tiles of rows (32 rows x 64 depths) and two of weights, and accumulates 32 x 32
 * int32 sums with four TDPBUSD (uint8 times int8, exact in int32).
 *
 * The uint8 rows carry the zero point 128: sum(q * w) - 128 * sum(w) is the sum over the signed values, with
 * 128 * sum(w) per column computed at packing (`offsets`). The epilogue scales the exact sum as onnxruntime's
 * kernel does for a scale per row (by the column's scale, then the row's), adds the bias, and writes only the
 * rows and columns that exist (built with -ffp-contract=off: a multiply and an add fused into one rounding
 * would not be onnxruntime's answer). Rows are independent: a row's answer is the same alone and in any batch.
 *
 * The columns may go to several outputs of equal width, a multiple of 16 (a fused Q/K/V product's three), so
 * that no pass splits them afterwards.
 *
 * Work is split into blocks of rows by blocks of columns, run on the caller's threads (onnxruntime's pool,
 * through `parallel`): a block of weights stays in a core's cache while its rows go through.
 */
#include <immintrin.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "dots.h"
#include "gelu.h"
#include "gelu_static.h"
#include "i8gemm.h"
#include "lanes.h"
#include "quantize.h"
#include "rows.h"
#include "tiles.h"

#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18
#define TILE_ROWS 16
#define BLOCK_ROWS 32                       /* rows of one 2 x 2 step: two tiles of rows */
#define UNIT_ROWS 256                       /* rows of one unit of work */
#define TILE_BYTES (TILE_ROWS * 64)         /* one tile of weights: 16 rows of 64 bytes */
#define STEP_BYTES (2 * TILE_BYTES)         /* the two weight tiles of 32 columns at one depth step */
#define NARROW_ROWS HOTROD_DOT_ROWS /* fewer rows than a tile's 16 (all, without tiles) run on VNNI, 8 at a time */
#define FUSED_MIN_ROWS (8 * BLOCK_ROWS)      /* fewer rows: too few units of whole rows to share among threads */

typedef struct {
  uint8_t palette, start_row, reserved[14];
  uint16_t bytes_per_row[16];
  uint8_t rows[16];
} TileConfig;

int hotrod_kernels_version(void) { return HOTROD_KERNELS_VERSION; }

int hotrod_amx_ready(void) {
  static int state = -1; /* -1 unknown; asked once: the grant is the process's */
  if (state < 0) state = syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
  return state;
}

int hotrod_vnni_ready(void) {
  return hotrod_has_avx512() && __builtin_cpu_supports("avx512vnni");
}

/* Every tile 16 rows of 64 bytes (here 0-3: the 2 x 2 sums; 4, 5: rows; 6, 7: weights). The configuration is
 * static data: the compiler knows only that LDTILECFG reads its first byte, and would drop stores to a local
 * one as dead. */
void hotrod_configure_tiles(void) {
  static const TileConfig config = {
      .palette = 1,
      .bytes_per_row = {64, 64, 64, 64, 64, 64, 64, 64},
      .rows = {TILE_ROWS, TILE_ROWS, TILE_ROWS, TILE_ROWS, TILE_ROWS, TILE_ROWS, TILE_ROWS, TILE_ROWS},
  };
  _tile_loadconfig(&config);
}

typedef struct {
  const uint8_t* q;
  const float *a_scale, *w_scale, *bias;
  int64_t scale_stride; /* 1: a scale per row; 0: one for every row */
  const int8_t* w;
  const int32_t* offsets;
  float* const* y; /* the outputs, each `width` of the n columns */
  int64_t rows, k, n, padded_n, unit_cols, col_units, width;
  int activation; /* HOTROD_I8_GELU: GELU on each biased value */
  const float* residual; /* [rows, n], added last; or NULL */
  uint8_t* q_out; /* where given: Y quantized per row (rows.h) into q_out and scales_out, Y itself not kept */
  float* scales_out;
  int64_t unit_rows, y_row; /* rows of a unit of work; the row that y's first holds */
  uint8_t* q_static;        /* where given: Y quantized with one scale and zero point into it instead */
  float static_scale;
  int32_t static_zero;
  float gelu_margin;        /* gelu_static.h: the quotients' margin at static_scale, where the GELU is fused too */
  const uint8_t* padded;    /* where given: the last block of rows, zero-padded to 32, made by the caller */
  int tiles;                /* 1: on AMX's tiles; 0: on AVX-512 VNNI (a CPU without them, or the op's choice) */
} Problem;

/* Where column `col` of row `row` goes: its output, at its place there. */
static inline float* place(const Problem* p, int64_t row, int64_t col) {
  const int64_t part = col / p->width;
  return p->y[part] + (row - p->y_row) * p->width + (col - part * p->width);
}

/* Rows [row, row + 32) of q, or a zero-padded copy where fewer remain (tiles read 16 whole rows). */
static const uint8_t* block_rows(const Problem* p, int64_t row, uint8_t* spare) {
  if (row + BLOCK_ROWS <= p->rows) return p->q + row * p->k;
  const int64_t have = p->rows - row;
  memcpy(spare, p->q + row * p->k, (size_t)(have * p->k));
  memset(spare + have * p->k, 0, (size_t)((BLOCK_ROWS - have) * p->k));
  return spare;
}

/* A column block's constants: the zero point taken back, the scales, the bias, which columns exist. */
typedef struct { __m512i offset; __m512 scale, bias; __mmask16 mask; } Columns;

static inline Columns columns(const Problem* p, int64_t col) {
  Columns c = {_mm512_loadu_si512(p->offsets + col), _mm512_loadu_ps(p->w_scale + col), _mm512_loadu_ps(p->bias + col),
               hotrod_first(p->n - col)};
  return c;
}

/* Where 16 columns from `col` (a multiple of 16: within one output) of rows from `row` go, and the residual
 * they add; the next row's are a row stride on (`width` floats, `n` for the residual). Where Y is quantized
 * with one scale, `at` is the first value's index in q_static (one output), and `out` is not used. */
typedef struct { float* out; const float* residual; int64_t at; } Targets;

static inline Targets targets(const Problem* p, int64_t row, int64_t col) {
  Targets t = {p->q_static != NULL ? NULL : place(p, row, col),
               p->residual == NULL ? NULL : p->residual + row * p->n + col, (row - p->y_row) * p->width + col};
  return t;
}

/* 16 columns' sums of row `r` of `t`: scaled as onnxruntime scales them, biased, through the GELU where the
 * graph had one after the product (gelu.h: onnxruntime's arithmetic; gelu_static.h where only the byte quantized
 * with one scale must match it), plus the residual where the graph added
 * one (one rounding, as its Add), clipped; stored as floats, or quantized where Y is. */
static inline void emit(const Problem* p, const Columns* c, __m512i sum, float row_scale, const Targets* t, int64_t r) {
  __m512 v = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(sum, c->offset)), c->scale);
  v = _mm512_add_ps(_mm512_mul_ps(v, _mm512_set1_ps(row_scale)), c->bias);
  if (p->activation == HOTROD_I8_GELU && p->q_static != NULL && t->residual == NULL) { /* gelu_static.h */
    hotrod_gelu_quantize_static16(v, p->static_scale, p->static_zero, p->gelu_margin, c->mask,
                                  p->q_static + t->at + r * p->width);
    return;
  }
  if (p->activation == HOTROD_I8_GELU) v = hotrod_gelu(v);
  if (t->residual != NULL) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(c->mask, t->residual + r * p->n));
  if (p->q_static != NULL) /* quantize.h: as the graph's QuantizeLinear */
    hotrod_quantize_static16(v, p->static_scale, p->static_zero, c->mask, p->q_static + t->at + r * p->width);
  else
    _mm512_mask_storeu_ps(t->out + r * p->width, c->mask, v);
}

/* A finished 32 x 32 block of int32 sums whose epilogue is still to run: its row-halves (16 columns of one row)
 * are emitted a few at a time between the next block's tile steps (`emit_until`). The tiles multiply on their
 * own unit, but the core keeps only so many instructions in flight: an epilogue run whole after the next
 * block's products were issued waits behind them, one spread among them runs beside them. */
typedef struct {
  const int32_t* sums;
  int64_t row;
  int halves, next, total; /* row-halves: per row, done, in all */
  Columns c[2];
  Targets t[2];
} Pending;

static inline void pending(const Problem* p, Pending* e, const int32_t* sums, int64_t row, int64_t col) {
  const int64_t rows = p->rows - row < BLOCK_ROWS ? p->rows - row : BLOCK_ROWS;
  e->sums = sums, e->row = row, e->halves = col + 16 < p->n ? 2 : 1, e->next = 0, e->total = (int)rows * e->halves;
  for (int half = 0; half < e->halves; half++)
    e->c[half] = columns(p, col + half * 16), e->t[half] = targets(p, row, col + half * 16);
}

/* The pending block's row-halves before `until` as floats in y. */
static inline void emit_until(const Problem* p, Pending* e, int until) {
  for (; e->next < until; e->next++) {
    const int r = e->next / e->halves, half = e->next % e->halves;
    const Targets* t = &e->t[half];
    const float row_scale = p->a_scale[(e->row + r) * p->scale_stride];
    emit(p, &e->c[half], _mm512_loadu_si512(e->sums + r * 32 + half * 16), row_scale, t, r);
  }
}

/* sums[r][0..32) = rows r < count of `a` (a row stride on) times a column block's weights `w`, over `steps` steps
 * of 64 depths, on AVX-512 VNNI: each row's 4 bytes at a depth broadcast against a tile row of weights (16 columns
 * x 4 depths, the layout VPDPBUSD reads). Made one function per count (dots.h).
 *
 * Few rows (a decoding step's) read each weight once, straight from memory, and take the weights in the order
 * they lie: the left tile's 16 lines, then the right's. Read in pairs, a line of each tile in turn, two streams
 * 1 KB apart, a Zen 4 streams them at about half that rate (benchmarks/weight_order.c). Their sums are exact
 * integers: the order changes no answer. With one or two rows, each sum has two chains (even and odd depths), so
 * the products do not wait on each other. More rows reuse a weight line enough to be bound by the products: there
 * each row's 4 bytes are broadcast once for both tiles. */
#ifndef STREAM_ROWS /* benchmarks/narrow_rows.c builds the kernel with others */
#define STREAM_ROWS 4
#endif
static inline __attribute__((always_inline)) void dot_rows(const uint8_t* a, int64_t stride, const int8_t* w,
                                                          int64_t steps, const int count, int32_t* sums) {
  __m512i acc[NARROW_ROWS][2], odd[NARROW_ROWS][2];
  for (int r = 0; r < count; r++) acc[r][0] = acc[r][1] = odd[r][0] = odd[r][1] = _mm512_setzero_si512();
  for (int64_t step = 0; step < steps; step++, a += 64, w += STEP_BYTES) {
    if (count <= STREAM_ROWS) {
      for (int h = 0; h < 2; h++) {
#pragma GCC unroll 16 /* constant offsets: the core's ports go to the products, not to addresses */
        for (int quad = 0; quad < 16; quad++) {
          const __m512i weights = _mm512_loadu_si512(w + h * TILE_BYTES + quad * 64);
          for (int r = 0; r < count; r++) {
            int32_t bytes;
            memcpy(&bytes, a + r * stride + quad * 4, 4);
            __m512i* sum = count <= 2 && quad % 2 ? &odd[r][h] : &acc[r][h];
            *sum = _mm512_dpbusd_epi32(*sum, _mm512_set1_epi32(bytes), weights);
          }
        }
      }
      continue;
    }
#pragma GCC unroll 16
    for (int quad = 0; quad < 16; quad++) {
      const __m512i left = _mm512_loadu_si512(w + quad * 64), right = _mm512_loadu_si512(w + TILE_BYTES + quad * 64);
      _mm_prefetch((const char*)w + STEP_BYTES + quad * 64, _MM_HINT_T0);
      _mm_prefetch((const char*)w + STEP_BYTES + TILE_BYTES + quad * 64, _MM_HINT_T0);
      for (int r = 0; r < count; r++) {
        int32_t bytes;
        memcpy(&bytes, a + r * stride + quad * 4, 4);
        const __m512i x = _mm512_set1_epi32(bytes);
        acc[r][0] = _mm512_dpbusd_epi32(acc[r][0], x, left);
        acc[r][1] = _mm512_dpbusd_epi32(acc[r][1], x, right);
      }
    }
  }
  for (int r = 0; r < count; r++)
    for (int h = 0; h < 2; h++) _mm512_store_si512(sums + r * 32 + h * 16, _mm512_add_epi32(acc[r][h], odd[r][h]));
}

HOTROD_DOTS(dot_rows, uint8_t, int8_t, int32_t)

/* Up to 8 rows by 32 columns on AVX-512 VNNI, through the epilogue into Y. For a decoding step's rows the weights
 * stream through once, where the tiles would multiply 16 rows to use one; on a CPU without tiles every product
 * runs here (compute). */
static void narrow(const Problem* p, int64_t row, int64_t count, int64_t col) {
  int32_t sums[NARROW_ROWS * 32] __attribute__((aligned(64)));
  DOTS[count - 1](p->q + row * p->k, p->k, p->w + (col / 32) * (p->k / 64) * STEP_BYTES, p->k / 64, sums);
  for (int half = 0; half < 2 && col + half * 16 < p->n; half++) {
    const Columns c = columns(p, col + half * 16);
    const Targets t = targets(p, row, col + half * 16);
    for (int r = 0; r < count; r++)
      emit(p, &c, _mm512_load_si512(sums + r * 32 + half * 16), p->a_scale[(row + r) * p->scale_stride], &t, r);
  }
}

/* Where the graph adds a residual after the product: the lines the epilogue of rows [row, row + count) by the 32
 * columns from `col` will touch, asked for before their sums are made, the residual's to be read and the float
 * outputs' to be written (PREFETCHW: the line comes owned, so the store does not wait for it). An encoder's
 * residual and output lie past L2 (4.7 MB each at W7's 3072 x 384), a row's lines a row's width from the next
 * row's; met only by the epilogue, each was waited for there, after the sums. Asked for here, the sums' loop hides
 * the wait: on a Zen 5, W7's attention output product (3072 x 384 x 384) on one thread 0.46-0.76 T int8
 * operations a second before, 0.79 T after; W6's second feed-forward product (3072 x 4096 x 1024) on two 1.56-1.61
 * T before, 1.74-1.77 T after. Products without a residual ask for nothing: their float outputs alone lost 3-9%
 * with it at W7's Q/K/V shape (3072 x 384 x 1152) and gained at most 4% elsewhere. Always inlined: as a function
 * of its own, gcc finds it pure (a prefetch changes no state it tracks) and drops the call. */
static inline __attribute__((always_inline)) void ask_epilogue(const Problem* p, int64_t row, int64_t count,
                                                              int64_t col) {
  if (p->residual == NULL) return;
  for (int64_t at = col; at < col + 32 && at < p->n; at += 16) {
    const float* residual = p->residual + row * p->n + at;
    float* out = p->q_static == NULL ? place(p, row, at) : NULL; /* one division a line, not one a row */
    for (int64_t r = 0; r < count; r++) {
      _mm_prefetch((const char*)(residual + r * p->n), _MM_HINT_T0);
      if (out != NULL) _m_prefetchw(out + r * p->width);
    }
  }
}

/* Without tiles: the unit's columns a panel at a time, a panel's weights (PANEL_BYTES, at least one block of 32
 * columns) in L2 while every group of rows goes through all of its column blocks, the group's rows in L1; the next
 * panel's weights asked for into L2, a share each group: a model's weights come from memory (a layer's do not stay
 * in a last-level cache through the others), and a wait for them met by the first group alone would cost this
 * path about a sixth of a product at a time (29% on a 3072-column product beside its GELU, 9% on the others, on
 * a Zen 4: weights read warm against a model's worth of them in rotation). Each row's outputs are written a
 * panel's width at a time, in the order they lie. A block of 32 columns at a time through every row wrote 128
 * bytes of each row in turn, rows 4 KB apart where Y has 1024 float columns: on a Zen 5, one thread, a 3072-row
 * product of depth 1024 (its output past the cache) ran at 0.68 T int8 operations a second against 0.83 T in
 * panels (0.57 T against 0.76 T with a residual; 1.13 T against 1.37 T on two threads). */
#define PANEL_BYTES (256 * 1024)
static void vectors(const Problem* p, int64_t first_row, int64_t last_row, int64_t first_col, int64_t last_col) {
  const int64_t steps = p->k / 64, groups = (last_row - first_row + NARROW_ROWS - 1) / NARROW_ROWS;
  const int64_t block_bytes = steps * STEP_BYTES; /* one block of 32 columns' weights */
  const int64_t panel = (PANEL_BYTES / block_bytes > 1 ? PANEL_BYTES / block_bytes : 1) * 32;
  for (int64_t start = first_col; start < last_col; start += panel) {
    const int64_t end = start + panel < last_col ? start + panel : last_col;
    const char* next = (const char*)(p->w + (end / 32) * block_bytes);
    const int64_t next_end = end + panel < last_col ? end + panel : last_col;
    const int64_t share = ((next_end - end) / 32 * block_bytes / 64 + groups - 1) / groups; /* lines a group */
    for (int64_t g = 0; g < groups; g++) {
      const int64_t row = first_row + g * NARROW_ROWS;
      const int64_t count = last_row - row < NARROW_ROWS ? last_row - row : NARROW_ROWS;
      for (int64_t line = 0; line < share; line++) _mm_prefetch(next + (g * share + line) * 64, _MM_HINT_T1);
      for (int64_t col = start; col < end; col += 32) {
        ask_epilogue(p, row, count, col);
        narrow(p, row, count, col);
      }
    }
  }
}

/* Cache lines of weights that a block's steps ask for ahead of use (Ahead): `lines` a step from `next`. */
typedef struct { const char* next; int lines; } Ahead;

/* The k loop of one 32 x 32 block, its sums left in tiles 0-3, with the pending block's epilogue spread over
 * its steps (done by the end), and the weights in `ahead` asked for into L2 a few lines a step. */
static void multiply(const Problem* p, const uint8_t* a, int64_t col, Pending* e, Ahead ahead) {
  const int8_t* w = p->w + (col / 32) * (p->k / 64) * STEP_BYTES;
  const size_t stride = (size_t)p->k;
  const int per_step = (int)((e->total + p->k / 64 - 1) / (p->k / 64));
  int until = 0;
  hotrod_tiles_zero();
  for (int64_t depth = 0; depth < p->k; depth += 64, w += STEP_BYTES) {
    for (int line = 0; line < ahead.lines; line++) _mm_prefetch(ahead.next + line * 64, _MM_HINT_T1);
    ahead.next += ahead.lines * 64;
    _tile_loadd(4, a + depth, stride);
    _tile_loadd(5, a + 16 * stride + depth, stride);
    _tile_loadd(6, w, 64);
    _tile_loadd(7, w + TILE_BYTES, 64);
    _tile_dpbusd(0, 4, 6);
    _tile_dpbusd(1, 4, 7);
    _tile_dpbusd(2, 5, 6);
    _tile_dpbusd(3, 5, 7);
    until += per_step;
    emit_until(p, e, until < e->total ? until : e->total);
  }
  emit_until(p, e, e->total);
}

/* Rows [first_row, last_row) by columns [first_col, last_col) of Y, a block of 32 columns at a time through
 * every row block: its weights are read from memory once, by the first row block, and stay in the core's
 * cache for the others. Each block's epilogue runs among the next block's tile steps (Pending), the last
 * one's after them. While a column block goes through its row blocks, the next one's weights are asked for
 * into L2, a share each row block: the wait for memory, which the first row block would otherwise meet
 * alone, is spread over the tile work of all of them (the hardware's own prefetch stops at every 4 KB page).
 * Only a unit's first column block meets it: units are wide (`unit_cols`). */
static void compute(const Problem* p, int64_t first_row, int64_t last_row, int64_t first_col, int64_t last_col) {
  if (p->rows < TILE_ROWS) { /* a decoding step's rows: the weights stream from memory once */
    for (int64_t col = first_col; col < last_col; col += 32)
      for (int64_t row = first_row; row < last_row; row += NARROW_ROWS)
        narrow(p, row, last_row - row < NARROW_ROWS ? last_row - row : NARROW_ROWS, col);
    return;
  }
  if (!p->tiles) {
    vectors(p, first_row, last_row, first_col, last_col);
    return;
  }
  const int64_t blocks = (last_row - first_row + BLOCK_ROWS - 1) / BLOCK_ROWS;
  const int64_t tail = first_row + (blocks - 1) * BLOCK_ROWS; /* the last row block: padded where short */
  uint8_t* spare = NULL;
  if (tail + BLOCK_ROWS > p->rows && p->padded == NULL && (spare = malloc((size_t)(BLOCK_ROWS * p->k))) == NULL) {
    for (int64_t r = first_row; r < last_row; r++) /* memory ran out: NaN, which no caller takes for an answer */
      for (int64_t c = first_col; c < last_col && c < p->n; c++) *place(p, r, c) = __builtin_nanf("");
    return;
  }
  const uint8_t* last = tail + BLOCK_ROWS > p->rows && p->padded != NULL ? p->padded : block_rows(p, tail, spare);
  const int64_t steps = p->k / 64, lines = steps * (STEP_BYTES / 64); /* a column block's weights */
  const int64_t share = (lines + blocks - 1) / blocks;                  /* of the next's, per row block */
  const int per_step = (int)((share + steps - 1) / steps);
  int32_t sums[BLOCK_ROWS * 32] __attribute__((aligned(64))); /* read by the next multiply before it is stored */
  Pending e = {.total = 0};
  hotrod_configure_tiles(); /* per call: the thread may be any of the pool's */
  for (int64_t col = first_col; col < last_col; col += 32) {
    const char* next = (const char*)(p->w + (col / 32 + 1) * steps * STEP_BYTES);
    for (int64_t b = 0; b < blocks; b++) {
      const int64_t row = first_row + b * BLOCK_ROWS;
      /* none past the unit's columns (the last share may run a few lines past the next block: no harm) */
      const Ahead ahead = {next + b * share * 64, col + 32 < last_col ? per_step : 0};
      multiply(p, row == tail ? last : p->q + row * p->k, col, &e, ahead);
      hotrod_tiles_store(sums);
      pending(p, &e, sums, row, col);
    }
  }
  emit_until(p, &e, e.total);
  free(spare);
  _tile_release();
}

/* One unit: up to unit_rows rows by unit_cols columns. Where Y is quantized per row, a unit is whole rows: Y's
 * rows are made in a buffer of the unit's own, which stays in the core's cache, and quantized from there. */
static void unit(void* data, size_t index) {
  const Problem* p = data;
  const int64_t first_row = (int64_t)index / p->col_units * p->unit_rows;
  const int64_t first_col = (int64_t)index % p->col_units * p->unit_cols;
  const int64_t last_row = first_row + p->unit_rows < p->rows ? first_row + p->unit_rows : p->rows;
  const int64_t last_col = first_col + p->unit_cols < p->padded_n ? first_col + p->unit_cols : p->padded_n;
  if (p->q_out == NULL) {
    compute(p, first_row, last_row, first_col, last_col);
    return;
  }
  float* rows = malloc((size_t)((last_row - first_row) * p->n) * sizeof(float));
  Problem own = *p;
  own.y = &rows, own.y_row = first_row;
  if (rows != NULL) compute(&own, first_row, last_row, first_col, last_col);
  if (rows == NULL) /* memory ran out: NaN scales, which no caller takes for an answer */
    for (int64_t r = first_row; r < last_row; r++) p->scales_out[r] = __builtin_nanf("");
  else
    hotrod_quantize_rows(rows, last_row - first_row, p->n, p->q_out + first_row * p->n, p->scales_out + first_row);
  free(rows);
}

/* Y's rows quantized BLOCK_ROWS at a time, where Y is made whole first (hotrod_i8_matmul_rows's `made`). */
static void quantize_part(void* data, size_t index) {
  const Problem* p = data;
  const int64_t first = (int64_t)index * BLOCK_ROWS;
  const int64_t count = p->rows - first < BLOCK_ROWS ? p->rows - first : BLOCK_ROWS;
  hotrod_quantize_rows(p->y[0] + first * p->n, count, p->n, p->q_out + first * p->n, p->scales_out + first);
}

int hotrod_gelu_values(const float* x, int64_t n, float* y) {
  if (!hotrod_has_avx512()) return -1;
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = hotrod_first(n - i);
    _mm512_mask_storeu_ps(y + i, m, hotrod_gelu(_mm512_maskz_loadu_ps(m, x + i)));
  }
  return 0;
}

int64_t hotrod_gelu_static_values(const float* x, int64_t n, float scale, int32_t zero_point, uint8_t* q) {
  if (!hotrod_has_avx512() || zero_point < 0 || zero_point > 255) return -1;
  const float margin = hotrod_gelu_margin(scale);
  int64_t again = 0;
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = hotrod_first(n - i);
    again += hotrod_gelu_quantize_static16(_mm512_maskz_loadu_ps(m, x + i), scale, zero_point, margin, m, q + i);
  }
  return again;
}

int hotrod_gelu_near_values(const float* x, int64_t n, float* y) {
  if (!hotrod_has_avx512()) return -1;
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = hotrod_first(n - i);
    _mm512_mask_storeu_ps(y + i, m, hotrod_gelu_near(_mm512_maskz_loadu_ps(m, x + i)));
  }
  return 0;
}

/* The path a call takes: the tiles where asked for and granted, else AVX-512 VNNI (-1 where neither runs here). */
static int path(int tiles) { return tiles && hotrod_amx_ready() ? 1 : hotrod_vnni_ready() ? 0 : -1; }

/* Whether a product of depth k with this activation can be computed, on a path that runs here. */
static int computable(int64_t k, int activation, int tiles) {
  return path(tiles) >= 0 && k > 0 && k % HOTROD_I8_DEPTH == 0 && activation >= HOTROD_I8_LINEAR &&
         activation <= HOTROD_I8_GELU;
}

/* Whether `units` units are too few to share among threads: fewer than 8, or an odd count under 16, which does not
 * share evenly (bert-base's Q/K/V product at 128 rows: 9 units of 256 columns, 5 on one of two threads against 4
 * on the other; 18 of 128 columns ran 7% faster on a Zen 5, weights from memory or from the cache). */
static int too_few(int64_t units) { return units < 8 || (units < 16 && units % 2 == 1); }

/* Units of up to UNIT_ROWS rows by unit_cols columns for `p`: how many. The rows are split evenly, in whole row
 * blocks (384 rows: two units of 192, not 256 and 128, whose units would cost twice the others'). Wide units wait
 * on memory for fewer first column blocks (compute); narrow ones share a small product among threads. */
static size_t plan(Problem* p) {
  p->padded_n = (p->n + HOTROD_I8_COLS - 1) / HOTROD_I8_COLS * HOTROD_I8_COLS;
  const int64_t row_units = (p->rows + UNIT_ROWS - 1) / UNIT_ROWS;
  p->unit_rows = ((p->rows + row_units - 1) / row_units + BLOCK_ROWS - 1) / BLOCK_ROWS * BLOCK_ROWS;
  p->unit_cols = 256;
  while (p->unit_cols > HOTROD_I8_COLS && too_few(row_units * ((p->padded_n + p->unit_cols - 1) / p->unit_cols)))
    p->unit_cols /= 2;
  p->col_units = (p->padded_n + p->unit_cols - 1) / p->unit_cols;
  return (size_t)(row_units * p->col_units);
}

int hotrod_i8_matmul(const uint8_t* q, const float* a_scale, int64_t scale_stride, int64_t rows, int64_t k,
                     const int8_t* w, const int32_t* offsets, const float* w_scale, const float* bias, int64_t n,
                     float* const* y, int64_t parts, int activation, const float* residual, int tiles,
                     hotrod_parallel parallel, void* runner) {
  if (!computable(k, activation, tiles) || parts < 1 || n % parts != 0 || (parts > 1 && n / parts % 16 != 0) ||
      (residual != NULL && parts > 1))
    return -1;
  Problem p = {q, a_scale, w_scale, bias, scale_stride, w, offsets, y, rows, k, n, 0, 0, 0, n / parts, activation,
               residual, NULL, NULL, UNIT_ROWS, 0, NULL, 0.0f, 0, 0.0f, NULL, path(tiles)};
  parallel(runner, unit, &p, plan(&p));
  return 0;
}

int hotrod_i8_matmul_static(const uint8_t* q, const float* a_scale, int64_t scale_stride, int64_t rows, int64_t k,
                            const int8_t* w, const int32_t* offsets, const float* w_scale, const float* bias,
                            int64_t n, int activation, float scale, int32_t zero_point, uint8_t* out, int tiles,
                            hotrod_parallel parallel, void* runner) {
  if (!computable(k, activation, tiles) || zero_point < 0 || zero_point > 255) return -1;
  Problem p = {q, a_scale, w_scale, bias, scale_stride, w, offsets, NULL, rows, k, n, 0, 0, 0, n, activation,
               NULL, NULL, NULL, UNIT_ROWS, 0, out, scale, zero_point, hotrod_gelu_margin(scale), NULL,
               path(tiles)};
  /* the last rows' padded block made here, once: no unit can then run out of memory with its outputs half made */
  uint8_t* padded = NULL;
  if (p.tiles && rows >= TILE_ROWS && rows % BLOCK_ROWS != 0) {
    if ((padded = malloc((size_t)(BLOCK_ROWS * k))) == NULL) return -1;
    p.padded = block_rows(&p, rows / BLOCK_ROWS * BLOCK_ROWS, padded);
  }
  parallel(runner, unit, &p, plan(&p));
  free(padded);
  return 0;
}

int hotrod_i8_matmul_rows(const uint8_t* q, const float* a_scale, int64_t scale_stride, int64_t rows, int64_t k,
                          const int8_t* w, const int32_t* offsets, const float* w_scale, const float* bias, int64_t n,
                          int activation, uint8_t* q_out, float* scales_out, int tiles, hotrod_parallel parallel,
                          void* runner) {
  if (rows < FUSED_MIN_ROWS) { /* too few units of whole rows for the threads: Y made whole, then quantized */
    float* made = malloc((size_t)(rows * n) * sizeof(float));
    if (made == NULL) return -1;
    const int status = hotrod_i8_matmul(q, a_scale, scale_stride, rows, k, w, offsets, w_scale, bias, n, &made, 1,
                                        activation, NULL, tiles, parallel, runner);
    Problem p = {.y = &made, .rows = rows, .n = n, .q_out = q_out, .scales_out = scales_out};
    if (status == 0) parallel(runner, quantize_part, &p, (size_t)((rows + BLOCK_ROWS - 1) / BLOCK_ROWS));
    free(made);
    return status;
  }
  if (!computable(k, activation, tiles)) return -1;
  Problem p = {q, a_scale, w_scale, bias, scale_stride, w, offsets, NULL, rows, k, n, 0, 0, 1, n, activation, NULL,
               q_out, scales_out, BLOCK_ROWS, 0, NULL, 0.0f, 0, 0.0f, NULL, path(tiles)};
  p.padded_n = p.unit_cols = (n + HOTROD_I8_COLS - 1) / HOTROD_I8_COLS * HOTROD_I8_COLS;
  parallel(runner, unit, &p, (size_t)((rows + BLOCK_ROWS - 1) / BLOCK_ROWS));
  return 0;
}
