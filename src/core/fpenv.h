/*
 * fpenv.h — the library's own floating-point environment, entered by the
 * generic drivers (every public call on the calling thread: call.c; every
 * job on a worker thread: pool.c), never by a kernel.
 *
 * Every path that promises bits (exact kernels, other p, the Megatron
 * flavour, scaling, the final rounding) assumes round to nearest even,
 * subnormals read and produced as they are (no DAZ, no FTZ) and no traps.
 * A caller may have set anything: torch.set_flush_denormal(True) sets DAZ
 * and FTZ, fesetround changes the rounding, feenableexcept unmasks traps.
 * bx_fpenv_enter saves the caller's control word and status flags and sets
 * the library's; bx_fpenv_leave puts the caller's back exactly (flags
 * included, so the library's inexact results raise nothing the caller
 * sees).
 *
 *   x86-64   MXCSR: 0x1F80 (all exceptions masked, nearest, no DAZ/FTZ,
 *            flags clear). The x87 unit is not used by the library.
 *   aarch64  FPCR: RMode = nearest, FZ = FZ16 = AH = 0, traps off; FPSR's
 *            cumulative flags saved and restored.
 *   other    C99 fenv (fegetenv / fesetenv with FE_DFL_ENV): no
 *            flush-to-zero control exists there to guard against.
 *
 * The verified windows of the AVX-512 fp32 kernel read the inexact flag
 * (bx_fpenv_clear_flags, bx_fpenv_inexact): flags are the library's own
 * inside a call.
 */
#ifndef BX_FPENV_H
#define BX_FPENV_H

#include <stdint.h>

#if defined(__x86_64__) || defined(__i386__)
#define BX_FPENV_X86 1
#define BX_FPENV_MXCSR_EXACT 0x1F80u
#define BX_FPENV_MXCSR_PE 0x20u

typedef struct bx_fpenv {
  unsigned mxcsr;
} bx_fpenv;

static inline void bx_fpenv_enter(bx_fpenv *saved) {
  unsigned mine = BX_FPENV_MXCSR_EXACT;
  __asm__ volatile("stmxcsr %0\n\tldmxcsr %1" : "=m"(saved->mxcsr) : "m"(mine) : "memory");
}

/* Every result is in memory before the caller's word goes back. */
static inline void bx_fpenv_leave(const bx_fpenv *saved) {
  __asm__ volatile("ldmxcsr %0" : : "m"(saved->mxcsr) : "memory");
}

/* Clear the status flags (the control part stays the library's). The
 * memory clobber keeps later loads, and so their arithmetic, after it. */
static inline void bx_fpenv_clear_flags(void) {
  unsigned c = BX_FPENV_MXCSR_EXACT;
  __asm__ volatile("ldmxcsr %0" : : "m"(c) : "memory");
}

/* Non-zero if an inexact result was raised since the last clear, read
 * after every floating-point operation that fed dep (a value computed from
 * the results to be checked: the read cannot move before them). */
static inline unsigned bx_fpenv_inexact(uint64_t dep) {
  unsigned c;
  __asm__ volatile("stmxcsr %0" : "=m"(c) : "r"(dep) : "memory");
  return c & BX_FPENV_MXCSR_PE;
}

#elif defined(__aarch64__)
#define BX_FPENV_ARM64 1

typedef struct bx_fpenv {
  uint64_t fpcr, fpsr;
} bx_fpenv;

static inline void bx_fpenv_enter(bx_fpenv *saved) {
  uint64_t zero = 0;
  __asm__ volatile("mrs %0, fpcr\n\tmrs %1, fpsr" : "=r"(saved->fpcr), "=r"(saved->fpsr) : : "memory");
  /* FPCR = 0: RMode 00 (nearest even), FZ = FZ16 = 0, DN = 0, AH = FIZ =
   * NEP = 0, AHP = 0 (IEEE half), every trap enable 0; the other bits are
   * RES0. FPSR = 0: no cumulative flag raised inside the library. */
  __asm__ volatile("msr fpcr, %0\n\tmsr fpsr, %0" : : "r"(zero) : "memory");
}

static inline void bx_fpenv_leave(const bx_fpenv *saved) {
  __asm__ volatile("msr fpcr, %0\n\tmsr fpsr, %1" : : "r"(saved->fpcr), "r"(saved->fpsr) : "memory");
}

static inline void bx_fpenv_clear_flags(void) {
  uint64_t zero = 0;
  __asm__ volatile("msr fpsr, %0" : : "r"(zero) : "memory");
}

static inline unsigned bx_fpenv_inexact(uint64_t dep) {
  uint64_t s;
  __asm__ volatile("mrs %0, fpsr" : "=r"(s) : "r"(dep) : "memory");
  return (unsigned)(s & 0x10); /* IXC */
}

#else
#include <fenv.h>

typedef struct bx_fpenv {
  fenv_t env;
} bx_fpenv;

static inline void bx_fpenv_enter(bx_fpenv *saved) {
  fegetenv(&saved->env);
  fesetenv(FE_DFL_ENV);
}
static inline void bx_fpenv_leave(const bx_fpenv *saved) { fesetenv(&saved->env); }
static inline void bx_fpenv_clear_flags(void) { feclearexcept(FE_ALL_EXCEPT); }
static inline unsigned bx_fpenv_inexact(uint64_t dep) {
  (void)dep;
  return (unsigned)fetestexcept(FE_INEXACT);
}
#endif

#endif /* BX_FPENV_H */
