/* Encoder attention's int8 path on AVX-512 VNNI (attention_quads.c), one of attention.c's paths. */
#pragma once
#include <stddef.h>

/* 1 where this CPU has the AVX-512 (F, BW, VL) and VNNI the path builds on. */
int hotrod_attention_quads_ready(void);

/* One batch row and head (`index`) of the problem `data` (a hotrod_attention_problem), as hotrod_parallel's task. */
void hotrod_attention_quads_unit(void* data, size_t index);
