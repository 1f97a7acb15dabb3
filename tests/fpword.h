/*
 * fpword.h — the caller's floating-point control and status as one word,
 * for the tests that call the library under a hostile environment and
 * check that it comes back unchanged (test_fpenv.c, test_kernels.c,
 * test_pow_det.c). The library's side is src/core/fpenv.h.
 *
 *   x86-64   the MXCSR: rounding, DAZ, FTZ, the exception masks and the
 *            sticky flags in one register.
 *   aarch64  FPCR << 32 | FPSR: rounding, FZ, FZ16, DN, AH, FIZ and the
 *            trap enables in the high half, the cumulative flags low.
 *
 * Hardware may ignore control bits it does not implement (the trap enables
 * and FEAT_AFP's AH/FIZ/NEP are optional on aarch64; qemu and most cores
 * read the trap enables as zero): compare against the word read back after
 * setting it (bxt_fpword_set returns it), never against the word asked for.
 * BXT_HAVE_FPWORD is undefined elsewhere; those tests then say so with
 * bxt_skip.
 */
#ifndef BX_TEST_FPWORD_H
#define BX_TEST_FPWORD_H

#include <stdint.h>

typedef unsigned long long bxt_fpword;

#if defined(__x86_64__)
#define BXT_HAVE_FPWORD 1
#define BXT_FPW_DEFAULT 0x1F80ull /* all masked, nearest, no DAZ/FTZ, no flags */
#define BXT_FPW_FLUSH 0x8040ull   /* FTZ | DAZ: subnormal inputs and results as zero */
#define BXT_FPW_RU 0x4000ull
#define BXT_FPW_RD 0x2000ull
#define BXT_FPW_RZ 0x6000ull
#define BXT_FPW_FLAGS 0x003Full /* IE DE ZE OE UE PE */
#define BXT_FPW_INVALID_INEXACT 0x0021ull /* two of the flags: IE PE */
/* w with every floating-point exception trapping (x86: the masks cleared) */
#define BXT_FPW_TRAPS(w) ((w) & ~0x1F80ull)
/* control bits with no x86 counterpart (aarch64: AH, FIZ, NEP, DN, AHP) */
#define BXT_FPW_EXTRA 0ull
#define BXT_FPW_NAME "MXCSR"
/* the bits every CPU of the architecture implements: kept when set */
#define BXT_FPW_IMPLEMENTED 0xFFFFull

static inline bxt_fpword bxt_fpword_get(void) {
  unsigned c;
  __asm__ volatile("stmxcsr %0" : "=m"(c) : : "memory");
  return c;
}

static inline bxt_fpword bxt_fpword_set(bxt_fpword w) {
  unsigned c = (unsigned)w;
  __asm__ volatile("ldmxcsr %0" : : "m"(c) : "memory");
  return bxt_fpword_get();
}

#elif defined(__aarch64__)
#define BXT_HAVE_FPWORD 1
#define BXT_FPCR(bits) ((unsigned long long)(bits) << 32)
#define BXT_FPW_DEFAULT 0ull                              /* FPCR 0, FPSR 0 */
#define BXT_FPW_FLUSH BXT_FPCR((1u << 24) | (1u << 19))   /* FZ | FZ16 */
#define BXT_FPW_RU BXT_FPCR(1u << 22)                     /* RMode 01: toward +inf */
#define BXT_FPW_RD BXT_FPCR(2u << 22)                     /* RMode 10: toward -inf */
#define BXT_FPW_RZ BXT_FPCR(3u << 22)                     /* RMode 11: toward zero */
#define BXT_FPW_FLAGS 0x9Full                             /* FPSR IOC DZC OFC UFC IXC IDC */
#define BXT_FPW_INVALID_INEXACT 0x11ull                   /* two of the flags: IOC IXC */
#define BXT_FPW_TRAPS(w) ((w) | BXT_FPCR(0x9F00u))        /* IOE DZE OFE UFE IXE IDE */
/* AH (alternate handling: flush rules and NaN selection change), FIZ
 * (flush inputs), NEP, DN (default NaN), AHP (alternative half format) */
#define BXT_FPW_EXTRA BXT_FPCR((1u << 1) | (1u << 0) | (1u << 2) | (1u << 25) | (1u << 26))
#define BXT_FPW_NAME "FPCR:FPSR"
/* the bits every ARMv8-A core implements (RMode, FZ, DN; the flags): kept
 * when set. FZ16, AH/FIZ/NEP and the trap enables are optional. */
#define BXT_FPW_IMPLEMENTED (BXT_FPCR((3u << 22) | (1u << 24) | (1u << 25)) | BXT_FPW_FLAGS)

static inline bxt_fpword bxt_fpword_get(void) {
  uint64_t c, s;
  __asm__ volatile("mrs %0, fpcr\n\tmrs %1, fpsr" : "=r"(c), "=r"(s) : : "memory");
  return (bxt_fpword)(c << 32 | (s & 0xFFFFFFFFu));
}

static inline bxt_fpword bxt_fpword_set(bxt_fpword w) {
  uint64_t c = w >> 32, s = w & 0xFFFFFFFFu;
  __asm__ volatile("msr fpcr, %0\n\tmsr fpsr, %1" : : "r"(c), "r"(s) : "memory");
  return bxt_fpword_get();
}
#endif

#endif /* BX_TEST_FPWORD_H */
