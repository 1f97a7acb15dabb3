/*
 * ct.h — the GPU test runner's framework (tests/cuda/): checks and
 * counters, seeded random numbers, and "sets" of gradient tensors that
 * live twice, in one CUDA buffer and in one host buffer holding the same
 * bytes, so that every GPU result can be compared bit for bit with the CPU
 * backend on the same values.
 *
 * Every comparison of a result the contract calls exact is a memcmp of the
 * bit pattern (CT_BITS). The only tolerances are for p other than 0, 1, 2,
 * +-inf (the GPU's pow, documented as not exact) and the only leniency is
 * the payload of NaN gradient elements after scaling (see
 * ct_compare_grads).
 */
#ifndef BX_CUDA_TEST_CT_H
#define BX_CUDA_TEST_CT_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#include "rng.h"
#include "bitexact.h"
#include "bitexact_cuda.h"

#if defined(__GNUC__)
#define CT_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define CT_PRINTF(a, b)
#endif

/* ---- checks ----------------------------------------------------------- */
int ct_check(int ok, const char *file, int line, const char *fmt, ...) CT_PRINTF(4, 5);
int ct_check_bits(double got, double want, const char *file, int line, const char *fmt, ...)
    CT_PRINTF(5, 6);
int ct_check_status(bx_status got, bx_status want, const char *file, int line,
                    const char *fmt, ...) CT_PRINTF(5, 6);
int ct_check_cuda(cudaError_t err, const char *expr, const char *file, int line);

#define CT_CHECK(cond, ...) ct_check(!!(cond), __FILE__, __LINE__, __VA_ARGS__)
/* Bitwise (memcmp) equality of two doubles. */
#define CT_BITS(got, want, ...) ct_check_bits((got), (want), __FILE__, __LINE__, __VA_ARGS__)
#define CT_STATUS(got, want, ...) ct_check_status((got), (want), __FILE__, __LINE__, __VA_ARGS__)
/* A CUDA runtime call of the test itself; evaluates to 1 on success. */
#define CT_CUDA(call) ct_check_cuda((call), #call, __FILE__, __LINE__)

/* Marks the running test as skipped (prints why once). */
void ct_skip(const char *fmt, ...) CT_PRINTF(1, 2);
/* Failed checks so far in the running test. */
int ct_failures(void);
/* Prints an informational line under the running test. */
void ct_note(const char *fmt, ...) CT_PRINTF(1, 2);
/* Seconds on a monotonic clock. */
double ct_now(void);

/* ---- random numbers (src/common/rng.h, shared with the C suite) ----------- */
typedef bx_rng ct_rng;
uint64_t ct_seed(void);          /* the run's base seed (BX_TEST_SEED) */
void ct_rng_init(ct_rng *r);     /* base seed mixed with the running test's name */
void ct_rng_seed(ct_rng *r, uint64_t seed);
uint64_t ct_next(ct_rng *r);
uint64_t ct_below(ct_rng *r, uint64_t n); /* uniform in [0, n) */
double ct_uniform(ct_rng *r);             /* [0, 1) */
double ct_normal(ct_rng *r);              /* N(0, 1) */

/* ---- dtypes ----------------------------------------------------------- */
enum { CT_F32 = 0, CT_BF16 = 1, CT_F16 = 2, CT_F64 = 3, CT_NDT = 4 };
size_t ct_dt_size(int dt);
const char *ct_dt_name(int dt);
DLDataType ct_dl_dtype(int dt);

/* Data sets: how ct_fill chooses each element's bits. */
enum {
  CT_GAUSS,     /* N(0, 1e-2^2), gradient-like */
  CT_WIDE,      /* every finite exponent of the dtype, subnormals included */
  CT_SPIKY,     /* tiny values with rare huge spikes near the dtype's max */
  CT_SUBNORMAL, /* all subnormal */
  CT_ZEROS,     /* +0 and -0 */
  CT_MAXVAL,    /* +-FLT_MAX / DBL_MAX / 65504 / bf16 max everywhere */
  CT_TINY,      /* just above the smallest normal (fp64: ~1e-300 and below) */
  CT_HUGE,      /* near the top of the range (fp64: ~1e300) */
  CT_NAN,       /* gaussian with NaNs (quiet, signalling, both signs) placed
                   at the first, a middle and the last element */
  CT_INF,       /* gaussian with +Inf and -Inf placed likewise */
  CT_NANINF,    /* both */
  CT_NDATA
};
const char *ct_data_name(int data);
int ct_data_nonfinite(int data); /* 1 if the set holds NaN/Inf */

/* ---- tensor sets ------------------------------------------------------ */
/* count tensors, 1-D, in one device buffer and one host buffer at the same
 * offsets. host holds the reference values; work is a host scratch copy
 * the CPU backend may modify; cpu[i] / gpu[i] are the views of tensor i
 * over work / dev. */
typedef struct ct_set {
  size_t count;
  int *dt;          /* dtype of each tensor */
  int64_t *n;       /* elements of each tensor (the views' shapes) */
  size_t *off;      /* byte offset of each tensor in the buffers */
  size_t bytes;     /* buffer size */
  unsigned char *host, *work;
  void *dev;
  DLTensor *cpu, *gpu;
} ct_set;

/* Lays out count tensors of the given dtypes and element counts. misalign:
 * 0 puts every tensor at a 256-byte boundary, 1 at random element-aligned
 * offsets (as views with a storage offset have), half of them through
 * DLTensor.byte_offset. Returns 0 on failure (a failed check was recorded
 * or, for a too large set, a skip). */
int ct_set_init(ct_set *s, size_t count, const int *dt, const int64_t *n, int misalign,
                ct_rng *r);
void ct_set_free(ct_set *s);
/* Fills host with data set `data`, then uploads (dev = work = host). */
void ct_fill(ct_set *s, int data, ct_rng *r);
/* host -> dev and host -> work. */
int ct_upload(ct_set *s);
/* n bytes host -> device, complete before it returns: cudaMemcpy from
 * pageable memory may return before its last DMA lands, and it runs on the
 * legacy stream, which work on a non-blocking stream does not wait for. */
int ct_h2d(void *dev, const void *host, size_t n);
/* dev -> out (s->bytes bytes). */
int ct_download(const ct_set *s, void *out);
/* A set of `count` tensors of random sizes in [0, maxn] and dtypes (dt < 0:
 * random per tensor). */
int ct_set_random(ct_set *s, size_t count, int64_t maxn, int dt, int misalign, ct_rng *r);
/* Total elements. */
int64_t ct_set_elems(const ct_set *s);

/* Splits the set's tensors into ngroups groups at fixed points (group 0 is
 * empty when ngroups >= 3, to exercise empty groups). g_cpu/g_gpu must
 * hold ngroups entries. */
void ct_groups(const ct_set *s, size_t ngroups, bx_group *g_cpu, bx_group *g_gpu);

/* Compares the gradient bytes got and want element by element with the
 * dtypes of s. Non-NaN elements must match bit for bit. A NaN element must
 * be NaN in both; its payload is compared only when BX_CUDA_STRICT_NAN=1:
 * IEEE 754 leaves the payload of an arithmetic NaN result open and NVIDIA
 * GPUs return the canonical NaN where x86 propagates the input's payload
 * (torch's own CUDA mul_ does the same). Returns the number of differing
 * non-NaN elements (failed checks recorded with the first few). */
size_t ct_compare_grads(const ct_set *s, const void *got, const void *want, const char *what);

/* The norm options for index k of the "exact" norm list: p = 2, 1, 0,
 * +inf, -inf and the Megatron flavour. */
#define CT_NNORMS 6
bx_norm_opts ct_norm_opts(int k);
const char *ct_norm_name(int k);

/* Substring "group G, tensor T" of a bitexact error text, or "" (static). */
const char *ct_tensor_ref(const char *msg);

/* ---- for the runner (main.c) only ------------------------------------ */
void ct_begin(const char *name); /* resets the per-test counters */
int ct_skipped(void);
void ct_set_seed(uint64_t seed);

#endif /* BX_CUDA_TEST_CT_H */
