/* The AMX kernels' entry points for a compiler that does not know AMX's instructions (gcc before 11): neither
 * the tiles nor the AVX-512 paths beside them are ever ready, so the Python side never rewrites a graph to
 * Int8MatMul, Bf16MatMul or Bf16Attention, and the library's other kernels still build and load. */
#include <string.h>

#include "attention.h"
#include "attention_quads.h"
#include "bf16gemm.h"
#include "i8gemm.h"

int hotrod_kernels_version(void) { return HOTROD_KERNELS_VERSION; }

int hotrod_amx_ready(void) { return 0; }

int hotrod_vnni_ready(void) { return 0; }

int hotrod_bf16_vectors_ready(void) { return 0; }
int hotrod_attention_vectors_ready(void) { return 0; }
int hotrod_attention_pairs_ready(void) { return 0; }
int hotrod_attention_quads_ready(void) { return 0; }

void hotrod_configure_tiles(void) {}

int hotrod_i8_matmul(const uint8_t* q, const float* a_scale, int64_t scale_stride, int64_t rows, int64_t k,
                     const int8_t* w, const int32_t* offsets, const float* w_scale, const float* bias, int64_t n,
                     float* const* y, int64_t parts, int activation, const float* residual, int tiles,
                     hotrod_parallel parallel, void* runner) {
  (void)q, (void)a_scale, (void)scale_stride, (void)rows, (void)k, (void)w, (void)offsets, (void)w_scale, (void)bias;
  (void)n, (void)y, (void)parts, (void)activation, (void)residual, (void)tiles, (void)parallel, (void)runner;
  return -1;
}

int hotrod_i8_matmul_rows(const uint8_t* q, const float* a_scale, int64_t scale_stride, int64_t rows, int64_t k,
                          const int8_t* w, const int32_t* offsets, const float* w_scale, const float* bias, int64_t n,
                          int activation, uint8_t* q_out, float* scales_out, int tiles, hotrod_parallel parallel,
                          void* runner) {
  (void)q, (void)a_scale, (void)scale_stride, (void)rows, (void)k, (void)w, (void)offsets, (void)w_scale, (void)bias;
  (void)n, (void)activation, (void)q_out, (void)scales_out, (void)tiles, (void)parallel, (void)runner;
  return -1;
}

int hotrod_i8_matmul_static(const uint8_t* q, const float* a_scale, int64_t scale_stride, int64_t rows, int64_t k,
                            const int8_t* w, const int32_t* offsets, const float* w_scale, const float* bias,
                            int64_t n, int activation, float scale, int32_t zero_point, uint8_t* out, int tiles,
                            hotrod_parallel parallel, void* runner) {
  (void)q, (void)a_scale, (void)scale_stride, (void)rows, (void)k, (void)w, (void)offsets, (void)w_scale, (void)bias;
  (void)n, (void)activation, (void)scale, (void)zero_point, (void)out, (void)tiles, (void)parallel, (void)runner;
  return -1;
}

int hotrod_bf16_attention(const float* q, const float* k, const float* v, int64_t batch, int64_t seq_q,
                          int64_t seq_k, int64_t heads, int64_t head_size, float scale, const float* mask,
                          const int64_t* mask_dims, size_t mask_count, const hotrod_attention_out* out, int tiles,
                          hotrod_parallel parallel, void* runner) {
  (void)q, (void)k, (void)v, (void)batch, (void)seq_q, (void)seq_k, (void)heads, (void)head_size, (void)scale;
  (void)mask, (void)mask_dims, (void)mask_count, (void)out, (void)tiles, (void)parallel, (void)runner;
  return -1;
}

int hotrod_gelu_values(const float* x, int64_t n, float* y) {
  (void)x, (void)n, (void)y;
  return -1;
}

int hotrod_bf16_matmul(const float* a, const uint16_t* rounded, int64_t rows, int64_t k, const uint16_t* w,
                       const float* bias, int64_t n, float* const* y, uint16_t* y_rounded, int64_t parts,
                       int activation, const float* residual, int tiles, hotrod_parallel parallel, void* runner) {
  (void)a, (void)rounded, (void)rows, (void)k, (void)w, (void)bias, (void)n, (void)y, (void)y_rounded, (void)parts;
  (void)activation, (void)residual, (void)tiles, (void)parallel, (void)runner;
  return -1;
}

/* Nearest even, as the tiles' kernel rounds (never called here: no graph takes the bf16 ops without the tiles). */
void hotrod_round_row(const float* x, int64_t k, uint16_t* out) {
  for (int64_t i = 0; i < k; i++) {
    uint32_t bits;
    memcpy(&bits, x + i, sizeof(bits));
    out[i] = x[i] != x[i] ? (uint16_t)0x7FC0 : (uint16_t)((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16);
  }
}
