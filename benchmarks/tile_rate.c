/* The AMX tile unit's own int8 rate on one core: the floor the int8 products are measured against, where the
 * bench's "measured int8 rate" (`hotrod.bench.floor`) is the rate of hotrod's own product kernel at 2048^3.
 *
 * Two loops of the 2 x 2 step the product kernel runs (four TDPBUSD of 16 x 16 x 64 into four tiles of sums):
 * "registers", its operand tiles loaded once (the unit alone), and "L1", each step loading its four operand
 * tiles from 32 KB of rows and 32 KB of weights cycled through (the kernel's loads, from the core's L1 and L2).
 * Run one process per core at once to see whether the cores' units are their own (vCPUs that share a core
 * would halve each other's rate). Build and run (a CPU with AMX-INT8, Linux 5.16 or later):
 *     cc -O2 -mamx-tile -mamx-int8 -o /tmp/tile_rate benchmarks/tile_rate.c && /tmp/tile_rate
 */
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18
#define STEPS 20000000L
#define MACS_PER_STEP (4.0 * 16 * 16 * 64)

typedef struct {
  uint8_t palette, start_row, reserved[14];
  uint16_t bytes_per_row[16];
  uint8_t rows[16];
} TileConfig;

static uint8_t rows[32 * 1024] __attribute__((aligned(64)));
static int8_t weights[32 * 1024] __attribute__((aligned(64)));

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void step(void) {
  _tile_dpbusd(0, 4, 6);
  _tile_dpbusd(1, 4, 7);
  _tile_dpbusd(2, 5, 6);
  _tile_dpbusd(3, 5, 7);
}

/* Seconds for STEPS steps; `load`: each step loads its four operand tiles, cycling through 16 x 2 KB of each. */
static double timed(int load) {
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  _tile_loadd(4, rows, 64);
  _tile_loadd(5, rows + 1024, 64);
  _tile_loadd(6, weights, 64);
  _tile_loadd(7, weights + 1024, 64);
  const double start = now();
  for (long i = 0; i < STEPS; i++) {
    if (load) {
      const long at = (i & 15) * 2048;
      _tile_loadd(4, rows + at, 64);
      _tile_loadd(5, rows + at + 1024, 64);
      _tile_loadd(6, weights + at, 64);
      _tile_loadd(7, weights + at + 1024, 64);
    }
    step();
  }
  const double seconds = now() - start;
  int32_t sums[256];
  _tile_stored(0, sums, 64); /* the sums are read: the loop is not dead code */
  return sums[0] == 42 ? seconds + 1e-12 : seconds;
}

int main(void) {
  if (syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) != 0) {
    fprintf(stderr, "tile_rate: Linux does not grant this process AMX's tile state\n");
    return 1;
  }
  static const TileConfig config = {.palette = 1, .bytes_per_row = {64, 64, 64, 64, 64, 64, 64, 64},
                                    .rows = {16, 16, 16, 16, 16, 16, 16, 16}};
  _tile_loadconfig(&config);
  for (int round = 0; round < 3; round++)
    printf("round %d: registers %.0f G int8 multiply-adds/s, L1 %.0f G\n", round,
           STEPS * MACS_PER_STEP / timed(0) / 1e9, STEPS * MACS_PER_STEP / timed(1) / 1e9);
  _tile_release();
  return 0;
}
