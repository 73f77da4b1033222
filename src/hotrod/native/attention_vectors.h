/* Encoder attention's two products on AVX-512F alone, for a CPU without AMX's tiles (attention.c's path without
 * them): Q, K, V and the softmax's numerators rounded to bf16 as the tiles' path rounds them (but for subnormals,
 * which its conversion flushes to zero and which are kept here, as ml_dtypes keeps them), then multiplied as
 * floats with fp32 multiply-adds (a product of two bf16 values is exact in fp32), so the answers are bf16
 * attention's on any CPU with AVX-512 (an Ice Lake, a Zen 4), none of its instructions needed. Built without
 * -mavx512bf16: nothing here can be an instruction such a CPU lacks. */
#pragma once
#include <immintrin.h>
#include <stdint.h>

/* 16 floats rounded to bf16's 8 significant bits, to nearest even (NaN kept a NaN), and kept as floats: as numpy's
 * ml_dtypes rounds, with integer arithmetic rather than AVX-512 BF16's conversion. */
static inline __m512 hotrod_round_bf16(__m512 x) {
  const __m512i bits = _mm512_castps_si512(x);
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_add_epi32(bits, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7FFF)));
  r = _mm512_mask_or_epi32(r, _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), bits, _mm512_set1_epi32(0x00400000));
  return _mm512_castsi512_ps(_mm512_and_si512(r, _mm512_set1_epi32((int)0xFFFF0000u)));
}

/* 1 where this CPU has the AVX-512 (F, BW, VL) the path builds on. */
int hotrod_attention_vectors_ready(void);

/* One unit's K [seq_k rows, a row stride `width` on, head_size each] packed rounded for the scores: per 32 keys,
 * per depth d < depth (the head size padded to 32), the 32 keys' values (zeros past either end). */
void hotrod_attention_pack_keys(const float* k, int64_t width, int64_t seq_k, int64_t padded_k, int64_t head_size,
                                int64_t depth, float* packed);

/* One unit's V likewise for P V: per 32 columns, per key < padded_k, the key's 32 values (zeros past either end). */
void hotrod_attention_pack_values(const float* v, int64_t width, int64_t seq_k, int64_t padded_k, int64_t head_size,
                                  int64_t depth, float* packed);

/* `rows` (at most 32) query rows rounded into queries [32, depth], zeros past the head size and the rows. */
void hotrod_attention_queries(const float* q, int64_t width, int64_t rows, int64_t head_size, int64_t depth,
                              float* queries);

/* scores [rows, padded_k] = queries [rows, depth] times the packed keys, for keys < seq_k (rounded up to 32). */
void hotrod_attention_scores(const float* queries, const float* keys, int64_t rows, int64_t seq_k, int64_t padded_k,
                             int64_t depth, float* scores);

/* sums [rows, depth] = numerators [rows, padded_k] times the packed values, for columns < head_size (rounded up to
 * 32). */
void hotrod_attention_weigh(const float* numerators, const float* values, int64_t rows, int64_t padded_k,
                            int64_t head_size, int64_t depth, float* sums);
