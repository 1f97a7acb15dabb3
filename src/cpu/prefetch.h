/*
 * prefetch.h — the one software prefetch of every streaming kernel loop.
 *
 * For every 64-byte line a loop reads for the first time at p, one
 * prefetcht2 of p + 16 KiB (into L2, early enough for DRAM's latency) and
 * one prefetcht0 of p + 2 KiB (into L1, just in time). Measured on Intel
 * (Sapphire/Emerald Rapids, KVM): without them the AVX-512 kernels read at
 * half the bandwidth the hardware streamers give a plain loop, and
 * prefetching every other line only loses 3-30%.
 *
 * BX_PREFETCH_ONE (the kernel table "avx512-pf1", avx512_pf1.c): one
 * prefetcht2 of p + BX_PREFETCH_ONE bytes a line instead of the two.
 * Measured on AMD EPYC (family 0x1A, KVM; docs/benchmarks.md): the two
 * cost the AVX-512 fp32 kernels 15% of their streaming speed there, one
 * 8 KiB ahead reads at the plain loop's speed; no prefetch at all is
 * slower still. Which table a CPU gets is dispatch.c's cpu_rules.
 *
 * Inline asm, not _mm_prefetch or __builtin_prefetch: GCC 12 silently
 * dropped _mm_prefetch from inlined helpers, and a volatile asm cannot be
 * dropped, merged or hoisted. `make dev-check` (dev/check_prefetch.sh)
 * checks the emitted code of every hot loop function. A prefetch never
 * faults: past the end of the data it fetches nothing useful, harmlessly.
 */
#ifndef BX_PREFETCH_H
#define BX_PREFETCH_H

#ifndef BX_PREFETCH_FAR /* (overridable for tuning runs; the defaults are what ships) */
#define BX_PREFETCH_FAR 16384 /* bytes ahead, prefetcht2 */
#endif
#ifndef BX_PREFETCH_NEAR
#define BX_PREFETCH_NEAR 2048 /* bytes ahead, prefetcht0 */
#endif

static inline __attribute__((always_inline)) void bx_prefetch_line(const void *p) {
#if defined(BX_PREFETCH_ONE) && (defined(__x86_64__) || defined(__i386__))
  __asm__ volatile("prefetcht2 %c1(%0)" : : "r"(p), "i"(BX_PREFETCH_ONE));
#elif defined(__x86_64__) || defined(__i386__)
  __asm__ volatile("prefetcht2 %c1(%0)\n\tprefetcht0 %c2(%0)"
                   :
                   : "r"(p), "i"(BX_PREFETCH_FAR), "i"(BX_PREFETCH_NEAR));
#else
  __builtin_prefetch((const char *)p + BX_PREFETCH_FAR, 0, 1);
  __builtin_prefetch((const char *)p + BX_PREFETCH_NEAR, 0, 3);
#endif
}

#endif /* BX_PREFETCH_H */
