/*
 * wgrad.c — weight gradients over tokens (bitexact_train.h, "Weight
 * gradients over tokens"): the bias-gradient chunk partials, the a-priori
 * exponent bound of a TN chunk partial and its state call, and
 * bx_linear_wgrad, which runs the TN GEMM (gemm.c) per chunk with an
 * epilogue that rounds each finished block of the partial onto the token
 * reduction's grid (tokred_internal.h, kernels.h's grid kernel) while the
 * block is still in cache.
 */
#include <stdint.h>
#include <string.h>

#include "abi.h"
#include "call.h"
#include "error.h"
#include "gemm_internal.h"
#include "kernels.h"
#include "nan_canon.h"
#include "pool.h"
#include "tokred_grid.h"
#include "tokred_internal.h"
#include "train_check.h"
#include "train_device.h"
#include "workspace.h"

#if defined(__GNUC__) && !defined(__clang__)
#define BX_VECTORIZE __attribute__((optimize("tree-vectorize", "vect-cost-model=dynamic")))
#else
#define BX_VECTORIZE
#endif

/* ---- the a-priori bound --------------------------------------------------- */

/* x (>= 0) times (1 + 2^-50): above the exact value of the operation whose
 * rounded result is x (one rounding, relative error <= 2^-53). */
static double up(double x) { return x * (1.0 + 0x1p-50); }

int bx_wgrad_bound_exp(int64_t rows, float max_abs_a, float max_abs_b) {
  double ma = max_abs_a < 0 ? -(double)max_abs_a : (double)max_abs_a;
  double mb = max_abs_b < 0 ? -(double)max_abs_b : (double)max_abs_b;
  if (ma != ma || mb != mb || ma > 0x1p128 || mb > 0x1p128) return BX_TOKRED_EMAX; /* NaN, Inf */
  if (rows <= 0 || ma == 0.0 || mb == 0.0) return BX_TOKRED_EMIN;
  /* (1 + 2^-24)^rows, every product rounded upward by up() */
  double f = 1.0, base = 1.0 + 0x1p-24;
  for (uint64_t e = (uint64_t)rows; e; e >>= 1) {
    if (e & 1) f = up(f * base);
    if (e > 1) base = up(base * base);
  }
  double p = ma * mb;                   /* exact: 24 + 24 bits */
  double b = up(p + 0x1p-150);          /* max|a| max|b| + 2^-150 */
  b = up(up(b * (double)rows) * f);     /* (double)rows: < 2^63, rounded: covered by up */
  if (!(b < 0x1p128)) return BX_TOKRED_EMAX;
  uint64_t bits;
  memcpy(&bits, &b, sizeof bits);
  int be = (int)(bits >> 52);           /* b >= 2^-150 * rows > 0: normal double */
  int E = be - 1022;                    /* b < 2^(be - 1022) */
  return E < BX_TOKRED_EMIN ? BX_TOKRED_EMIN : E > BX_TOKRED_EMAX ? BX_TOKRED_EMAX : E;
}

/* ---- small helpers -------------------------------------------------------- */

static size_t rows_of(const gemm_operand *o) { return o->ndim == 3 ? o->dim[0] * o->dim[1] : o->dim[0]; }
static size_t cols_of(const gemm_operand *o) { return o->dim[o->ndim - 1]; }

static float bf16_to_f32(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

/* Largest finite |x| over rows [r0, r1) of a [rows, cols] operand, as fp32. */
BX_VECTORIZE static float max_finite_abs_rows(const gemm_operand *o, size_t r0, size_t r1) {
  size_t cols = cols_of(o), n = (r1 - r0) * cols;
  uint32_t mx = 0;
  if (o->dt == BX_DT_BF16) {
    const uint16_t *p = (const uint16_t *)o->data + r0 * cols;
    for (size_t i = 0; i < n; i++) {
      uint32_t ab = (uint32_t)(p[i] & 0x7fffu) << 16;
      ab &= -(uint32_t)(ab < 0x7f800000u);
      mx = ab > mx ? ab : mx;
    }
  } else {
    mx = bx_tokred_kernels_active()->max_abs((const float *)o->data + r0 * cols, n);
  }
  float f;
  memcpy(&f, &mx, sizeof f);
  return f;
}

/* out[c0..c1) = column sums of rows [r0, r1) of dy (cols wide), each
 * column acc = +0, then acc = acc + dy[r][c] for r ascending. The loop runs
 * across columns (independent chains), so vectorising changes no bit. */
BX_VECTORIZE static void colsum(const gemm_operand *dy, size_t r0, size_t r1, size_t c0, size_t c1,
                                float *restrict out) {
  size_t cols = cols_of(dy), w = c1 - c0;
  for (size_t c = 0; c < w; c++) out[c] = 0.0f;
  if (dy->dt == BX_DT_BF16) {
    for (size_t r = r0; r < r1; r++) {
      const uint16_t *row = (const uint16_t *)dy->data + r * cols + c0;
      for (size_t c = 0; c < w; c++) out[c] = out[c] + bf16_to_f32(row[c]);
    }
  } else {
    for (size_t r = r0; r < r1; r++) {
      const float *row = (const float *)dy->data + r * cols + c0;
      for (size_t c = 0; c < w; c++) out[c] = out[c] + row[c];
    }
  }
}

/* struct_size (first), num_threads (0: the default, at most BX_MAX_THREADS),
 * then the call is entered. */
static bx_status enter(bx_call *call, const char *fn, const bx_wgrad_opts *opts, int *threads) {
  if (opts) {
    bx_status st = bx_check_struct_size(fn, "opts->struct_size", opts->struct_size, sizeof *opts,
                                        "bx_wgrad_opts", "BX_WGRAD_OPTS_DEFAULT");
    if (st != BX_OK) return st;
  }
  int t = opts ? opts->num_threads : 0;
  if (t < 0) return bx_fail(BX_EINVAL, "%s: num_threads %d is negative", fn, t);
  *threads = t > 0 ? t : bx_default_threads();
  if (*threads > BX_MAX_THREADS) *threads = BX_MAX_THREADS;
  return bx_call_enter(call, fn);
}

/* ---- bias partials ------------------------------------------------------------ */

#define COLBLOCK 1024 /* columns per piece: the accumulators stay in L1 */

typedef struct colsum_job {
  const gemm_operand *dy;
  float *out;
  size_t t, n, c, ncb; /* rows, columns, chunk rows, column blocks */
} colsum_job;

static void colsum_task(void *ctx, size_t task, int worker) {
  (void)worker;
  const colsum_job *j = ctx;
  size_t chunk = task / j->ncb, c0 = task % j->ncb * COLBLOCK;
  size_t c1 = j->n - c0 < COLBLOCK ? j->n : c0 + COLBLOCK;
  size_t r0 = chunk * j->c, r1 = j->t - r0 < j->c ? j->t : r0 + j->c;
  float *out = j->out + chunk * j->n + c0;
  colsum(j->dy, r0, r1, c0, c1, out);
  bx_canon_f32_n(out, c1 - c0); /* a stored NaN is the canonical one (docs/design.md, NaN) */
}

bx_status bx_bias_grad_partials(const DLTensor *dy, int64_t chunk_tokens, DLTensor *partials,
                                const bx_wgrad_opts *opts) {
  static const char *fn = "bx_bias_grad_partials";
  int threads;
  bx_call call;
  bx_status st = enter(&call, fn, opts, &threads);
  if (st != BX_OK) return st;
  gemm_operand D, P;
  /* both operands on the device: its kernel (a kDLCUDA operand names the
   * device, else managed dy's id); a mixed call takes the host path,
   * which names its first device tensor */
  int cuda = dy && partials && bx_tc_on_device(dy) && bx_tc_on_device(partials) ? 1 : 0;
  int device = !cuda ? -1
               : partials->device.device_type == kDLCUDA ? partials->device.device_id
                                                          : dy->device.device_id;
  st = bx_gemm_check_operand_in(fn, "dy", dy, 3, 0, device, &D);
  if (st == BX_OK) st = bx_gemm_check_operand_in(fn, "partials", partials, 2, 1, device, &P);
  size_t t = 0, n = 0, nch = 0;
  if (st == BX_OK && chunk_tokens < 1)
    st = bx_fail(BX_EINVAL, "%s: chunk_tokens %lld must be >= 1", fn, (long long)chunk_tokens);
  if (st == BX_OK) {
    t = rows_of(&D);
    n = cols_of(&D);
    nch = t / (size_t)chunk_tokens + (t % (size_t)chunk_tokens != 0);
    if (P.dim[0] != nch || P.dim[1] != n)
      st = bx_fail(BX_EINVAL, "%s: tensor partials is [%zu, %zu]; want [nchunks = %zu, N = %zu] "
                   "(%zu rows of dy in chunks of %lld)", fn, P.dim[0], P.dim[1], nch, n, t,
                   (long long)chunk_tokens);
  }
  if (st == BX_OK && bx_gemm_overlaps(&P, &D))
    st = bx_fail(BX_ELAYOUT, "%s: tensor partials overlaps dy", fn);
  if (st == BX_OK && nch && n && device >= 0) {
    const bx_train_device *dev;
    st = bx_train_cuda(fn, &dev);
    if (st == BX_OK)
      st = dev->bias_partials(fn, device, D.data, D.dt == BX_DT_BF16, t, n, (size_t)chunk_tokens,
                              nch, (float *)P.data);
  } else if (st == BX_OK && nch && n) {
    size_t ncb = (n + COLBLOCK - 1) / COLBLOCK;
    colsum_job j = {&D, (float *)P.data, t, n, (size_t)chunk_tokens, ncb};
    size_t ntasks = nch * ncb;
    bx_parallel_run(ntasks < (size_t)threads ? (int)ntasks : threads, ntasks, colsum_task, &j);
  }
  bx_call_leave(&call);
  return st;
}

/* ---- the state calls: shared checks -------------------------------------------- */

typedef struct wg_args {
  gemm_operand D, X;
  size_t t, n, k;          /* local rows, columns of dy, columns of x */
  int64_t cb, ce;          /* the local chunks */
  int threads;
  int cuda;                /* -1: host operands; else the CUDA device of dy and x */
} wg_args;

static bx_status check_state_tensor(const char *fn, const bx_tokred *s, size_t idx,
                                    const char *what, int ndim, size_t d0, size_t d1) {
  if (idx == BX_WGRAD_NONE) return BX_OK;
  if (idx >= s->ntensors)
    return bx_fail(BX_EINVAL, "%s: %s tensor %zu does not exist (the state has %zu)", fn, what,
                   idx, s->ntensors);
  const int64_t *sh = s->shape + s->shape_at[idx];
  int ok = s->ndim[idx] == ndim && (uint64_t)sh[0] == d0 && (ndim == 1 || (uint64_t)sh[1] == d1);
  if (!ok) {
    if (ndim == 2)
      return bx_fail_at(BX_ELAYOUT, -1, BX_NO_INDEX, idx,
                        "%s: %s tensor %zu is not [N = %zu, K = %zu] (dy's and x's columns)", fn,
                        what, idx, d0, d1);
    return bx_fail_at(BX_ELAYOUT, -1, BX_NO_INDEX, idx,
                      "%s: %s tensor %zu is not [N = %zu] (dy's columns)", fn, what, idx, d0);
  }
  return BX_OK;
}

static bx_status wg_checks(const char *fn, const bx_tokred *s, size_t wt, size_t bt,
                           const DLTensor *dy, const DLTensor *x, int64_t token_begin,
                           wg_args *g) {
  if (!s) return bx_fail(BX_EINVAL, "%s: s is NULL", fn);
  if (wt == BX_WGRAD_NONE && bt == BX_WGRAD_NONE)
    return bx_fail(BX_EINVAL, "%s: w_tensor and b_tensor are both BX_WGRAD_NONE", fn);
  if (wt == bt) return bx_fail(BX_EINVAL, "%s: w_tensor and b_tensor are both %zu", fn, wt);
  /* every operand a CUDA tensor: the device's kernels (train_device.h);
   * a mixed call takes the host path, which names its first device tensor */
  int cuda = dy && bx_tc_on_device(dy) && (wt == BX_WGRAD_NONE || (x && bx_tc_on_device(x)));
  g->cuda = -1;
  if (cuda) /* a kDLCUDA operand names the device, else managed dy's id */
    g->cuda = x && x->device.device_type == kDLCUDA ? x->device.device_id : dy->device.device_id;
  bx_status st = bx_gemm_check_operand_in(fn, "dy", dy, 3, 0, g->cuda, &g->D);
  if (st != BX_OK) return st;
  g->t = rows_of(&g->D);
  g->n = cols_of(&g->D);
  g->k = 0;
  if (wt != BX_WGRAD_NONE) {
    st = bx_gemm_check_operand_in(fn, "x", x, 3, 0, g->cuda, &g->X);
    if (st != BX_OK) return st;
    if (rows_of(&g->X) != g->t)
      return bx_fail(BX_EINVAL, "%s: dy has %zu rows (tokens) but x has %zu", fn, g->t,
                     rows_of(&g->X));
    g->k = cols_of(&g->X);
  }
  st = check_state_tensor(fn, s, wt, "w_tensor: weight", 2, g->n, g->k);
  if (st == BX_OK) st = check_state_tensor(fn, s, bt, "b_tensor: bias", 1, g->n, 0);
  if (st != BX_OK) return st;
  if (token_begin < 0 || (uint64_t)token_begin + g->t > (uint64_t)s->total_tokens ||
      bx_tokred_chunks(s, token_begin, token_begin + (int64_t)g->t, &g->cb, &g->ce) != BX_OK)
    return bx_fail(BX_ELAYOUT, "%s: the local rows are global tokens [%lld, %lld) of %lld in "
                   "chunks of %lld: not whole chunks of the batch", fn, (long long)token_begin,
                   (long long)(token_begin + (int64_t)g->t), (long long)s->total_tokens,
                   (long long)s->chunk_tokens);
  return BX_OK;
}

/* local rows of chunk c */
static void chunk_rows(const bx_tokred *s, const wg_args *g, int64_t token_begin, int64_t c,
                       size_t *r0, size_t *r1) {
  int64_t b = c * s->chunk_tokens - token_begin, e = b + s->chunk_tokens;
  if (b < 0) b = 0;
  if (e > (int64_t)g->t) e = (int64_t)g->t;
  *r0 = (size_t)b;
  *r1 = (size_t)e;
}

/* ---- the bound from the inputs --------------------------------------------------- */

/* chunk cb + task: its weight and bias exponents into e[2 task], e[2 task + 1] */
typedef struct bound_job {
  const bx_tokred *s;
  const wg_args *g;
  size_t wt;
  int64_t token_begin;
  int *e;
} bound_job;

static void bound_task(void *ctx, size_t task, int worker) {
  (void)worker;
  const bound_job *j = ctx;
  size_t r0, r1;
  chunk_rows(j->s, j->g, j->token_begin, j->g->cb + (int64_t)task, &r0, &r1);
  float ma = max_finite_abs_rows(&j->g->D, r0, r1);
  j->e[2 * task] = j->wt == BX_WGRAD_NONE ? BX_TOKRED_EMIN
                   : bx_wgrad_bound_exp((int64_t)(r1 - r0), ma,
                                        max_finite_abs_rows(&j->g->X, r0, r1));
  j->e[2 * task + 1] = bx_wgrad_bound_exp((int64_t)(r1 - r0), ma, 1.0f);
}

/* The bound on CUDA operands: each chunk's largest finite |dy| and |x|
 * from the device (the same maxima), the exponents here, as bound_task. */
static bx_status bound_cuda(const char *fn, bx_tokred *s, size_t wt, size_t bt, const wg_args *g) {
  const bx_train_device *dev;
  bx_status st = bx_train_cuda(fn, &dev);
  if (st != BX_OK) return st;
  size_t nch = (size_t)(g->ce - g->cb), C = (size_t)s->chunk_tokens;
  uint32_t *mx = bx_workspace(2 * nch * sizeof(uint32_t));
  if (!mx) return bx_fail(BX_ENOMEM, "%s: cannot allocate %zu chunk maxima", fn, 2 * nch);
  uint32_t *mdy = mx, *mxx = mx + nch;
  st = dev->tokred_maxabs(fn, g->cuda, g->D.data, g->D.dt == BX_DT_BF16, g->t, g->n, C, mdy);
  if (st == BX_OK && wt != BX_WGRAD_NONE)
    st = dev->tokred_maxabs(fn, g->cuda, g->X.data, g->X.dt == BX_DT_BF16, g->t, g->k, C, mxx);
  if (st != BX_OK) return st;
  int ew = BX_TOKRED_EMIN, eb = BX_TOKRED_EMIN;
  for (size_t c = 0; c < nch; c++) {
    int64_t rows = (int64_t)(g->t - c * C < C ? g->t - c * C : C);
    float ma, mb;
    memcpy(&ma, &mdy[c], sizeof ma);
    if (wt != BX_WGRAD_NONE) {
      memcpy(&mb, &mxx[c], sizeof mb);
      int e = bx_wgrad_bound_exp(rows, ma, mb);
      ew = e > ew ? e : ew;
    }
    int e = bx_wgrad_bound_exp(rows, ma, 1.0f);
    eb = e > eb ? e : eb;
  }
  if (wt != BX_WGRAD_NONE && ew > s->bound[wt]) s->bound[wt] = ew;
  if (bt != BX_WGRAD_NONE && eb > s->bound[bt]) s->bound[bt] = eb;
  return BX_OK;
}

bx_status bx_linear_wgrad_bound(bx_tokred *s, size_t wt, size_t bt, const DLTensor *dy,
                                const DLTensor *x, int64_t token_begin,
                                const bx_wgrad_opts *opts) {
  static const char *fn = "bx_linear_wgrad_bound";
  wg_args g;
  bx_call call;
  bx_status st = enter(&call, fn, opts, &g.threads);
  if (st != BX_OK) return st;
  st = wg_checks(fn, s, wt, bt, dy, x, token_begin, &g);
  if (st == BX_OK && s->agreed)
    st = bx_fail(BX_EINVAL, "%s: the grid is already agreed (bounds come before "
                 "bx_tokred_agree)", fn);
  if (st == BX_OK && s->mode == BX_TOKRED_GRID && g.cb < g.ce && g.cuda >= 0) {
    st = bound_cuda(fn, s, wt, bt, &g);
  } else if (st == BX_OK && s->mode == BX_TOKRED_GRID && g.cb < g.ce) {
    size_t nch = (size_t)(g.ce - g.cb);
    int *e = bx_workspace(2 * nch * sizeof(int));
    if (!e) st = bx_fail(BX_ENOMEM, "%s: cannot allocate %zu chunk bounds", fn, nch);
    if (st == BX_OK) {
      bound_job j = {s, &g, wt, token_begin, e};
      bx_parallel_run(nch < (size_t)g.threads ? (int)nch : g.threads, nch, bound_task, &j);
      int ew = BX_TOKRED_EMIN, eb = BX_TOKRED_EMIN;
      for (size_t c = 0; c < nch; c++) {
        ew = e[2 * c] > ew ? e[2 * c] : ew;
        eb = e[2 * c + 1] > eb ? e[2 * c + 1] : eb;
      }
      if (wt != BX_WGRAD_NONE && ew > s->bound[wt]) s->bound[wt] = ew;
      if (bt != BX_WGRAD_NONE && eb > s->bound[bt]) s->bound[bt] = eb;
    }
  }
  bx_call_leave(&call);
  return st;
}

/* ---- compute and add --------------------------------------------------------------- */

typedef struct wg_slot {
  uint32_t mx;
  int64_t nf;
  char pad[48]; /* one cache line per worker */
} wg_slot;

typedef struct wg_epi {
  int grid;
  int64_t *w;   /* the weight's grid words */
  float *f;     /* ordinary mode: its fp32 sums */
  size_t ld;    /* K */
  double inv;
  bx_tokred_grid_fn add;
  wg_slot *slot;
} wg_epi;

static void wg_epilogue(void *ctx, int worker, float *c, size_t ldc, size_t k0, size_t row0,
                        size_t col0, size_t rows, size_t cols) {
  (void)k0; /* every chunk adds into the same words (coverage is counted after the run) */
  const wg_epi *e = ctx;
  wg_slot *sl = &e->slot[worker];
  for (size_t r = 0; r < rows; r++) {
    size_t at = (row0 + r) * e->ld + col0;
    if (e->grid) {
      int64_t nf;
      uint32_t mx = e->add(e->w + at, c + r * ldc, cols, e->inv, &nf);
      sl->mx = mx > sl->mx ? mx : sl->mx;
      sl->nf += nf;
    } else {
      sl->nf += bx_tokred_plain_add(e->f + at, c + r * ldc, cols);
    }
  }
}

static void make_view(DLTensor *v, int64_t *shp, const gemm_operand *o, size_t r0, size_t r1) {
  memset(v, 0, sizeof *v);
  size_t es = o->dt == BX_DT_BF16 ? 2 : 4;
  shp[0] = (int64_t)(r1 - r0);
  shp[1] = (int64_t)cols_of(o);
  v->data = (void *)(uintptr_t)((const char *)o->data + r0 * cols_of(o) * es);
  v->device.device_type = kDLCPU;
  v->ndim = 2;
  v->dtype.code = o->dt == BX_DT_BF16 ? kDLBfloat : kDLFloat;
  v->dtype.bits = (uint8_t)(es * 8);
  v->dtype.lanes = 1;
  v->shape = shp;
}

/* Rows of C per block in the chunked product: its fp32 block and its
 * int64 words (96 x 1024 x 12 bytes) stay in L2 across a group's chunks. */
#define WG_MC 96
#define WG_GROUP_BYTES ((size_t)8 << 20)

/* The TN product of rows [r0, r1) into part (N x K): with chunk > 0 and
 * epi, the partial of every chunk of chunk rows, each handed to epi. */
static bx_status tn_partial(const char *fn, const wg_args *g, size_t r0, size_t r1, float *part,
                            size_t chunk, wg_epi *epi) {
  DLTensor a, b, c;
  int64_t sa[2], sb[2], sc[2] = {(int64_t)g->n, (int64_t)g->k};
  make_view(&a, sa, &g->D, r0, r1);
  make_view(&b, sb, &g->X, r0, r1);
  memset(&c, 0, sizeof c);
  c.data = part;
  c.device.device_type = kDLCPU;
  c.ndim = 2;
  c.dtype.code = kDLFloat;
  c.dtype.bits = 32;
  c.dtype.lanes = 1;
  c.shape = sc;
  bx_gemm_opts o = BX_GEMM_OPTS_DEFAULT;
  o.num_threads = g->threads;
  /* group the chunks only when the words of the whole weight (with its
   * fp32 partial: 12 bytes an element) are far beyond the caches; below
   * that, re-reading B per mc block of a group measured slower */
  size_t gt = g->n * g->k * 12 > WG_GROUP_BYTES ? BX_GEMM_GROUP_TOKENS : 0;
  bx_gemm_blocking blk = {WG_MC, 0, 0, chunk, gt};
  return bx_gemm_fused(fn, &a, &b, BX_GEMM_TN, &c, &o, chunk ? &blk : NULL,
                       epi ? wg_epilogue : NULL, epi);
}

/* Subtracts the weight words of every chunk of the call (wt) and the bias
 * words of chunks [cb, b_end) again: each partial recomputed (the same
 * bits) and taken off by the scalar rule. */
static void undo(const char *fn, bx_tokred *s, size_t wt, size_t bt, const wg_args *g,
                 int64_t token_begin, int64_t b_end, float *part, float *bpart) {
  for (int64_t c = g->cb; c < g->ce; c++) {
    size_t r0, r1;
    chunk_rows(s, g, token_begin, c, &r0, &r1);
    if (wt != BX_WGRAD_NONE && g->n && g->k && tn_partial(fn, g, r0, r1, part, 0, NULL) == BX_OK)
      bx_tokred_grid_sub(s->words + s->word_at[wt], part, g->n * g->k,
                         bx_tokred_pow2(-s->grid[wt]));
    if (bt != BX_WGRAD_NONE && c < b_end) {
      colsum(&g->D, r0, r1, 0, g->n, bpart);
      bx_tokred_grid_sub(s->words + s->word_at[bt], bpart, g->n, bx_tokred_pow2(-s->grid[bt]));
    }
  }
}

/* Non-finite counts, observations (grid mode) and coverage of a call
 * whose adds stand (the host's and the device's commit). */
static void commit(bx_tokred *s, size_t wt, size_t bt, const wg_args *g, int64_t nf_w,
                   int64_t nf_b, uint32_t mx_w, uint32_t mx_b) {
  int grid = s->mode == BX_TOKRED_GRID;
  size_t nk = g->n * g->k;
  for (int which = 0; which < 2; which++) {
    size_t t = which ? bt : wt;
    if (t == BX_WGRAD_NONE) continue;
    s->words[s->word_at[t] + (size_t)s->numel[t]] += which ? nf_b : nf_w;
    if (grid && (which ? g->n > 0 : nk > 0)) bx_tokred_observe(s, t, which ? mx_b : mx_w);
    for (int64_t c = g->cb; c < g->ce; c++) s->words[s->cover_at + t * (size_t)s->nchunks + (size_t)c] += 1;
  }
}

/* wgrad_impl on CUDA operands. Grid mode: the device computes every
 * chunk's partials and rounds them onto the grids in the GEMM's epilogue
 * (tokred.cu), and the summed q words come back here, added to the state
 * only when the call stands (s unchanged on error, nothing to undo); a
 * breaking element's message needs its chunk's partial, which the device
 * computes again. Ordinary mode: each chunk's partials come to the host
 * and are added in fp32 in chunk order, as the CPU adds them. */
static bx_status wgrad_cuda(const char *fn, bx_tokred *s, size_t wt, size_t bt, wg_args *g) {
  const bx_train_device *dev;
  bx_status st = bx_train_cuda(fn, &dev);
  if (st != BX_OK) return st;
  int grid = s->mode == BX_TOKRED_GRID;
  size_t nk = g->n * g->k, nch = (size_t)(g->ce - g->cb);
  bx_tokred_dev_wgrad w;
  memset(&w, 0, sizeof w);
  w.dy = g->D.data;
  w.x = wt != BX_WGRAD_NONE ? g->X.data : NULL;
  w.dy_bf16 = g->D.dt == BX_DT_BF16;
  w.x_bf16 = wt != BX_WGRAD_NONE && g->X.dt == BX_DT_BF16;
  w.t = g->t;
  w.n = g->n;
  w.k = g->k;
  w.chunk = (size_t)s->chunk_tokens;
  w.nchunks = nch;
  w.do_w = wt != BX_WGRAD_NONE && nk > 0;
  w.do_b = bt != BX_WGRAD_NONE && g->n > 0;
  if (w.do_w) {
    w.inv_w = bx_tokred_pow2(-s->grid[wt]);
    w.lim_w = bx_tokred_abs_limit(s->bound[wt]);
  }
  if (w.do_b) {
    w.inv_b = bx_tokred_pow2(-s->grid[bt]);
    w.lim_b = bx_tokred_abs_limit(s->bound[bt]);
  }
  size_t nw = w.do_w ? nk : 0, nb = w.do_b ? g->n : 0;
  if (nw > (SIZE_MAX / 16 - nb) / 2) return bx_fail(BX_ENOMEM, "%s: the partial is too large", fn);
  /* grid: the q words [nw + nb] (int64), reused as the failing chunk's
   * partial; ordinary: two chunk partials and their running sums (fp32) */
  void *ws = bx_workspace((nw + nb) * 2 * sizeof(int64_t) + 64);
  if (!ws) return bx_fail(BX_ENOMEM, "%s: cannot allocate %zu bytes of host staging", fn,
                          (nw + nb) * 2 * sizeof(int64_t) + 64);
  int64_t nf_w = 0, nf_b = 0;
  if (grid) {
    int64_t *qw = ws, *qb = qw + nw;
    bx_tokred_dev_res rw, rb;
    st = dev->tokred_wgrad(fn, g->cuda, &w, qw, qb, &rw, &rb);
    if (st != BX_OK) return st;
    float *part = ws;
    if (w.do_w && bx_tokred_breaks(s, wt, rw.mx)) {
      st = dev->tokred_wgrad_chunk(fn, g->cuda, &w, (size_t)rw.bad, part, NULL);
      return st != BX_OK ? st : bx_tokred_bound_fail(fn, s, wt, g->cb + (int64_t)rw.bad, part, nk);
    }
    if (w.do_b && bx_tokred_breaks(s, bt, rb.mx)) {
      st = dev->tokred_wgrad_chunk(fn, g->cuda, &w, (size_t)rb.bad, NULL, part);
      return st != BX_OK ? st : bx_tokred_bound_fail(fn, s, bt, g->cb + (int64_t)rb.bad, part, g->n);
    }
    if (w.do_w) bx_tokred_words_add(s->words + s->word_at[wt], qw, nk);
    if (w.do_b) bx_tokred_words_add(s->words + s->word_at[bt], qb, g->n);
    commit(s, wt, bt, g, rw.nf, rb.nf, rw.mx, rb.mx);
    return BX_OK;
  }
  float *pw = ws, *pb = pw + nw, *fw = pb + nb, *fb = fw + nw;
  if (w.do_w) memcpy(fw, s->fsum + (s->word_at[wt] - wt), nw * sizeof(float));
  if (w.do_b) memcpy(fb, s->fsum + (s->word_at[bt] - bt), nb * sizeof(float));
  for (size_t c = 0; c < nch; c++) {
    st = dev->tokred_wgrad_chunk(fn, g->cuda, &w, c, w.do_w ? pw : NULL, w.do_b ? pb : NULL);
    if (st != BX_OK) return st;
    if (w.do_w) nf_w += bx_tokred_plain_add(fw, pw, nw);
    if (w.do_b) nf_b += bx_tokred_plain_add(fb, pb, nb);
  }
  if (w.do_w) memcpy(s->fsum + (s->word_at[wt] - wt), fw, nw * sizeof(float));
  if (w.do_b) memcpy(s->fsum + (s->word_at[bt] - bt), fb, nb * sizeof(float));
  commit(s, wt, bt, g, nf_w, nf_b, 0, 0);
  return BX_OK;
}

static bx_status wgrad_impl(const char *fn, bx_tokred *s, size_t wt, size_t bt, wg_args *g,
                            int64_t token_begin) {
  size_t nk = g->n * g->k;
  if (g->cb == g->ce) return BX_OK;
  if (g->cuda >= 0) return wgrad_cuda(fn, s, wt, bt, g);
  if (g->n && nk > (SIZE_MAX / sizeof(float) - g->n) / 2)
    return bx_fail(BX_ENOMEM, "%s: the partial is too large", fn);
  float *ws = bx_workspace((nk + g->n + 16) * sizeof(float));
  if (!ws) return bx_fail(BX_ENOMEM, "%s: cannot allocate %zu bytes for the partial", fn,
                          (nk + g->n + 16) * sizeof(float));
  float *part = ws, *bpart = ws + nk;
  int grid = s->mode == BX_TOKRED_GRID;
  static _Thread_local wg_slot slots[BX_MAX_THREADS];
  int64_t nf_w = 0, nf_b = 0;
  uint32_t mx_w = 0, mx_b = 0; /* observed (bx_tokred_observe at the commit) */
  /* the weight: one chunked TN product over all the local rows (they start
   * on a chunk boundary, so the segments of chunk_tokens rows are the
   * chunks), each block of each chunk added in the epilogue */
  if (wt != BX_WGRAD_NONE && nk) {
    memset(slots, 0, sizeof slots);
    wg_epi e = {grid, s->words + s->word_at[wt], grid ? NULL : s->fsum + (s->word_at[wt] - wt),
                g->k, grid ? bx_tokred_pow2(-s->grid[wt]) : 0.0,
                bx_tokred_kernels_active()->grid_add, slots};
    bx_status st = tn_partial(fn, g, 0, g->t, part, (size_t)s->chunk_tokens, &e);
    if (st != BX_OK) return st; /* not reached: the operands were checked */
    uint32_t mx = 0;
    for (int i = 0; i < BX_MAX_THREADS; i++) {
      mx = slots[i].mx > mx ? slots[i].mx : mx;
      nf_w += slots[i].nf;
    }
    mx_w = mx;
    if (grid && bx_tokred_breaks(s, wt, mx)) {
      /* find the chunk and element for the message, then take it all off */
      for (int64_t c = g->cb; c < g->ce; c++) {
        size_t r0, r1;
        chunk_rows(s, g, token_begin, c, &r0, &r1);
        tn_partial(fn, g, r0, r1, part, 0, NULL);
        uint32_t lim = bx_tokred_abs_limit(s->bound[wt]);
        const uint32_t *u = (const uint32_t *)(const void *)part;
        size_t i = 0;
        while (i < nk && !((u[i] & 0x7fffffffu) >= lim && (u[i] & 0x7fffffffu) < 0x7f800000u)) i++;
        if (i < nk) {
          st = bx_tokred_bound_fail(fn, s, wt, c, part, nk);
          break;
        }
      }
      undo(fn, s, wt, BX_WGRAD_NONE, g, token_begin, g->cb, part, bpart);
      return st;
    }
  }
  if (bt != BX_WGRAD_NONE)
    for (int64_t c = g->cb; c < g->ce; c++) {
      size_t r0, r1;
      chunk_rows(s, g, token_begin, c, &r0, &r1);
      colsum(&g->D, r0, r1, 0, g->n, bpart);
      int64_t *w = s->words + s->word_at[bt];
      if (grid) {
        int64_t nf;
        double inv = bx_tokred_pow2(-s->grid[bt]);
        uint32_t mx = bx_tokred_kernels_active()->grid_add(w, bpart, g->n, inv, &nf);
        nf_b += nf;
        mx_b = mx > mx_b ? mx : mx_b;
        if (bx_tokred_breaks(s, bt, mx)) {
          bx_status st = bx_tokred_bound_fail(fn, s, bt, c, bpart, g->n);
          bx_tokred_grid_sub(w, bpart, g->n, inv);
          undo(fn, s, nk ? wt : BX_WGRAD_NONE, bt, g, token_begin, c, part, bpart);
          return st;
        }
      } else {
        nf_b += bx_tokred_plain_add(s->fsum + (s->word_at[bt] - bt), bpart, g->n);
      }
    }
  commit(s, wt, bt, g, nf_w, nf_b, mx_w, mx_b); /* non-finite counts and coverage */
  return BX_OK;
}

bx_status bx_linear_wgrad(bx_tokred *s, size_t wt, size_t bt, const DLTensor *dy,
                          const DLTensor *x, int64_t token_begin, const bx_wgrad_opts *opts) {
  static const char *fn = "bx_linear_wgrad";
  wg_args g;
  bx_call call;
  bx_status st = enter(&call, fn, opts, &g.threads);
  if (st != BX_OK) return st;
  st = wg_checks(fn, s, wt, bt, dy, x, token_begin, &g);
  if (st == BX_OK && !s->agreed)
    st = bx_fail(BX_EINVAL, "%s: the grid is not agreed yet (call bx_tokred_agree before "
                 "adding)", fn);
  if (st == BX_OK && g.cb < g.ce && wt != BX_WGRAD_NONE) st = bx_tokred_add_check(fn, s, wt, g.cb);
  if (st == BX_OK && g.cb < g.ce && bt != BX_WGRAD_NONE) st = bx_tokred_add_check(fn, s, bt, g.cb);
  if (st == BX_OK) st = wgrad_impl(fn, s, wt, bt, &g, token_begin);
  bx_call_leave(&call);
  return st;
}
