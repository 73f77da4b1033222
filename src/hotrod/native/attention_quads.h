/* Encoder attention's int8 path on AVX-512 VNNI (attention_quads.c), one of attention.c's paths. */
#pragma once
#include <stddef.h>

/* 1 where this CPU has the AVX-512 (F, BW, VL) and VNNI the path builds on. */
int hotrod_attention_quads_ready(void);

#include "attention.h"

/* Task `task` of the problem `data` (a hotrod_attention_problem; its tasks: hotrod_attention_tasks), as
 * hotrod_parallel's task. */
void hotrod_attention_quads_task(void* data, size_t task);
