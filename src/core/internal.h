/*
 * internal.h — what the parts of libbitexact share and the public header
 * does not show: dtype ids, the kernel table each ISA fills, exact deposit
 * into the accumulator, per-exponent integer bins, errors, threads.
 */
#ifndef BX_INTERNAL_H
#define BX_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "bitexact.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Element types the kernels know. */
typedef enum bx_dtype {
  BX_DT_F16 = 0,
  BX_DT_BF16 = 1,
  BX_DT_F32 = 2,
  BX_DT_F64 = 3,
  BX_DT_COUNT = 4
} bx_dtype;

/* Bytes per element of a bx_dtype. */
size_t bx_dtype_size(bx_dtype dt);
const char *bx_dtype_name(bx_dtype dt);

/* ------------------------------------------------------------------------
 * Exact deposits into a bx_acc. They do not normalise: a kernel call on n
 * elements may make at most min(BX_MAX_DEPOSITS, 2n + 1024) deposits into
 * one accumulator; the driver normalises before 2^28 deposits can pile up
 * (each deposit moves a word by less than 2^33, words stay below 2^62).
 * ---------------------------------------------------------------------- */
#define BX_MAX_DEPOSITS (1u << 26)

/* acc += v * 2^exp exactly. Requires exp >= BX_ACC_LSB_EXP and
 * v * 2^exp < 2^2140 in magnitude. v may be negative. */
void bx_acc_deposit_i64(bx_acc *acc, int64_t v, int exp);

/* acc += v * 2^exp exactly, v unsigned (up to 2^64 - 1). */
void bx_acc_deposit_u64(bx_acc *acc, uint64_t v, int exp);

/* acc += v exactly, v a finite double (any sign, subnormals included). */
void bx_acc_deposit_f64(bx_acc *acc, double v);

/* Exact sum of x^2 for a finite double x: x*x = p + e with e = fma(x,x,-p)
 * can underflow; this deposits the exact square via the integer
 * significand. */
void bx_acc_deposit_sq_f64(bx_acc *acc, double x);

/* ------------------------------------------------------------------------
 * Per-exponent integer bins (the exact fallback every kernel shares).
 * bin[e] holds sum of (integer significand)^2 of elements whose biased
 * exponent field is e (subnormals use e = 1 with no hidden bit). Flushed
 * into the accumulator before a bin can overflow.
 * ---------------------------------------------------------------------- */

/* Scalar exact kernels over a contiguous span: acc += sum x^2 (or |x|),
 * NaN/Inf counted, element count added. Portable C; also the fallback the
 * vector kernels call for blocks outside their windows. n <= BX_CHUNK. */
void bx_sumsq_f16_scalar(const uint16_t *x, size_t n, bx_acc *acc);
void bx_sumsq_bf16_scalar(const uint16_t *x, size_t n, bx_acc *acc);
void bx_sumsq_f32_scalar(const float *x, size_t n, bx_acc *acc);
void bx_sumsq_f64_scalar(const double *x, size_t n, bx_acc *acc);
void bx_sumabs_f16_scalar(const uint16_t *x, size_t n, bx_acc *acc);
void bx_sumabs_bf16_scalar(const uint16_t *x, size_t n, bx_acc *acc);
void bx_sumabs_f32_scalar(const float *x, size_t n, bx_acc *acc);
void bx_sumabs_f64_scalar(const double *x, size_t n, bx_acc *acc);

/* Kernels for the rarer norms (src/cpu/portable_misc.c), one span each. */
double bx_load_as_double(const void *data, bx_dtype dt, size_t i);
/* Updates max/min of |x| over non-NaN elements, counts NaN and non-zeros. */
void bx_extreme_abs(const void *data, bx_dtype dt, size_t n, double *maxabs,
                    double *minabs, int64_t *nan_count, int64_t *nonzero);
/* acc += sum |x|^p, each term by bx_pow_det (pow_det.h), the sum exact. */
void bx_sum_pow(const void *data, bx_dtype dt, size_t n, double p, bx_acc *acc);
/* acc += sum of fl32(fl32(x)^2), exact sum (BX_MEGATRON_FP32). */
void bx_sum_megatron_sq(const void *data, bx_dtype dt, size_t n, bx_acc *acc);

/* Grow-only per-thread scratch memory (kept for the thread's life, so a
 * call allocates only when it needs more than any earlier call of this
 * thread). NULL on allocation failure. Invalidated by the next call. */
void *bx_workspace(size_t bytes);

/* ------------------------------------------------------------------------
 * Kernel table: one per ISA (src/cpu/portable.c, avx2.c, avx512.c).
 * Each entry processes n <= BX_CHUNK contiguous elements and adds into
 * acc exactly: the digits (via deposits), nan_count, inf_count and count.
 * It does not normalise. All entries of all ISAs must give the same
 * accumulator value (the words may differ before normalisation).
 * ---------------------------------------------------------------------- */
#define BX_CHUNK ((size_t)1 << 22) /* elements per kernel call, at most */

typedef void (*bx_reduce_fn)(const void *x, size_t n, bx_acc *acc);

typedef struct bx_kernels {
  const char *name; /* "portable", "avx2", "avx512" */
  bx_reduce_fn sumsq[BX_DT_COUNT];
  bx_reduce_fn sumabs[BX_DT_COUNT];
} bx_kernels;

extern const bx_kernels bx_kernels_portable;
#if defined(__x86_64__) || defined(__i386__)
#define BX_HAVE_X86 1
extern const bx_kernels bx_kernels_avx2;
extern const bx_kernels bx_kernels_avx512;
#endif

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

/* The scaling table matching bx_kernels_active(): AVX-512 when the norm
 * kernels are AVX-512, else portable. */
const bx_scale_kernels *bx_scale_kernels_active(void);

/* The kernel table chosen for this CPU at first use: the best of avx512
 * (F+DQ+BW+VL), avx2 (AVX2+FMA+F16C) and portable, or the one named by the
 * environment variable BX_ISA (portable|avx2|avx512) if the CPU has it.
 * Thread-safe. */
const bx_kernels *bx_kernels_active(void);

/* For tests and benchmarks: force a table by name (NULL restores the
 * automatic choice). Returns BX_EINVAL for an unknown name or one the CPU
 * cannot run. Not thread-safe against concurrent norm calls. */
bx_status bx_force_isa(const char *name);

/* ------------------------------------------------------------------------
 * Errors: set the thread-local detail text and return the status.
 * ---------------------------------------------------------------------- */
bx_status bx_fail(bx_status st, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* ------------------------------------------------------------------------
 * Tensor validation: the contiguous span a DLTensor covers.
 * ---------------------------------------------------------------------- */
typedef struct bx_span {
  void *data;     /* first element (data + byte_offset) */
  size_t n;       /* elements */
  bx_dtype dtype;
} bx_span;

/* Validate t and describe its dense span. Errors name it as
 * "FN: group G, tensor I: ..." (or "FN: tensor I" with BX_NO_GROUP). */
#define BX_NO_GROUP ((size_t)-1)
bx_status bx_tensor_span(const DLTensor *t, const char *fn, size_t group, size_t index,
                         bx_span *out);

/* ------------------------------------------------------------------------
 * Collectives (collective.c).
 * ---------------------------------------------------------------------- */
#define BX_MAX_AGREE 16

typedef struct bx_agree_item {
  const char *name; /* what the ranks must agree on, for the message */
  int64_t value;
} bx_agree_item;

/* comm->allreduce_i64 with its failure turned into BX_ECOMM. */
bx_status bx_comm_allreduce(const bx_comm *comm, const char *fn, const char *what,
                            int64_t *buf, size_t n, bx_op op);

/* One MAX all-reduce. *failure (in: bx_failure_key of this rank's local
 * status, -1 if none) travels with it: if any rank failed locally, every
 * rank returns that status (the failing rank keeps its own message).
 * Otherwise BX_EMISMATCH on every rank unless all ranks passed the same
 * values. *offender (in: this rank's NaN/Inf key or -1; out: the max over
 * ranks) travels with it too. */
bx_status bx_agree(const bx_comm *comm, const char *fn, const bx_agree_item *items,
                   size_t nitems, int64_t *offender, int64_t *failure);
int64_t bx_failure_key(int rank, bx_status st);

/* bx_total_norm with extra words the ranks must agree on (clip options);
 * fn names the public function in messages. prior != BX_OK: this rank has
 * already failed (e.g. bx_clip_grad_norm's layout checks): it only joins
 * the agreement step, so that every rank fails, and returns prior. */
bx_status bx_norm_agreed(const char *fn, const bx_group *groups, size_t ngroups,
                         const bx_comm *comm, const bx_norm_opts *opts,
                         const bx_agree_item *extra, size_t nextra, bx_status prior,
                         double *total_norm, double *group_norms);

/* A NaN/Inf location as a key whose MAX over ranks is the first location
 * (lowest rank, then group, then tensor); -1 means none. */
int64_t bx_offender_key(int rank, size_t group, size_t tensor, int is_nan);
void bx_offender_decode(int64_t key, int *rank, size_t *group, size_t *tensor, int *is_nan);

/* ------------------------------------------------------------------------
 * Threads: run fn(ctx, i) for i in [0, ntasks) on up to nthreads workers
 * (the caller's thread is one of them). Tasks are claimed dynamically;
 * callers make results independent of which thread ran which task.
 * ---------------------------------------------------------------------- */
typedef void (*bx_task_fn)(void *ctx, size_t task, int worker);
/* Returns the number of workers used (>= 1), <= nthreads. */
int bx_parallel_run(int nthreads, size_t ntasks, bx_task_fn fn, void *ctx);
int bx_default_threads(void);
#define BX_MAX_THREADS 256

/* ------------------------------------------------------------------------
 * Devices. A call's tensors are all host-readable or all CUDA (kDLCUDA);
 * anything else is refused before any work.
 * ---------------------------------------------------------------------- */
typedef enum bx_where { BX_ON_HOST = 0, BX_ON_CUDA = 1 } bx_where;

/* Where the tensors of groups (or of flat[0..count) when groups is NULL)
 * live; BX_EDEVICE naming the first tensor that differs from tensor 0 when
 * they are mixed (NULL tensors are left to the full validation). */
bx_status bx_tensors_where(const char *fn, const bx_group *groups, size_t ngroups,
                           const DLTensor *flat, size_t count, bx_where *where);

/* bx_tensor_span for CUDA tensors: the same checks, but the tensor must be
 * kDLCUDA (the span's data is then a device address). */
bx_status bx_tensor_span_cuda(const DLTensor *t, const char *fn, size_t group, size_t index,
                              bx_span *out);

/* Validate tensors for in-place scaling (dtype, layout, no overlaps), on
 * the host (cuda = 0) or as CUDA tensors (cuda = 1). */
bx_status bx_validate_scale_targets(const char *fn, const DLTensor *flat, size_t count,
                                    const bx_group *groups, size_t ngroups, int cuda);

/* Per-group partial results of a reduction (norm.c). */
typedef struct bx_partial {
  bx_acc acc;
  double maxabs, minabs;
  int64_t nan, nonzero;
  int64_t pending; /* deposit budget used since the last normalisation */
} bx_partial;

/* Reduction modes, by number (the CUDA kernels use the same numbers). */
typedef enum bx_mode { BX_M_SQ = 0, BX_M_ABS = 1, BX_M_EXT = 2, BX_M_POW = 3, BX_M_MEGATRON = 4 } bx_mode;

/* Check norm options (p, flavor, threads) and pick the reduction mode. */
bx_status bx_check_norm_opts(const char *fn, const bx_norm_opts *o, bx_mode *m);

/* ---- CUDA backend hooks: src/cuda/ with BX_HAVE_CUDA, else cuda_stub.c ---- */

/* Blocking: every group's partial of CUDA tensors (validated, one device),
 * acc normalised; *offender = the first NaN/Inf key (with rank) or -1. */
bx_status bx_cuda_partials(const char *fn, const bx_group *groups, size_t ngroups, bx_mode m,
                           double p, int rank, bx_partial *parts, int64_t *offender);

/* Blocking: scale CUDA tensors (validated already) by coef with the mode's
 * rounding; skip_one: write nothing when coef == 1. */
bx_status bx_cuda_scale_blocking(const char *fn, const DLTensor *flat, size_t count,
                                 const bx_group *groups, size_t ngroups, double coef,
                                 const bx_scale_opts *o, int skip_one);

/* An all-reduce on a device communicator from host words (staged through
 * device memory; blocking). */
int bx_cuda_allreduce_staged(const bx_comm *comm, int64_t *buf, size_t n, bx_op op);

#ifdef __cplusplus
}
#endif

#endif /* BX_INTERNAL_H */
