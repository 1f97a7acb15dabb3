/*
 * kernels.h — the kernel tables the generic drivers (norm.c, scale.c) call,
 * one per ISA (src/cpu), and the run-time choice between them (dispatch.c).
 *
 * Every kernel runs inside the library's floating-point environment
 * (fpenv.h), entered by the driver: it never saves or sets the control
 * word itself. Each entry processes n <= BX_CHUNK contiguous elements and
 * adds into acc exactly: the digits (via deposits, acc_internal.h),
 * nan_count, inf_count and count. It does not normalise. All entries of
 * all ISAs give the same accumulator value (the words may differ before
 * normalisation).
 */
#ifndef BX_KERNELS_H
#define BX_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "acc_internal.h"
#include "adamw_hd.h"
#include "bitexact.h"
#include "dtype.h"

#ifdef __cplusplus
extern "C" {
#endif

#define BX_CHUNK ((size_t)1 << 22) /* elements per kernel call, at most */

typedef void (*bx_reduce_fn)(const void *x, size_t n, bx_acc *acc);

typedef struct bx_kernels {
  const char *name; /* "portable", "avx2", "avx512", "avx512-pf1" */
  bx_reduce_fn sumsq[BX_DT_COUNT];
  bx_reduce_fn sumabs[BX_DT_COUNT];
} bx_kernels;

extern const bx_kernels bx_kernels_portable;
#if defined(__x86_64__)
#define BX_HAVE_X86 1
extern const bx_kernels bx_kernels_avx2;
extern const bx_kernels bx_kernels_avx512;
extern const bx_kernels bx_kernels_avx512_pf1; /* the same, one prefetch a line (avx512_pf1.c) */
#endif

/* Scalar exact kernels over a contiguous span: acc += sum x^2 (or |x|),
 * NaN/Inf counted, element count added. Portable C (integer bins); also
 * the fallback the vector kernels call for blocks outside their windows.
 * n <= BX_CHUNK. */
void bx_sumsq_f16_scalar(const uint16_t *x, size_t n, bx_acc *acc);
void bx_sumsq_bf16_scalar(const uint16_t *x, size_t n, bx_acc *acc);
void bx_sumsq_f32_scalar(const float *x, size_t n, bx_acc *acc);
void bx_sumsq_f64_scalar(const double *x, size_t n, bx_acc *acc);
void bx_sumabs_f16_scalar(const uint16_t *x, size_t n, bx_acc *acc);
void bx_sumabs_bf16_scalar(const uint16_t *x, size_t n, bx_acc *acc);
void bx_sumabs_f32_scalar(const float *x, size_t n, bx_acc *acc);
void bx_sumabs_f64_scalar(const double *x, size_t n, bx_acc *acc);

/* The same sum |x| kernels as bx_reduce_fn entries (every ISA's table
 * uses them: p = 1 is not on the hot path). */
void bx_portable_sumabs_f16(const void *x, size_t n, bx_acc *acc);
void bx_portable_sumabs_bf16(const void *x, size_t n, bx_acc *acc);
void bx_portable_sumabs_f32(const void *x, size_t n, bx_acc *acc);
void bx_portable_sumabs_f64(const void *x, size_t n, bx_acc *acc);

/* Kernels for the rarer norms (src/cpu/portable_misc.c), one span each. */
double bx_load_as_double(const void *data, bx_dtype dt, size_t i);
/* Updates max/min of |x| over non-NaN elements, counts NaN and non-zeros
 * (a NaN counts as non-zero too: DESIGN §2). */
void bx_extreme_abs(const void *data, bx_dtype dt, size_t n, double *maxabs,
                    double *minabs, int64_t *nan_count, int64_t *nonzero);
/* acc += sum |x|^p, each term by bx_pow_det (pow_det.h), the sum exact. */
void bx_sum_pow(const void *data, bx_dtype dt, size_t n, double p, bx_acc *acc);
/* acc += sum of fl32(fl32(x)^2), exact sum (BX_MEGATRON_FP32). */
void bx_sum_megatron_sq(const void *data, bx_dtype dt, size_t n, bx_acc *acc);

/* Scaling kernels: x[0..n) *= coef in place with bx_scale_mode's rounding.
 * A table per ISA (portable_scale.c, avx512_scale.c); every table gives
 * identical bits. */
typedef void (*bx_scale_fn)(void *x, size_t n, double coef);

typedef struct bx_scale_kernels {
  const char *name;
  bx_scale_fn torch[BX_DT_COUNT]; /* BX_SCALE_TORCH */
  bx_scale_fn exact[BX_DT_COUNT]; /* BX_SCALE_EXACT */
} bx_scale_kernels;

extern const bx_scale_kernels bx_scale_portable;
#ifdef BX_HAVE_X86
extern const bx_scale_kernels bx_scale_avx512;
#endif

/* GEMM micro-kernels (bitexact_train.h's bx_gemm; driver src/train/gemm.c):
 * c[0..mr)[0..nr) (row stride ldc floats) gets, per element, the chain
 * acc = load_c ? c[i][j] : +0.0f; then for k = 0..kc-1
 * acc = fma(ap[k*mr + i], bp[k*nr + j], acc), one rounding per step, k in
 * increasing order; then c[i][j] = acc. ap: kc x mr packed A (k-major), bp:
 * kc x nr packed B. Every ISA's kernel gives identical bits (the chain is
 * the whole numerics); only mr and nr differ. */
typedef void (*bx_gemm_micro_fn)(size_t kc, const float *ap, const float *bp, float *c,
                                 size_t ldc, int load_c);

/* The same with B read in place, element (k, j) at bp[k*ldb + j] (no
 * alignment needed): the row-major B of NN and TN, unpacked. The same
 * chain, so the same bits. */
typedef void (*bx_gemm_micro_ldb_fn)(size_t kc, const float *ap, const float *bp, size_t ldb,
                                     float *c, size_t ldc, int load_c);

typedef struct bx_gemm_kernel {
  const char *name;
  size_t mr, nr; /* tile rows and columns, at most BX_GEMM_MR_MAX, BX_GEMM_NR_MAX */
  bx_gemm_micro_fn micro;
  bx_gemm_micro_ldb_fn micro_ldb; /* NULL: the driver packs B */
} bx_gemm_kernel;

#define BX_GEMM_MR_MAX 16
#define BX_GEMM_NR_MAX 64

extern const bx_gemm_kernel bx_gemm_portable;
#ifdef BX_HAVE_X86
extern const bx_gemm_kernel bx_gemm_avx2;
extern const bx_gemm_kernel bx_gemm_avx512;
#endif

/* The GEMM micro-kernel matching bx_kernels_active(). */
const bx_gemm_kernel *bx_gemm_kernel_active(void);

/* Token reduction's rounding onto the grid (bitexact_train.h's
 * bx_tokred_add; the rule is src/common/tokred_grid.h's bx_tokred_q):
 * for i in [0, n): if a[i] is finite (|bits| < 0x7f800000),
 *   w[i] += bits((double)a[i] * inv_step + 1.5*2^52) - bits(1.5*2^52)
 * (the product exact, the sum one rounding to nearest even: for |a[i] *
 * inv_step| <= 2^51 that is round_nearest_even(a[i] * inv_step)); a
 * non-finite a[i] adds 0 and counts. *nonfinite = the count; returns the
 * largest |bits| (sign cleared) of the finite a[i], 0 if none. The same
 * formula for every input, in range or not, so every table gives
 * identical words and the caller can undo an add exactly with the scalar
 * rule. Words are added modulo 2^64 (in range no sum wraps: the grid
 * keeps |sum| <= 2^62). n <= BX_CHUNK not required. */
typedef uint32_t (*bx_tokred_grid_fn)(int64_t *w, const float *a, size_t n, double inv_step,
                                      int64_t *nonfinite);

/* The largest |bits| (sign cleared) of the finite a[i], i < n; 0 if none
 * (the exponent bound of bx_tokred_bound, the maxima of
 * bx_linear_wgrad_bound). An integer maximum: every table agrees. */
typedef uint32_t (*bx_tokred_maxabs_fn)(const float *a, size_t n);

typedef struct bx_tokred_kernels {
  const char *name;
  bx_tokred_grid_fn grid_add;
  bx_tokred_maxabs_fn max_abs;
} bx_tokred_kernels;

extern const bx_tokred_kernels bx_tokred_portable;
#ifdef BX_HAVE_X86
extern const bx_tokred_kernels bx_tokred_avx2;
extern const bx_tokred_kernels bx_tokred_avx512;
#endif

/* The token-reduction table matching bx_kernels_active(). */
const bx_tokred_kernels *bx_tokred_kernels_active(void);
/* Elementwise math kernels (bitexact_train.h's bx_exp ... bx_cos; driver
 * src/train/math.c): y[i] = f(x[i]) for i < n, f the math_det.h function
 * (bx_expf_det ...), bit for bit, in every ISA's table. y may be x itself
 * (in place), no other overlap. The portable table runs the scalar
 * functions (portable_math.c); the vector ones compute a binary64
 * approximation per lane, keep it where it provably rounds to the
 * correctly rounded fp32 value (the scalar functions' result) and redo
 * the other lanes with the scalar functions (vmath_body.h; all 2^32
 * inputs checked: dev/math_exhaustive.c --vector). */
typedef void (*bx_math_fn)(const float *x, float *y, size_t n);

/* bx_adamw_step's per-element update (src/train/adamw.c forms the fp32
 * scalars; src/cpu/adamw_body.h is the loop every table runs: the same
 * bits on every ISA). p, m, v updated in place, no overlap. */
/* bx_adamw_scalars: src/common/adamw_hd.h (the per-element update itself). */
typedef void (*bx_adamw_fn)(float *p, const float *g, float *m, float *v, size_t n,
                            const bx_adamw_scalars *s);

/* fp32 -> bf16, nearest even, every NaN 0x7FC0 (src/cpu/bf16_body.h: the
 * same loop in every table, vectorised where the ISA allows). */
typedef void (*bx_bf16_round_fn)(const float *x, uint16_t *y, size_t n);

typedef struct bx_math_kernels {
  const char *name;
  bx_math_fn exp, log, sigmoid, silu, rsqrt, sin, cos;
  bx_adamw_fn adamw;
  bx_bf16_round_fn bf16_round;
} bx_math_kernels;

extern const bx_math_kernels bx_math_portable;
#ifdef BX_HAVE_X86
extern const bx_math_kernels bx_math_avx2;
extern const bx_math_kernels bx_math_avx512;
#endif

/* The math kernels matching bx_kernels_active(). */
const bx_math_kernels *bx_math_kernels_active(void);

/* The kernel table chosen for this CPU at first use (or the one named by
 * the environment variable BX_ISA, if the CPU has it): the fastest the
 * CPU runs, by dispatch.c's CPU table, else the widest. Thread-safe. */
const bx_kernels *bx_kernels_active(void);

/* Why the active table was chosen, one line for logs and benchmarks: its
 * name, a colon, and the reason ("the CPU table's choice for ...", "the
 * widest ISA this CPU runs (...)", "forced by ..."). */
const char *bx_kernels_reason(void);

/* The scaling table matching bx_kernels_active(). */
const bx_scale_kernels *bx_scale_kernels_active(void);

/* For tests and benchmarks: force a table by name (NULL restores the
 * automatic choice). BX_EINVAL for an unknown name or one the CPU cannot
 * run. Not thread-safe against concurrent calls. */
bx_status bx_force_isa(const char *name);

#ifdef __cplusplus
}
#endif

#endif /* BX_KERNELS_H */
