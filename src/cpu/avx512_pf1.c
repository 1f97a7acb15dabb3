/*
 * avx512_pf1.c — the AVX-512 norm kernels again, with one software
 * prefetch a line (prefetch.h: BX_PREFETCH_ONE) instead of the two: the
 * kernel table "avx512-pf1", which dispatch.c's cpu_rules choose on the
 * CPUs measured faster with it (AMD EPYC, family 0x1A). The same source,
 * so the same arithmetic and bits; only the names of the tables change.
 */
#define BX_PREFETCH_ONE 8192 /* bytes ahead, prefetcht2 */
#define BX_AVX512_NAME "avx512-pf1"
#define bx_kernels_avx512 bx_kernels_avx512_pf1
#define bx_micro_f32_avx512 bx_micro_f32_avx512_pf1
#define bx_micro_bf16_avx512 bx_micro_bf16_avx512_pf1
#define bx_micro_f16_avx512 bx_micro_f16_avx512_pf1
#define bx_micro_f64_avx512 bx_micro_f64_avx512_pf1

#include "avx512.c"
#include "avx512_f64.c"
#include "avx512_half.c"
