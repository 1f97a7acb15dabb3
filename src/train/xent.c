/*
 * xent.c — cross-entropy over the vocabulary (bitexact_train.h, "Layers:
 * embedding, cross-entropy"): per-token losses, loss-sum and count chunk
 * partials for bx_tokred, the gradient of the global token mean, and both
 * in one pass. Each token's row is one fixed sequential pass per stage
 * (max, exp and fp64 sum, normalisation), so a token's bits depend on its
 * own row only; threads take whole tokens.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "abi.h"
#include "bitexact_train.h"
#include "call.h"
#include "error.h"
#include "kernels.h"
#include "math_det.h"
#include "pool.h"
#include "train_check.h"
#include "train_device.h"
#include "xent_hd.h"

/* targets [T] or [B, L] and x [T, V] or [B, L, V]: the leading dimensions agree. */
static bx_status check_token_major(const char *fn, size_t idx, const char *name, const bx_tc_tensor *y,
                                   const bx_tc_tensor *x) {
  int ok = x->ndim == y->ndim + 1;
  for (int k = 0; ok && k < y->ndim; k++) ok = x->dim[k] == y->dim[k];
  if (!ok)
    return bx_fail_at(BX_EINVAL, -1, BX_NO_INDEX, idx,
                      "%s: tensor %zu (%s) must be the targets' shape followed by the vocabulary",
                      fn, idx, name);
  return BX_OK;
}

/* ---- one token ------------------------------------------------------ */

#define EXP_BLOCK 256

/* The token's loss (and, with g, e_v then the gradient row; g may be z).
 * y < 0: ignored. c = f64(grad_scale / N). */
static void xent_row(const float *z, float *g, size_t V, int64_t y, double c, float *loss,
                     bx_math_fn vexp) {
  float m;
  if (bx_xent_row_special_f32(z, g, V, y, loss, &m)) return;
  float zy = z[y];
  /* e_v = bx_expf_det(z[v] - m) for a block at a time by the active ISA's
   * exp loop (kernels.h: the bits of bx_expf_det on every input, checked
   * exhaustively by dev/math_exhaustive.c --vector), summed in fp64 in
   * order. The block's z is read before its g is written (g may be z). */
  double S = 0.0;
  float d[EXP_BLOCK], e[EXP_BLOCK];
  for (size_t b = 0; b < V; b += EXP_BLOCK) {
    size_t len = V - b < EXP_BLOCK ? V - b : EXP_BLOCK;
    for (size_t i = 0; i < len; i++) d[i] = z[b + i] - m; /* <= 0 */
    vexp(d, e, len);
    for (size_t i = 0; i < len; i++) {
      if (g) g[b + i] = e[i];
      S += (double)e[i];
    }
  }
  if (loss) *loss = bx_xent_loss_f32(m, zy, S);
  if (!g) return;
  float ey = g[y];
  for (size_t v = 0; v < V; v++) g[v] = bx_xent_grad_f32(g[v], S, c);
  g[y] = bx_xent_grad_target_f32(ey, S, c);
}

typedef struct xent_job {
  const float *z;
  float *g;      /* NULL: forward only */
  float *loss;
  const bx_tc_tensor *y;
  int64_t ignore;
  size_t T, V, per;
  double c;
  bx_math_fn vexp; /* the active ISA's exp loop */
} xent_job;

static void xent_task(void *ctx, size_t task, int worker) {
  (void)worker;
  const xent_job *j = ctx;
  size_t t0 = task * j->per, t1 = t0 + j->per < j->T ? t0 + j->per : j->T;
  for (size_t t = t0; t < t1; t++) {
    int64_t y = bx_tc_id(j->y, t);
    xent_row(j->z + t * j->V, j->g ? j->g + t * j->V : NULL, j->V, y == j->ignore ? -1 : y, j->c,
             j->loss ? &j->loss[t] : NULL, j->vexp);
  }
}

/* ---- the calls ---------------------------------------------------------- */

enum { DO_FWD = 1, DO_BWD = 2, DO_COUNT = 4 }; /* DO_COUNT: bx_xent_count alone */

typedef struct xent_args {
  const DLTensor *logits, *targets;
  int64_t n_global, chunk_tokens;
  DLTensor *losses, *partials, *counts, *dlogits;
} xent_args;

static bx_status opts_in(const char *fn, const bx_xent_opts *opts, bx_xent_opts *o) {
  if (opts) {
    bx_status st = bx_check_struct_size(fn, "opts->struct_size", opts->struct_size, sizeof *opts,
                                        "bx_xent_opts", "BX_XENT_OPTS_DEFAULT");
    if (st != BX_OK) return st;
    *o = *opts;
  } else {
    bx_xent_opts d = BX_XENT_OPTS_DEFAULT;
    *o = d;
  }
  return BX_OK;
}

/* [nchunks] 1-D output, or NULL. */
static bx_status check_chunked(const bx_tc_place *pl, const char *fn, size_t idx, const char *name,
                               const DLTensor *t, unsigned dtype, size_t nchunks, bx_tc_tensor *v) {
  bx_status st = bx_tc_check_in(pl, fn, idx, name, t, dtype, 1, 1, NULL, 1, v);
  if (st == BX_OK && (size_t)v->dim[0] != nchunks)
    st = bx_fail_at(BX_EINVAL, -1, BX_NO_INDEX, idx,
                    "%s: tensor %zu (%s) has %lld entries; want nchunks = %zu", fn, idx, name,
                    (long long)v->dim[0], nchunks);
  return st;
}

static bx_status xent_impl(const char *fn, int what, const xent_args *a, const bx_xent_opts *o) {
  if (o->num_threads < 0)
    return bx_fail(BX_EINVAL, "%s: num_threads %d is negative", fn, o->num_threads);
  if ((what & DO_FWD) && a->chunk_tokens < 1)
    return bx_fail(BX_EINVAL, "%s: chunk_tokens %lld must be >= 1", fn,
                   (long long)a->chunk_tokens);
  if ((what & DO_BWD) && a->n_global < 1)
    return bx_fail(BX_EINVAL, "%s: n_global %lld must be >= 1", fn, (long long)a->n_global);
  if ((what & DO_BWD) && !(o->grad_scale - o->grad_scale == 0.0))
    return bx_fail(BX_EINVAL, "%s: grad_scale %g is not finite", fn, o->grad_scale);
  /* tensor numbers: logits 0, targets 1, then losses, loss_partials,
   * counts (forward) and dlogits (backward) in the order of the call */
  bx_tc_tensor Z, Y, L = {0}, P = {0}, N = {0}, G = {0};
  size_t iL = 2, iP = 3, iN = 4, iG = what == DO_BWD ? 2 : 5;
  const DLTensor *ts[6] = {a->logits, a->targets, a->losses, a->partials, a->counts, a->dlogits};
  const bx_tc_place pl = bx_tc_place_of(ts, 6);
  bx_status st = bx_tc_check_in(&pl, fn, 0, "logits", a->logits, BX_TC_F32, 2, 3, NULL, 0, &Z);
  if (st == BX_OK)
    st = bx_tc_check_in(&pl, fn, 1, "targets", a->targets, BX_TC_IDS, 1, 2, NULL, 0, &Y);
  if (st == BX_OK) st = check_token_major(fn, 0, "logits", &Y, &Z);
  if (st != BX_OK) return st;
  size_t T = Y.n, V = (size_t)Z.dim[Z.ndim - 1];
  size_t C = (what & DO_FWD) ? (size_t)a->chunk_tokens : 1;
  size_t nchunks = T / C + (T % C != 0);
  const bx_tc_tensor *all[6];
  size_t nall = 0;
  all[nall++] = &Z;
  all[nall++] = &Y;
  if (what & DO_FWD) {
    st = bx_tc_check_in(&pl, fn, iL, "losses", a->losses, BX_TC_F32, 1, 2, NULL, 1, &L);
    if (st == BX_OK && !bx_tc_same_shape(&L, &Y))
      st = bx_fail_at(BX_EINVAL, -1, BX_NO_INDEX, iL,
                      "%s: tensor %zu (losses) must have the targets' shape", fn, iL);
    if (st == BX_OK && a->partials)
      st = check_chunked(&pl, fn, iP, "loss_partials", a->partials, BX_TC_F32, nchunks, &P);
    if (st == BX_OK && a->counts)
      st = check_chunked(&pl, fn, iN, "counts", a->counts, BX_TC_I64, nchunks, &N);
    if (st != BX_OK) return st;
    all[nall++] = &L;
    all[nall++] = &P; /* empty when NULL */
    all[nall++] = &N;
  }
  if (what & DO_BWD) {
    st = bx_tc_check_in(&pl, fn, iG, "dlogits", a->dlogits, BX_TC_F32, 2, 3, NULL, 1, &G);
    if (st == BX_OK && !bx_tc_same_shape(&G, &Z))
      st = bx_fail_at(BX_EINVAL, -1, BX_NO_INDEX, iG,
                      "%s: tensor %zu (dlogits) must have the logits' shape", fn, iG);
    if (st != BX_OK) return st;
    all[nall++] = &G;
  }
  /* overlaps: every output against everything, dlogits == logits allowed */
  G.inplace = 0;
  if ((st = bx_tc_overlap(fn, all, nall)) != BX_OK) return st;
  const bx_train_device *dev = NULL;
  bx_tc_tensor HY = Y; /* the targets the host reads: Y, or the device path's copy */
  if (pl.cuda) {
    const bx_tc_tensor *src[1] = {&Y};
    st = bx_train_cuda(fn, &dev);
    if (st == BX_OK) st = bx_tc_to_host(fn, &pl, dev, src, &HY, 1, 0, NULL);
    if (st != BX_OK) return st;
  }
  int64_t local = 0;
  for (size_t t = 0; t < T; t++) {
    int64_t y = bx_tc_id(&HY, t);
    if (y == o->ignore_index) continue;
    if (y < 0 || (uint64_t)y >= V)
      return bx_fail_at(BX_EINVAL, -1, BX_NO_INDEX, 1,
                        "%s: tensor 1 (targets): token %zu has target %lld, outside [0, %zu) and "
                        "not ignore_index %lld; nothing written", fn, t, (long long)y, V,
                        (long long)o->ignore_index);
    local++;
  }
  if ((what & DO_BWD) && local > a->n_global)
    return bx_fail(BX_EINVAL, "%s: n_global %lld is below this call's own %lld non-ignored tokens",
                   fn, (long long)a->n_global, (long long)local);
  if (dev) /* one thread per row (S sequential, as here), then one per chunk */
    return dev->xent(fn, pl.device, Z.data, Y.data, Y.dtype == BX_TC_I64, o->ignore_index,
                     (what & DO_BWD) ? (float *)G.data : NULL,
                     (what & DO_FWD) ? (float *)L.data : NULL,
                     (what & DO_FWD) && a->partials ? (float *)P.data : NULL,
                     (what & DO_FWD) && a->counts ? (int64_t *)N.data : NULL, T, V,
                     C, nchunks,
                     (what & DO_BWD) ? o->grad_scale / (double)a->n_global : 0.0);
  xent_job j = {(const float *)(const void *)Z.data,
                (what & DO_BWD) ? (float *)(void *)G.data : NULL,
                (what & DO_FWD) ? (float *)(void *)L.data : NULL,
                &Y, o->ignore_index, T, V, 0,
                (what & DO_BWD) ? o->grad_scale / (double)a->n_global : 0.0,
                bx_math_kernels_active()->exp};
  if (T && V) {
    j.per = V >= 16384 ? 1 : 16384 / V;
    size_t tasks = (T + j.per - 1) / j.per;
    bx_parallel_run(bx_tc_threads(o->num_threads, tasks), tasks, xent_task, &j);
  } else if ((what & DO_FWD) && T) {
    for (size_t t = 0; t < T; t++) j.loss[t] = 0.0f; /* V = 0: every token is ignored */
  }
  if (what & DO_FWD) {
    float *part = a->partials ? (float *)(void *)P.data : NULL;
    int64_t *cnt = a->counts ? (int64_t *)(void *)N.data : NULL;
    for (size_t c = 0; c < nchunks; c++) {
      size_t t0 = c * C, t1 = t0 + C < T ? t0 + C : T;
      float acc = 0.0f;
      int64_t n = 0;
      for (size_t t = t0; t < t1; t++)
        if (bx_tc_id(&Y, t) != o->ignore_index) {
          acc = acc + j.loss[t];
          n++;
        }
      if (part) part[c] = bx_canon_f32(acc);
      if (cnt) cnt[c] = n;
    }
  }
  return BX_OK;
}

static bx_status count_impl(const char *fn, const DLTensor *targets, int64_t chunk_tokens,
                            DLTensor *counts, const bx_xent_opts *o);

/* One call: struct_size first, the call entered around the work. */
static bx_status xent_call(const char *fn, int what, const xent_args *a, const bx_xent_opts *opts) {
  bx_xent_opts o;
  bx_status st = opts_in(fn, opts, &o);
  if (st != BX_OK) return st;
  bx_call c;
  st = bx_call_enter(&c, fn);
  if (st != BX_OK) return st;
  st = what == DO_COUNT ? count_impl(fn, a->targets, a->chunk_tokens, a->counts, &o)
                        : xent_impl(fn, what, a, &o);
  bx_call_leave(&c);
  return st;
}

bx_status bx_xent_forward(const DLTensor *logits, const DLTensor *targets, int64_t chunk_tokens,
                          DLTensor *losses, DLTensor *loss_partials, DLTensor *counts,
                          const bx_xent_opts *opts) {
  static const char *fn = "bx_xent_forward";
  xent_args a = {logits, targets, 0, chunk_tokens, losses, loss_partials, counts, NULL};
  return xent_call(fn, DO_FWD, &a, opts);
}

bx_status bx_xent_backward(const DLTensor *logits, const DLTensor *targets, int64_t n_global,
                           DLTensor *dlogits, const bx_xent_opts *opts) {
  static const char *fn = "bx_xent_backward";
  xent_args a = {logits, targets, n_global, 0, NULL, NULL, NULL, dlogits};
  return xent_call(fn, DO_BWD, &a, opts);
}

bx_status bx_xent_forward_backward(const DLTensor *logits, const DLTensor *targets,
                                   int64_t n_global, int64_t chunk_tokens, DLTensor *losses,
                                   DLTensor *loss_partials, DLTensor *counts, DLTensor *dlogits,
                                   const bx_xent_opts *opts) {
  static const char *fn = "bx_xent_forward_backward";
  xent_args a = {logits, targets, n_global, chunk_tokens, losses, loss_partials, counts, dlogits};
  return xent_call(fn, DO_FWD | DO_BWD, &a, opts);
}

static bx_status count_impl(const char *fn, const DLTensor *targets, int64_t chunk_tokens,
                            DLTensor *counts, const bx_xent_opts *o) {
  if (chunk_tokens < 1)
    return bx_fail(BX_EINVAL, "%s: chunk_tokens %lld must be >= 1", fn, (long long)chunk_tokens);
  bx_tc_tensor Y, N;
  bx_status st = bx_tc_check(fn, 0, "targets", targets, BX_TC_IDS, 1, 2, NULL, 0, &Y);
  if (st != BX_OK) return st;
  size_t T = Y.n, C = (size_t)chunk_tokens, nchunks = T / C + (T % C != 0);
  st = check_chunked(NULL, fn, 1, "counts", counts, BX_TC_I64, nchunks, &N);
  const bx_tc_tensor *all[2] = {&Y, &N};
  if (st == BX_OK) st = bx_tc_overlap(fn, all, 2);
  if (st != BX_OK) return st;
  for (size_t t = 0; t < T; t++) {
    int64_t y = bx_tc_id(&Y, t);
    if (y != o->ignore_index && y < 0)
      return bx_fail_at(BX_EINVAL, -1, BX_NO_INDEX, 0,
                        "%s: tensor 0 (targets): token %zu has target %lld, negative and not "
                        "ignore_index %lld; nothing written", fn, t, (long long)y,
                        (long long)o->ignore_index);
  }
  int64_t *cnt = (int64_t *)(void *)N.data;
  for (size_t c = 0; c < nchunks; c++) {
    size_t t0 = c * C, t1 = t0 + C < T ? t0 + C : T;
    int64_t n = 0;
    for (size_t t = t0; t < t1; t++) n += bx_tc_id(&Y, t) != o->ignore_index;
    cnt[c] = n;
  }
  return BX_OK;
}

bx_status bx_xent_count(const DLTensor *targets, int64_t chunk_tokens, DLTensor *counts,
                        const bx_xent_opts *opts) {
  static const char *fn = "bx_xent_count";
  xent_args a = {NULL, targets, 0, chunk_tokens, NULL, NULL, counts, NULL};
  return xent_call(fn, DO_COUNT, &a, opts);
}
