/* The int8 units' own rate on this CPU: the hardware floor the int8 products are measured against
 * (`hotrod.bench.floor`), beside the rate of the product kernels themselves. */
#pragma once
#include <stdint.h>

/* int8 operations (two a multiply-add) a second that VPDPBUSD alone runs on the calling thread, over `steps`
 * steps of 24 independent instructions (64 byte multiply-adds each, 1536 a step), operands in registers; -1 where
 * this CPU lacks AVX-512 VNNI or `steps` is not positive. */
double hotrod_vnni_unit_ops(int64_t steps);
