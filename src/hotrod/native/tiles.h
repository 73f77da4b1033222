/* The 2 x 2 block of sums both AMX product kernels keep in tiles 0-3 (i8gemm.c: int32, bf16gemm.c: fp32; 32 x 32
 * values of 4 bytes, a row 128 bytes): cleared, loaded from and stored to memory. Built only with AMX. */
#pragma once
#include <immintrin.h>

/* Tiles 0-3 cleared, for a block's first depth step. */
static inline void hotrod_tiles_zero(void) {
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
}

/* Tiles 0-3 from sums [32][32] of 4-byte values, for a block's later depth steps. */
static inline void hotrod_tiles_load(const void* sums) {
  const char* at = sums;
  _tile_loadd(0, at, 128);
  _tile_loadd(1, at + 64, 128);
  _tile_loadd(2, at + 16 * 128, 128);
  _tile_loadd(3, at + 16 * 128 + 64, 128);
}

/* Tiles 0-3 into sums [32][32] of 4-byte values. */
static inline void hotrod_tiles_store(void* sums) {
  char* at = sums;
  _tile_stored(0, at, 128);
  _tile_stored(1, at + 64, 128);
  _tile_stored(2, at + 16 * 128, 128);
  _tile_stored(3, at + 16 * 128 + 64, 128);
}
