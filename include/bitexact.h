/*
 * bitexact.h — exact, layout-invariant gradient norms and clipping.
 *
 * bitexact computes the global gradient norm of a training step exactly:
 * every square is formed without rounding, the squares are summed in a
 * fixed-point integer accumulator with no rounding at all, partial sums
 * from threads, tensors and ranks are combined by integer addition (which is
 * associative), and the result is rounded once.  The norm is therefore a
 * pure function of the multiset of gradient values: the same bits for any
 * tensor order, partition, thread count, rank count or machine.
 *
 * Assumptions (checked at build time where possible): IEEE-754 binary16,
 * bfloat16, binary32 and binary64 data; the host's double is binary64.
 *
 * NaN: every NaN a call computes and stores (a norm, a coefficient, a
 * scaled gradient, every output of bitexact_train.h) is the canonical
 * quiet NaN of its format, whatever the CPU or the operands' payloads:
 * fp32 0x7FC00000, fp64 0x7FF8000000000000, bf16 0x7FC0, fp16 0x7E00. A
 * value a call only moves (a row of a permutation or an embedding lookup)
 * keeps its bits. So NaN-producing data give the same bytes on x86-64 and
 * aarch64 (docs/design.md, "NaN").
 *
 * Floating-point environment: results never depend on it. Every call runs
 * its arithmetic, on the calling thread and on the worker threads, in the
 * library's own environment (x86-64: MXCSR with round to nearest even, no
 * flush-to-zero, no denormals-are-zero, every exception masked), whatever
 * the caller set (fesetround, torch.set_flush_denormal, feenableexcept),
 * and gives the caller's control word and status flags back unchanged
 * before it returns. A communicator callback runs in the caller's
 * environment, not the library's.
 *
 * Re-entry: a call may be made from inside a communicator callback of
 * another call on the same thread (a logging hook that computes another
 * norm), nested up to BX_MAX_NESTING deep; deeper nesting fails with
 * BX_EINVAL naming the cause. Each nesting level has its own scratch memory.
 *
 * fork(): a child process forked while no call of the library is running
 * in any thread may call the library at once; it starts its own worker
 * threads when it needs them.
 *
 * Threads: the default number of worker threads is the number of CPUs this
 * process may run on: the CPU affinity mask (sched_getaffinity, set by
 * taskset, numactl or an MPI launcher's binding), lowered to the cgroup CPU
 * quota when one is set (cpu.max, or cfs_quota_us / cfs_period_us),
 * rounded up; read once per process (again in a forked child). The
 * environment variable BX_NUM_THREADS overrides it, and an options struct's
 * num_threads overrides both. The result never depends on any of them.
 *
 * Conventions for every function below unless its comment says otherwise:
 *  - returns a bx_status; BX_OK is 0; on error bx_last_error() holds a
 *    one-line text naming the group, tensor index (and rank) at fault;
 *  - the library never exits, aborts, prints, or keeps a pointer it was
 *    given: DLTensor views are borrowed for the duration of the call only;
 *  - functions are thread-safe: several threads may call the library at
 *    once on different data (internal worker threads are shared);
 *  - on any error no output and no gradient has been modified;
 *  - a call that succeeds leaves bx_last_error() as it was.
 *
 * Simple API first: bx_total_norm, bx_clip_grad_norm, bx_scale.
 * Then the accumulator, for callers that build their own reductions.
 */
#ifndef BITEXACT_H
#define BITEXACT_H

#include <stddef.h>
#include <stdint.h>

#include <dlpack/dlpack.h>

#ifdef __cplusplus
extern "C" {
#endif

/* BX_API marks the library's public functions: the libraries are built
 * with -fvisibility=hidden, so exactly the functions declared in the
 * public headers (bitexact*.h) are exported from the shared objects. */
#ifndef BX_API
#if defined(__GNUC__) || defined(__clang__)
#define BX_API __attribute__((visibility("default")))
#else
#define BX_API
#endif
#endif

/* The version of these headers: the single source of the version number
 * (build files and the Python packaging read these three lines). */
#define BX_VERSION_MAJOR 0
#define BX_VERSION_MINOR 2
#define BX_VERSION_PATCH 0
#define BX_VERSION_NUMBER \
  (BX_VERSION_MAJOR * 10000 + BX_VERSION_MINOR * 100 + BX_VERSION_PATCH)
#define BX_STRINGIFY_(x) #x
#define BX_STRINGIFY(x) BX_STRINGIFY_(x)
/* "0.2.0" */
#define BX_VERSION_STRING \
  BX_STRINGIFY(BX_VERSION_MAJOR) "." BX_STRINGIFY(BX_VERSION_MINOR) "." BX_STRINGIFY(BX_VERSION_PATCH)

/* Runtime version of the library actually linked (its BX_VERSION_NUMBER),
 * which may differ from the headers a program was compiled with. Cannot
 * fail; thread-safe. */
BX_API unsigned bx_version(void);

/* The same as a text, "major.minor.patch" (the library's
 * BX_VERSION_STRING). Never NULL; static storage; thread-safe. */
BX_API const char *bx_version_string(void);

/* The kernels this process uses: "avx512", "avx2" or "portable" (chosen
 * from the CPU's features at first use; the environment variable BX_ISA
 * forces one the CPU supports). Results never depend on it. Static
 * storage; thread-safe. */
BX_API const char *bx_isa_name(void);

/* ------------------------------------------------------------------------
 * Status codes
 * ---------------------------------------------------------------------- */
typedef enum bx_status {
  BX_OK = 0,
  BX_EINVAL = 1,      /* invalid argument: NULL pointer, bad p, bad max_norm */
  BX_EDTYPE = 2,      /* dtype is not fp16/bf16/fp32/fp64 with lanes == 1 */
  BX_EDEVICE = 3,     /* tensor lives on a device this build cannot read */
  BX_ELAYOUT = 4,     /* misaligned; a tensor written in place (bx_scale,
                         bx_clip_grad_norm) whose logical elements overlap,
                         or that shares a byte with another; a strided
                         tensor where only dense ones are accepted (CUDA
                         tensors, the training kernels) */
  BX_ENONFINITE = 5,  /* NaN/Inf found with error_if_nonfinite set */
  BX_ENOMEM = 6,      /* allocation failed */
  BX_ECOMM = 7,       /* the communicator's all-reduce failed */
  BX_EMISMATCH = 8,   /* ranks disagree on version, group count or options */
  BX_EINTERNAL = 9    /* a bug in bitexact: please report */
} bx_status;

/* Fixed English text for a status ("BX_EDTYPE: unsupported dtype").
 * Never NULL; static storage. */
BX_API const char *bx_status_str(bx_status status);

/* Detail of the last failing call made by this thread, e.g.
 * "bx_total_norm: group 1, tensor 7: dtype int32 is not supported".
 * Thread-local, static storage, valid until this thread's next failing
 * call. "" when this thread has not failed yet. */
BX_API const char *bx_last_error(void);

/* Where the last failing call of this thread failed, as numbers (so that
 * bindings can name a parameter without parsing the text): the rank (-1
 * when the call had no communicator or the rank is not known), the group
 * and the tensor index within it (-1 when the error names none; for
 * bx_scale and bx_acc_* calls group is -1 and tensor is the index in the
 * array). A rank's own local failure carries its own location; the other
 * ranks of the call report the lowest failing rank and its location.
 * Thread-local, static storage, updated together with bx_last_error(). */
typedef struct bx_error_location {
  int rank;
  long long group;
  long long tensor;
} bx_error_location;
BX_API const bx_error_location *bx_last_error_location(void);

/* BX_OK if this build has the CUDA backend (bitexact_cuda.h) and a CUDA
 * device is usable, else BX_EDEVICE with the reason in bx_last_error().
 * Callable in every build, without CUDA headers. Thread-safe. */
BX_API bx_status bx_cuda_available(void);

/* Deepest nesting of calls from communicator callbacks (see Re-entry). */
#define BX_MAX_NESTING 4

/* ------------------------------------------------------------------------
 * Options (versioned by initializer macros: new fields go at the end, so
 * code written with the _DEFAULT macros keeps compiling and meaning the
 * same thing). A NULL options pointer means the defaults.
 *
 * Struct sizes (ABI): bx_norm_opts, bx_scale_opts, bx_clip_opts and bx_comm
 * begin with `size_t struct_size`, which their _DEFAULT macro sets to the
 * struct's sizeof as the caller's compiler saw it. Start every such struct
 * from its macro and set the other fields by name:
 *     bx_norm_opts o = BX_NORM_OPTS_DEFAULT;  o.norm_type = 1.0;
 * never with a positional initialiser of your own or a bare memset.
 * Every call that takes one (bx_total_norm, bx_scale, bx_clip_grad_norm,
 * bx_clip_coef, bx_cuda_plan_create; for a bx_clip_opts also its nested
 * norm and scale) checks struct_size first, before it reads any other
 * field: a value other than this library's sizeof fails the call with
 * BX_EINVAL, nothing written, and bx_last_error() says which case it is —
 * 0 (not initialised with the macro), smaller (built against an older
 * bitexact, or set by hand), larger (built against a newer bitexact than
 * the library it runs with), or not a size at all (a program built against
 * bitexact 0.1, whose structs had no struct_size). So a program and a
 * library that disagree on a struct's layout fail loudly instead of
 * misreading it. A NULL pointer still means the defaults. This version
 * accepts its own sizes only; a later one may also accept the sizes of
 * older releases (their fields are a prefix of its own).
 * ---------------------------------------------------------------------- */
typedef enum bx_norm_flavor {
  /* exact: squares exact, sum exact, one correct rounding (DESIGN §2) */
  BX_EXACT = 0,
  /* Megatron-LM "reproducible grad norm": each element converted to fp32,
   * its square rounded to fp32, those fp32 squares summed exactly, the sum
   * rounded once to fp32 (nearest-even), then fp32 sqrt (correctly
   * rounded). p = 2 only. The fp32 result is returned widened to double. */
  BX_MEGATRON_FP32 = 1
} bx_norm_flavor;

/* The floating-point format the norms are rounded into (the returned
 * doubles hold values of that format exactly). p = 2 and p = 1 are rounded
 * once, correctly, from the exact sum; p = 0, +-inf and the Megatron
 * flavour round their exact value once; other p round bx_pow_det's fp64
 * result again (not exact anyway). */
typedef enum bx_norm_dtype {
  BX_NORM_F64 = 0,   /* fp64 (the default) */
  /* the gradients' dtype, promoted as torch does over all tensors of all
   * groups of all ranks: one dtype → that dtype; fp16 and bf16 mixed →
   * fp32; any fp32 → fp32; any fp64 → fp64; no tensor → fp32. The format
   * torch.nn.utils.clip_grad_norm_ returns its norm in. */
  BX_NORM_GRADS = 1,
  BX_NORM_F32 = 2,
  BX_NORM_BF16 = 3,
  BX_NORM_F16 = 4
} bx_norm_dtype;

typedef struct bx_norm_opts {
  size_t struct_size; /* sizeof(bx_norm_opts): see "Struct sizes" above */
  /* 2.0 (default), 1.0, 0.0 (count of non-zeros), INFINITY (max |x|),
   * -INFINITY (min |x|), or any other p, negative included (|x|^p rounded
   * to fp64, then an exact sum rounded to fp64, then its 1/p-th power: not
   * exact, but the same bits on every CPU and GPU — the power function is
   * built from IEEE basic operations only). For p < 0 (torch's values): a
   * zero element makes its term +Inf and the norm 0; an Inf element adds
   * 0; every element Inf (or every term underflowing) gives +Inf; no
   * element gives 0; NaN gives NaN. NaN is rejected with BX_EINVAL. */
  double norm_type;
  /* non-zero: the call fails with BX_ENONFINITE exactly when the total
   * norm is NaN or ±Inf (torch's rule, DESIGN §2: p = 0, p < 0 and p =
   * -inf can stay finite with Inf elements), naming the first tensor that
   * holds a NaN/Inf (lowest rank, then group, then index; for p < 0 with a
   * NaN on a rank, that rank's first NaN) — or, when none does,
   * saying that the finite sum overflows the norm's format (norm_dtype);
   * nothing is written. Zero: NaN anywhere gives a NaN norm; otherwise any
   * ±Inf gives +Inf (for p > 0; p = 0 counts Inf as non-zero and p = -inf
   * takes min |x| with Inf as a value). */
  int error_if_nonfinite;
  /* worker threads; 0 = library default (the CPUs this process may run
   * on, or BX_NUM_THREADS: see Threads above). The result never depends on
   * it. */
  int num_threads;
  bx_norm_flavor flavor;
  /* the format of total_norm and group_norms (BX_NORM_F64 by default) */
  bx_norm_dtype norm_dtype;
} bx_norm_opts;

#define BX_NORM_OPTS_DEFAULT {sizeof(bx_norm_opts), 2.0, 0, 0, BX_EXACT, BX_NORM_F64}

typedef enum bx_scale_mode {
  /* torch-compatible: c32 = (float)coef (nearest-even); fp32 grads
   * g = fl32(g * c32); bf16/fp16 grads g = round_to_dtype(fl32((float)g *
   * c32)) — exactly what torch's `grad.mul_(clip_coef.to(grad.dtype))`
   * computes on CPU; fp64 grads g = fl64(g * coef). */
  BX_SCALE_TORCH = 0,
  /* exact-once: the exact product g * coef (coef as the given double) is
   * rounded once to the grad's dtype, nearest-even, for every dtype. */
  BX_SCALE_EXACT = 1
} bx_scale_mode;

typedef struct bx_scale_opts {
  size_t struct_size; /* sizeof(bx_scale_opts): see "Struct sizes" above */
  bx_scale_mode mode;
  int num_threads; /* 0 = library default; results never depend on it */
} bx_scale_opts;

#define BX_SCALE_OPTS_DEFAULT {sizeof(bx_scale_opts), BX_SCALE_TORCH, 0}

typedef enum bx_coef_formula {
  /* coef = min(1, max_norm / (total_norm + eps)), computed in double: the
   * formula of torch.nn.utils.clip_grad_norm_ (torch evaluates it in the
   * norm's dtype, fp32 for fp32 grads; bitexact.torch reproduces that with
   * torch's own ops and passes the result to bx_scale). */
  BX_COEF_TORCH = 0,
  /* coef = max_norm / max(total_norm, max_norm): exactly 1 whenever no
   * clipping is needed (eps unused). */
  BX_COEF_MAX = 1
} bx_coef_formula;

typedef struct bx_clip_opts {
  size_t struct_size;  /* sizeof(bx_clip_opts): see "Struct sizes" above */
  bx_norm_opts norm;   /* with its own struct_size, checked too */
  bx_scale_opts scale; /* with its own struct_size, checked too */
  double eps; /* 1e-6, as torch */
  bx_coef_formula formula;
} bx_clip_opts;

#define BX_CLIP_OPTS_DEFAULT \
  {sizeof(bx_clip_opts), BX_NORM_OPTS_DEFAULT, BX_SCALE_OPTS_DEFAULT, 1e-6, BX_COEF_TORCH}

/* ------------------------------------------------------------------------
 * Tensors, groups and communicators
 *
 * Accepted tensors: dtype fp16 (kDLFloat,16), bf16 (kDLBfloat,16), fp32
 * (kDLFloat,32), fp64 (kDLFloat,64), lanes == 1; device kDLCPU,
 * kDLCUDAHost, kDLCUDAManaged or kDLROCMHost (host-readable memory), with
 * data + byte_offset aligned to the element size.
 * Layouts. bx_total_norm, bx_clip_grad_norm and bx_scale take host tensors
 * of any DLPack strides: strides == NULL (row-major), any permutation,
 * gaps (g[:, ::2], a column of a buffer), negative strides, stride 0 (an
 * expanded tensor). A norm reads every logical element: a stride-0 dim of
 * size k counts its memory k times, as torch's norm of an expanded tensor
 * does (the order of elements never matters). Scaling writes each logical
 * element once and no other byte; so a tensor written in place must not
 * have two logical elements in one place (a stride-0 dim of size > 1, or
 * overlapping strides: BX_ELAYOUT naming it, as torch's mul_ refuses an
 * expanded tensor) and two tensors must not share a byte (BX_ELAYOUT
 * naming both; interleaved but disjoint views, the even and the odd
 * columns of one buffer, are fine). Dense layouts (one block of memory,
 * any order of dims) run the fast path; strided ones are gathered in small
 * pieces into the same kernels, so the bits are those of a dense copy.
 * CUDA tensors (bitexact_cuda.h and the calls below) must be dense:
 * BX_ELAYOUT "non-dense CUDA tensors are not supported: pass
 * .contiguous()". Strides of size-1 dimensions are ignored. Zero-element
 * tensors are allowed and contribute nothing.
 * ---------------------------------------------------------------------- */

/* A set of tensors this rank owns (DESIGN §5): each gradient element of the
 * whole model must be passed by exactly one rank. Borrowed, never kept. */
typedef struct bx_group {
  const DLTensor *tensors;
  size_t count;
} bx_group;

typedef enum bx_op { BX_OP_SUM = 0, BX_OP_MAX = 1 } bx_op;

/* An all-reduce over int64 words, supplied by the caller or an adapter
 * (bitexact_mpi.h, bitexact_nccl.h). Build a host communicator of your own
 * from BX_COMM_DEFAULT (which sets struct_size: see "Struct sizes" above):
 *     bx_comm c = BX_COMM_DEFAULT;
 *     c.allreduce_i64 = my_allreduce;  c.ctx = my_ctx;  c.rank = my_rank;
 * The adapters set struct_size themselves. allreduce_i64 must replace buf[0..n)
 * on every rank with the element-wise SUM (or MAX) over all ranks of the
 * communicator, and return 0 on success, non-zero on failure. It is called
 * from the thread that called bx_total_norm / bx_clip_grad_norm, at most
 * twice per call (a tiny MAX agreement step, then the norm's one
 * fixed-size collective), in the same order on every rank. A NULL bx_comm
 * means this process alone. rank is this process's index, used only in
 * error messages (0 if unknown).
 *
 * The norm's collective (the second call) holds one block of words per
 * group of the call, in group order, all blocks of equal size (n divided
 * by the number of groups; a call without groups is one group). This
 * layout is part of the contract: a communicator may reduce each block
 * over a different set of ranks (bitexact.megatron sums the dense and the
 * expert parameters' blocks over their own process groups), and the
 * finish then combines the reduced blocks exactly.
 *
 * A comm whose struct_size is wrong fails the call with BX_EINVAL at once,
 * before any collective: its function pointers cannot be trusted, so it
 * is never called, and this rank does not take part in the call's
 * collectives. The other ranks then wait in their first collective for
 * this one, as for a rank that never makes the call; in practice every
 * rank runs the same program against the same library, so every rank
 * fails the same way. (Options with a wrong struct_size and a good comm
 * are a local failure like any other: the rank still joins the agreement
 * step, so every rank fails and none waits.) */
typedef struct bx_comm {
  size_t struct_size; /* sizeof(bx_comm): see "Struct sizes" above */
  int (*allreduce_i64)(int64_t *buf, size_t n, bx_op op, void *ctx);
  void *ctx;
  int rank;
  /* Device communicators (bitexact_nccl.h) only; zero (as
   * BX_COMM_DEFAULT leaves them) for host ones.
   * on_device = 1: buf is CUDA device memory; allreduce_i64_async(buf, n,
   * op, ctx, s) enqueues the all-reduce on stream s (a cudaStream_t)
   * without waiting. The stream-ordered API (bitexact_cuda.h) uses it on
   * the caller's stream; the blocking calls stage host words through
   * device memory and use it on `stream`, then wait. */
  int on_device;
  void *stream;
  int (*allreduce_i64_async)(int64_t *buf, size_t n, bx_op op, void *ctx, void *s);
  /* Optional (NULL: not offered; bx_comm_mpi sets it). A float SUM
   * all-reduce of buf[0..n) in place, reduced in whatever order the
   * transport chooses (ring, tree, ...), as DDP and Megatron reduce their
   * fp32 gradients: neither exact nor layout-invariant. Only the training
   * token reduction's ordinary mode (the negative control,
   * bitexact_train_tokred.h) calls it; the norm and the invariant mode
   * never do. Host buffers; same return rule as allreduce_i64. */
  int (*allreduce_f32)(float *buf, size_t n, void *ctx);
} bx_comm;

/* A host communicator with no function yet: every field zero or NULL
 * except struct_size. */
#define BX_COMM_DEFAULT {sizeof(bx_comm), NULL, NULL, 0, 0, NULL, NULL, NULL}

/* ------------------------------------------------------------------------
 * Simple API
 * ---------------------------------------------------------------------- */

/* The p-norm of all elements of all tensors in all groups, and optionally of
 * each group.
 *   groups, ngroups  borrowed; ngroups == 0 (groups may then be NULL) gives
 *                    a norm of 0; a group with count == 0 is allowed.
 *   comm             NULL: this process alone. Otherwise every rank of the
 *                    communicator calls with the tensors it owns (DESIGN
 *                    §5: each element of the model passed by exactly one
 *                    rank) and the same ngroups and options; every rank
 *                    gets the same bits as one process holding all the
 *                    tensors. Two collectives: a tiny MAX agreement step
 *                    (accumulator format, ngroups, options: BX_EMISMATCH on
 *                    every rank if they differ) and one fixed-size
 *                    collective of ngroups * BX_ACC_WORDS int64 words (SUM;
 *                    for p = +-inf, 2 words per group with MAX; p = 0, 2
 *                    words with SUM), independent of the tensor count. A
 *                    failing all-reduce gives BX_ECOMM. With
 *                    error_if_nonfinite, every rank fails with
 *                    BX_ENONFINITE naming the first (rank, group, tensor)
 *                    that holds a NaN/Inf. comm->struct_size must be
 *                    sizeof(bx_comm) (BX_COMM_DEFAULT or an adapter); a
 *                    wrong one fails with BX_EINVAL before any collective
 *                    (see bx_comm).
 *   opts             NULL = BX_NORM_OPTS_DEFAULT; else opts->struct_size
 *                    must be sizeof(bx_norm_opts) (BX_EINVAL otherwise:
 *                    "Struct sizes" above).
 *   total_norm       out, required. For p = 2 and BX_EXACT: the correctly
 *                    rounded sqrt of the exact sum of squares.
 *   group_norms      out, NULL or an array of ngroups doubles.
 * Outputs are written only on success. Tensors are only read. Runs on
 * opts->num_threads worker threads; thread-safe. */
BX_API bx_status bx_total_norm(const bx_group *groups, size_t ngroups,
                               const bx_comm *comm, const bx_norm_opts *opts,
                               double *total_norm, double *group_norms);

/* What a norm call decided, for callers that let the library choose:
 * bx_total_norm_info's out struct. Set struct_size (BX_NORM_INFO_DEFAULT);
 * the other fields are written on success. New fields go at the end. */
typedef struct bx_norm_info {
  size_t struct_size; /* sizeof(bx_norm_info): see "Struct sizes" above */
  /* the format the norms were rounded into: opts->norm_dtype, with
   * BX_NORM_GRADS resolved from the dtypes of every tensor of every rank
   * (the same on every rank, also on a rank that passed no tensor); never
   * BX_NORM_GRADS */
  bx_norm_dtype norm_dtype;
} bx_norm_info;

#define BX_NORM_INFO_DEFAULT {sizeof(bx_norm_info), BX_NORM_F64}

/* bx_total_norm, also telling which format the norms were rounded into
 * (info->norm_dtype): what a binding needs to return the norm in the
 * gradients' dtype (BX_NORM_GRADS) when some rank holds no gradient, or
 * holds other dtypes than this one. info: out, required, info->struct_size
 * must be sizeof(bx_norm_info) (BX_EINVAL otherwise, before any collective
 * on this rank; the others then fail in the agreement step). Everything
 * else as bx_total_norm: same collectives, same bits, outputs written
 * only on success. Thread-safe. */
BX_API bx_status bx_total_norm_info(const bx_group *groups, size_t ngroups,
                                    const bx_comm *comm, const bx_norm_opts *opts,
                                    double *total_norm, double *group_norms,
                                    bx_norm_info *info);

/* Multiply every element of every tensor by coef, in place, with the
 * rounding of opts->mode (see bx_scale_mode). Tensors must be writable,
 * any strides (see Layouts above: each logical element written once, the
 * bytes between them untouched); their logical elements must not overlap
 * each other's or their own (BX_ELAYOUT otherwise, naming them).
 * coef must not be NaN (BX_EINVAL). opts: NULL = BX_SCALE_OPTS_DEFAULT;
 * else opts->struct_size must be sizeof(bx_scale_opts) (BX_EINVAL). Any
 * dtype mix in one call. All checks happen before any write: on error
 * nothing is modified. Tensors are borrowed for the call. Multi-threaded;
 * the result never depends on the thread count; thread-safe. */
BX_API bx_status bx_scale(DLTensor *tensors, size_t count, double coef,
                          const bx_scale_opts *opts);

/* torch.nn.utils.clip_grad_norm_: computes the total norm as bx_total_norm,
 * then, if max_norm > 0, coef per opts->formula (clamped to 1), and scales
 * every tensor of every group by coef with bx_scale's rounding (skipping
 * the writes when coef == 1 exactly). max_norm == 0 disables clipping (the
 * norm is still computed and returned; coef = 1). Negative or NaN max_norm
 * → BX_EINVAL. A NaN/Inf total norm without error_if_nonfinite gives a NaN
 * or 0 coefficient exactly as torch would compute it.
 *   comm        as bx_total_norm (struct_size checked before any collective).
 *   opts        NULL = BX_CLIP_OPTS_DEFAULT; else opts->struct_size,
 *               opts->norm.struct_size and opts->scale.struct_size must be
 *               the sizeofs of this library (BX_EINVAL otherwise: "Struct
 *               sizes" above; build it from BX_CLIP_OPTS_DEFAULT).
 *   total_norm  out, required;   coef  out, NULL or the coefficient used.
 * The tensors in groups are modified in place (the DLTensor structs are
 * const, their data is not; both are borrowed for the call). All-or-nothing:
 * on any error no gradient and no output is modified. Thread-safe. */
BX_API bx_status bx_clip_grad_norm(const bx_group *groups, size_t ngroups,
                                   const bx_comm *comm, double max_norm,
                                   const bx_clip_opts *opts, double *total_norm,
                                   double *coef);

/* The clip coefficient bx_clip_grad_norm uses for a given total norm:
 * 1 when max_norm == 0; BX_EINVAL for negative/NaN max_norm, a NULL coef,
 * or a wrong struct_size in opts (as bx_clip_grad_norm; NULL = defaults).
 * *coef is written only on success. Thread-safe. */
BX_API bx_status bx_clip_coef(double total_norm, double max_norm,
                              const bx_clip_opts *opts, double *coef);

/* ------------------------------------------------------------------------
 * The accumulator (DESIGN §3)
 *
 * A bx_acc is a signed fixed-point number with BX_ACC_DIGITS digits of 32
 * bits, digit i weighing 2^(32*i + BX_ACC_LSB_EXP), each held in an int64
 * word (carry-save), plus counters. Its range covers every square and
 * every absolute value of every fp64 number, subnormals included:
 * 2^-2176 .. beyond 2^2140, so a sum of up to 2^63 squares of DBL_MAX
 * neither overflows nor loses its smallest term.
 *
 * Normalised form: digit[i] in [0, 2^32) for i < BX_ACC_DIGITS-1, the top
 * digit holds the rest (signed); every function that writes a bx_acc leaves
 * it normalised. The words are the wire format: the word-by-word int64 sum
 * of up to 2^31 normalised accumulators (each non-negative — all of the
 * library's accumulators hold sums of squares or absolute values) is a
 * valid accumulator of the total: each lower digit sum stays below
 * 2^31 * (2^32 - 1) < 2^63, the counters and the top digit are far from
 * overflow for any realistic element count (< 2^62 in all), and
 * bx_acc_merge / bx_acc_value accept such un-normalised words. So MPI_SUM
 * on MPI_INT64_T, ncclSum on ncclInt64 or torch's all_reduce(SUM) on an
 * int64 tensor of BX_ACC_WORDS words, in any order, is exact.
 *
 * The version word holds BX_ACC_VERSION_TAG times the number of
 * accumulators summed into it (naccs), so a sum of accumulators from
 * different builds is detected (bx_acc_check). A plain struct: copy it,
 * memset it, send it; it owns no memory.
 * ---------------------------------------------------------------------- */
#define BX_ACC_DIGITS 134
#define BX_ACC_LSB_EXP (-2176)
#define BX_ACC_FORMAT 1 /* bump when the layout or scaling changes */
/* < 2^31, so that the tag times 2^31 accumulators still fits an int64 */
#define BX_ACC_VERSION_TAG (0x62780000LL + BX_ACC_FORMAT)
#define BX_ACC_WORDS (BX_ACC_DIGITS + 5)

typedef struct bx_acc {
  int64_t digit[BX_ACC_DIGITS]; /* fixed-point digits, least significant first */
  int64_t nan_count;            /* NaN elements seen */
  int64_t inf_count;            /* ±Inf elements seen */
  int64_t count;                /* elements seen (NaN/Inf included) */
  int64_t naccs;                /* accumulators summed into this one (1 after init) */
  int64_t version;              /* BX_ACC_VERSION_TAG * naccs */
} bx_acc;

/* Set acc to zero (naccs 1, version tag). Cannot fail. */
BX_API void bx_acc_init(bx_acc *acc);

/* acc += sum of x*x over every element of t (exact); NaN/Inf elements are
 * counted in nan_count/inf_count and not summed. Single-threaded in the
 * calling thread. On error acc is unchanged. */
BX_API bx_status bx_acc_add_squares(bx_acc *acc, const DLTensor *t);

/* acc += sum of |x| over every element of t (exact); as above. */
BX_API bx_status bx_acc_add_abs(bx_acc *acc, const DLTensor *t);

/* into += from, word by word, then normalise into (from may be
 * un-normalised, e.g. the result of an all-reduce). into may equal from. */
BX_API void bx_acc_merge(bx_acc *into, const bx_acc *from);

/* Normalise in place (digits in [0, 2^32), carries into the top digit).
 * Useful after summing words by hand. */
BX_API void bx_acc_normalize(bx_acc *acc);

/* BX_OK if acc's version word matches this build and naccs >= 1, else
 * BX_EMISMATCH with a message. */
BX_API bx_status bx_acc_check(const bx_acc *acc);

/* The reads below follow DESIGN §2's non-finite rules: NaN if any NaN was
 * counted (nan_count > 0); otherwise +Inf if any +-Inf was counted
 * (inf_count > 0); otherwise the exact sum held, correctly rounded (nearest,
 * ties to even; +-Inf past the format's largest finite value). Never a
 * finite number that silently leaves out a NaN/Inf element. acc may be
 * un-normalised (the words after an all-reduce); it is not modified.
 * Thread-safe; acc is only read. */

/* The sum, rounded to double. */
BX_API double bx_acc_value(const bx_acc *acc);

/* The sum, rounded to float. */
BX_API float bx_acc_valuef(const bx_acc *acc);

/* The square root of the sum, correctly rounded to double / float (NaN if
 * the sum is negative, never the case for sums of squares). */
BX_API double bx_acc_sqrt(const bx_acc *acc);
BX_API float bx_acc_sqrtf(const bx_acc *acc);

/* The norm an accumulator holds, rounded once into a chosen dtype: for
 * norm_type 2 (acc holds squares: bx_acc_add_squares) the correctly
 * rounded square root of the sum, for norm_type 1 (bx_acc_add_abs) the
 * correctly rounded sum, with the non-finite rules above. acc may be the
 * un-normalised words after an all-reduce of several ranks' accumulators.
 *   dtype  fp64, fp32, bf16 or fp16 (DLPack codes, lanes 1): BX_EDTYPE
 *          otherwise; norm_type other than 1 or 2: BX_EINVAL; a version
 *          word that does not match (bx_acc_check): BX_EMISMATCH.
 *   out    the norm's bits in dtype (8, 4 or 2 bytes, any alignment),
 *          written only on success.
 * Thread-safe; acc is only read. */
BX_API bx_status bx_acc_norm(const bx_acc *acc, double norm_type, DLDataType dtype, void *out);

/* Exact comparison of the sums held by two accumulators: -1, 0, 1. */
BX_API int bx_acc_compare(const bx_acc *a, const bx_acc *b);

#ifdef __cplusplus
}
#endif
#endif /* BITEXACT_H */
