/*
 * router.c — the GLM-4.5 MoE router of bitexact_train.h ("MoE router and
 * token dispatch"): bx_moe_router_forward (sigmoid scores, group-limited
 * top-k with exact decisions, the normalised and scaled weights, the
 * per-chunk expert counts), bx_moe_router_backward and
 * bx_moe_bias_update. One token's result depends on that token's row
 * only; tokens go over the pool in fixed pieces of PIECE tokens.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "abi.h"
#include "bitexact_train.h"
#include "call.h"
#include "error.h"
#include "moe_internal.h"
#include "nan_canon.h"
#include "pool.h"
#include "router_hd.h"
#include "train_device.h"
#include "workspace.h"

#define PIECE 64 /* tokens per task */

/* ---- options --------------------------------------------------------------- */

/* struct_size (first), the options into *o, then the call is entered. */
static bx_status router_enter(bx_call *call, const char *fn, const bx_moe_router_opts *opts,
                              bx_moe_router_opts *o) {
  bx_status st = opts ? bx_check_struct_size(fn, "opts->struct_size", opts->struct_size,
                                             sizeof(bx_moe_router_opts), "bx_moe_router_opts",
                                             "BX_MOE_ROUTER_OPTS_DEFAULT")
                      : BX_OK;
  if (st != BX_OK) return st;
  bx_moe_router_opts d = BX_MOE_ROUTER_OPTS_DEFAULT;
  *o = opts ? *opts : d;
  return bx_call_enter(call, fn);
}

/* The options against E experts and k slots (k < 0: not checked). */
static bx_status router_config(const char *fn, const bx_moe_router_opts *o, int64_t E, int64_t k) {
  if (o->num_threads < 0) return bx_fail(BX_EINVAL, "%s: num_threads %d is negative", fn, o->num_threads);
  if (o->n_group < 1)
    return bx_fail(BX_EINVAL, "%s: n_group = %lld, want >= 1", fn, (long long)o->n_group);
  if (E % o->n_group != 0)
    return bx_fail(BX_EINVAL, "%s: n_routed_experts %lld is not divisible by n_group %lld", fn,
                   (long long)E, (long long)o->n_group);
  if (E / o->n_group < 2)
    return bx_fail(BX_EINVAL,
                   "%s: %lld experts per group (n_routed_experts %lld / n_group %lld); the group "
                   "score takes the top 2, want >= 2",
                   fn, (long long)(E / o->n_group), (long long)E, (long long)o->n_group);
  if (o->topk_group < 1 || o->topk_group > o->n_group)
    return bx_fail(BX_EINVAL, "%s: topk_group = %lld, want 1 <= topk_group <= n_group = %lld", fn,
                   (long long)o->topk_group, (long long)o->n_group);
  if (o->norm_topk_prob != 0 && o->norm_topk_prob != 1)
    return bx_fail(BX_EINVAL, "%s: norm_topk_prob = %d, want 0 or 1", fn, o->norm_topk_prob);
  if (!isfinite(o->routed_scaling_factor) || !isfinite((float)o->routed_scaling_factor))
    return bx_fail(BX_EINVAL, "%s: routed_scaling_factor is not finite in fp32", fn);
  if (k >= 0) {
    int64_t avail = o->topk_group * (E / o->n_group);
    if (k < 1 || k > avail)
      return bx_fail(BX_EINVAL,
                     "%s: k = %lld experts per token, want 1 <= k <= topk_group * experts per "
                     "group = %lld",
                     fn, (long long)k, (long long)avail);
  }
  return BX_OK;
}

/* ---- forward --------------------------------------------------------------- */

typedef struct fwd_job {
  const float *logits, *bias;
  bx_tc_tensor *ids;
  float *weights;
  int64_t T;
  bx_router_cfg q;
  char *scratch; /* per worker: s[E], c[E], gs[G], (pad), sel[k], kept[G] */
  size_t scratch_each;
  size_t sel_at; /* floats before sel: 2E + G rounded up to even */
} fwd_job;

static void store_id(bx_tc_tensor *ids, size_t i, int64_t v) {
  if (ids->dtype == BX_TC_I32)
    ((int32_t *)ids->data)[i] = (int32_t)v;
  else
    ((int64_t *)ids->data)[i] = v;
}

/* One token: the documented algorithm (router_hd.h), then its ids stored. */
static void route_token(const fwd_job *j, int64_t t, float *s, float *c, float *gs,
                        unsigned char *kept, int64_t *sel) {
  const int64_t k = j->q.k;
  bx_router_token_f32(&j->q, j->logits + t * j->q.E, j->bias, s, c, gs, kept, sel,
                      j->weights + t * k);
  for (int64_t a = 0; a < k; a++) store_id(j->ids, (size_t)(t * k + a), sel[a]);
}

static void fwd_piece(void *ctx, size_t task, int worker) {
  const fwd_job *j = ctx;
  char *sc = j->scratch + (size_t)worker * j->scratch_each;
  float *s = (float *)sc, *c = s + j->q.E, *gs = c + j->q.E;
  int64_t *sel = (int64_t *)(s + j->sel_at);
  unsigned char *kept = (unsigned char *)(sel + j->q.k);
  int64_t t0 = (int64_t)task * PIECE, t1 = t0 + PIECE < j->T ? t0 + PIECE : j->T;
  for (int64_t t = t0; t < t1; t++) route_token(j, t, s, c, gs, kept, sel);
}

/* The forward's checks of its data: bias finite, no NaN logit (on the
 * host path's tensors or the device path's host copies). */
static bx_status check_fwd_data(const char *fn, const bx_tc_tensor *tl, const bx_tc_tensor *tb) {
  const float *lg = tl->data, *bs = tb->data;
  int64_t E = tl->dim[1];
  for (int64_t e = 0; e < E; e++)
    if (!isfinite(bs[e]))
      return bx_fail_at(BX_ENONFINITE, -1, BX_NO_INDEX, 1,
                        "%s: tensor 1 (bias): element %lld is not finite", fn, (long long)e);
  for (size_t i = 0; i < tl->n; i++)
    if (lg[i] != lg[i])
      return bx_fail_at(BX_ENONFINITE, -1, BX_NO_INDEX, 0,
                        "%s: tensor 0 (logits): token %lld expert %lld is NaN (no order to choose "
                        "by)", fn, (long long)(i / (size_t)E), (long long)(i % (size_t)E));
  return BX_OK;
}

/* The device's scratch limits (grid_moe.h's local arrays): BX_EINVAL
 * naming the call past them. */
static bx_status device_limits(const char *fn, int64_t E, int64_t k) {
  if (E > BX_ROUTER_DEVICE_MAX_E || k > BX_ROUTER_DEVICE_MAX_K)
    return bx_fail(BX_EINVAL, "%s: on a CUDA device the router takes at most %d experts and %d "
                   "per token (E = %lld, k = %lld); the host path has no such limit", fn,
                   BX_ROUTER_DEVICE_MAX_E, BX_ROUTER_DEVICE_MAX_K, (long long)E, (long long)k);
  return BX_OK;
}

/* The CUDA path of the forward: bias and logits copied to the host and
 * checked there (the host path's errors, nothing written), the limits,
 * then the device's kernels (one thread per token, then the counts). */
static bx_status router_fwd_cuda(const char *fn, const bx_tc_place *pl, const bx_tc_tensor *tl,
                                 const bx_tc_tensor *tb, const bx_tc_tensor *ti,
                                 const bx_tc_tensor *tw, const bx_tc_tensor *tc, int64_t chunk,
                                 int64_t nchunks, const bx_router_cfg *q) {
  const bx_train_device *dev;
  bx_status st = bx_train_cuda(fn, &dev);
  if (st != BX_OK) return st;
  const bx_tc_tensor *src[2] = {tl, tb};
  bx_tc_tensor host[2];
  st = bx_tc_to_host(fn, pl, dev, src, host, 2, 0, NULL);
  if (st == BX_OK) st = check_fwd_data(fn, &host[0], &host[1]);
  if (st == BX_OK) st = device_limits(fn, q->E, q->k);
  if (st != BX_OK) return st;
  return dev->router_fwd(fn, pl->device, tl->data, tb->data, ti->data, ti->dtype == BX_TC_I64,
                         tw->data, tc ? (int64_t *)tc->data : NULL, (size_t)tl->dim[0],
                         (size_t)chunk, tc ? (size_t)nchunks : 0, q);
}

bx_status bx_moe_router_forward(const DLTensor *logits, const DLTensor *bias,
                                DLTensor *topk_ids, DLTensor *topk_weights, int64_t chunk_tokens,
                                DLTensor *counts, const bx_moe_router_opts *opts) {
  const char *fn = "bx_moe_router_forward";
  bx_moe_router_opts o;
  bx_call call;
  bx_status st = router_enter(&call, fn, opts, &o);
  if (st != BX_OK) return st;
  bx_tc_tensor tl, tb, ti, tw, tc;
  const DLTensor *ts[5] = {logits, bias, topk_ids, topk_weights, counts};
  const bx_tc_place pl = bx_tc_place_of(ts, 5);
  if ((st = bx_tc_check_in(&pl, fn, 0, "logits", logits, BX_TC_F32, 2, 2, NULL, 0, &tl)) != BX_OK)
    goto done;
  int64_t T = tl.dim[0], E = tl.dim[1];
  int64_t wb[1] = {E};
  if ((st = bx_tc_check_in(&pl, fn, 1, "bias", bias, BX_TC_F32, 1, 1, wb, 0, &tb)) != BX_OK)
    goto done;
  int64_t wi[2] = {T, -1};
  if ((st = bx_tc_check_in(&pl, fn, 2, "topk_ids", topk_ids, BX_TC_IDS, 2, 2, wi, 1, &ti)) != BX_OK)
    goto done;
  int64_t k = ti.dim[1];
  int64_t ww[2] = {T, k};
  if ((st = bx_tc_check_in(&pl, fn, 3, "topk_weights", topk_weights, BX_TC_F32, 2, 2, ww, 1,
                            &tw)) != BX_OK)
    goto done;
  if (chunk_tokens < 1) {
    st = bx_fail(BX_EINVAL, "%s: chunk_tokens = %lld, want >= 1", fn, (long long)chunk_tokens);
    goto done;
  }
  int64_t nchunks = T / chunk_tokens + (T % chunk_tokens != 0);
  int have_counts = counts != NULL;
  if (have_counts) {
    int64_t wc[2] = {nchunks, E};
    if ((st = bx_tc_check_in(&pl, fn, 5, "counts", counts, BX_TC_I64, 2, 2, wc, 1, &tc)) != BX_OK)
      goto done;
  }
  if ((st = router_config(fn, &o, E, k)) != BX_OK) goto done;
  if (ti.dtype == BX_TC_I32 && E > INT32_MAX) {
    st = bx_fail_at(BX_EINVAL, -1, BX_NO_INDEX, 2, "%s: tensor 2 (topk_ids): int32 cannot hold %lld expert ids", fn, (long long)E);
    goto done;
  }
  const bx_tc_tensor *all[5] = {&tl, &tb, &ti, &tw, have_counts ? &tc : NULL};
  if ((st = bx_tc_overlap(fn, all, 5)) != BX_OK) goto done;
  bx_router_cfg q = {E, o.n_group, E / o.n_group, o.topk_group, k, o.norm_topk_prob,
                     (float)o.routed_scaling_factor};
  if (pl.cuda) {
    st = router_fwd_cuda(fn, &pl, &tl, &tb, &ti, &tw, have_counts ? &tc : NULL, chunk_tokens,
                         nchunks, &q);
    goto done;
  }
  const float *lg = tl.data, *bs = tb.data;
  if ((st = check_fwd_data(fn, &tl, &tb)) != BX_OK) goto done;
  fwd_job j = {lg, bs, &ti, tw.data, T, q, NULL, 0, 0};
  size_t npieces = (size_t)(T / PIECE + (T % PIECE != 0));
  int nt = bx_tc_threads(o.num_threads, npieces);
  size_t fl = (size_t)(2 * E + o.n_group);
  fl += fl & 1;
  j.sel_at = fl;
  j.scratch_each = (fl * 4 + (size_t)k * 8 + (size_t)o.n_group + 63) & ~(size_t)63;
  if (T > 0) {
    j.scratch = bx_workspace(j.scratch_each * (size_t)nt);
    if (!j.scratch) {
      st = bx_fail(BX_ENOMEM, "%s: no memory for %zu bytes of scratch", fn, j.scratch_each * (size_t)nt);
      goto done;
    }
    bx_parallel_run(nt, npieces, fwd_piece, &j);
  }
  if (have_counts) {
    int64_t *cn = tc.data;
    memset(cn, 0, tc.n * sizeof *cn);
    for (int64_t t = 0; t < T; t++)
      for (int64_t a = 0; a < k; a++)
        cn[(t / chunk_tokens) * E + bx_tc_id(&ti, (size_t)(t * k + a))]++;
  }
done:
  bx_call_leave(&call);
  return st;
}

/* ---- backward -------------------------------------------------------------- */

typedef struct bwd_job {
  const float *logits, *dw;
  const bx_tc_tensor *ids;
  float *dl;
  int64_t T, E, k;
  int norm;
  double r;
  double *scratch; /* per worker: g[k], s[k], m[k] (fp64), ids[k] (int64) */
} bwd_job;

static void bwd_piece(void *ctx, size_t task, int worker) {
  const bwd_job *j = ctx;
  double *g = j->scratch + (size_t)worker * 4 * (size_t)j->k, *s = g + j->k, *m = s + j->k;
  int64_t *ids = (int64_t *)(m + j->k);
  int64_t t0 = (int64_t)task * PIECE, t1 = t0 + PIECE < j->T ? t0 + PIECE : j->T;
  for (int64_t t = t0; t < t1; t++) {
    for (int64_t a = 0; a < j->k; a++) ids[a] = bx_tc_id(j->ids, (size_t)(t * j->k + a));
    bx_router_token_bwd_f32(j->logits + t * j->E, ids, j->dw + t * j->k, j->E, j->k, j->norm,
                            j->r, g, s, m, j->dl + t * j->E);
  }
}

bx_status bx_moe_router_backward(const DLTensor *logits, const DLTensor *topk_ids,
                                 const DLTensor *dweights, DLTensor *dlogits,
                                 const bx_moe_router_opts *opts) {
  const char *fn = "bx_moe_router_backward";
  bx_moe_router_opts o;
  bx_call call;
  bx_status st = router_enter(&call, fn, opts, &o);
  if (st != BX_OK) return st;
  bx_tc_tensor tl, ti, tw, td;
  const DLTensor *ts[4] = {logits, topk_ids, dweights, dlogits};
  const bx_tc_place pl = bx_tc_place_of(ts, 4);
  if ((st = bx_tc_check_in(&pl, fn, 0, "logits", logits, BX_TC_F32, 2, 2, NULL, 0, &tl)) != BX_OK)
    goto done;
  int64_t T = tl.dim[0], E = tl.dim[1];
  int64_t wi[2] = {T, -1};
  if ((st = bx_tc_check_in(&pl, fn, 1, "topk_ids", topk_ids, BX_TC_IDS, 2, 2, wi, 0, &ti)) != BX_OK)
    goto done;
  int64_t k = ti.dim[1];
  int64_t ww[2] = {T, k};
  if ((st = bx_tc_check_in(&pl, fn, 2, "dweights", dweights, BX_TC_F32, 2, 2, ww, 0, &tw)) != BX_OK)
    goto done;
  int64_t wd[2] = {T, E};
  if ((st = bx_tc_check_in(&pl, fn, 3, "dlogits", dlogits, BX_TC_F32, 2, 2, wd, 1, &td)) != BX_OK)
    goto done;
  if ((st = router_config(fn, &o, E, -1)) != BX_OK) goto done;
  if (k < 1 || k > E) {
    st = bx_fail_at(BX_EINVAL, -1, BX_NO_INDEX, 1, "%s: tensor 1 (topk_ids): k = %lld, want 1 <= k <= %lld",
                    fn, (long long)k, (long long)E);
    goto done;
  }
  const bx_tc_tensor *all[4] = {&tl, &ti, &tw, &td};
  if ((st = bx_tc_overlap(fn, all, 4)) != BX_OK) goto done;
  if (pl.cuda) {
    /* the ids copied to the host and checked there, then one thread per token */
    const bx_train_device *dev;
    const bx_tc_tensor *src[1] = {&ti};
    bx_tc_tensor hi;
    void *seen0;
    if ((st = bx_train_cuda(fn, &dev)) != BX_OK) goto done;
    if ((st = bx_tc_to_host(fn, &pl, dev, src, &hi, 1, (size_t)E, &seen0)) != BX_OK) goto done;
    memset(seen0, 0, (size_t)E);
    if ((st = bx_moe_check_ids(fn, &hi, E, seen0)) != BX_OK) goto done;
    if ((st = device_limits(fn, 0, k)) != BX_OK) goto done;
    st = dev->router_bwd(fn, pl.device, tl.data, ti.data, ti.dtype == BX_TC_I64, tw.data, td.data,
                         (size_t)T, (size_t)E, (size_t)k, o.norm_topk_prob,
                         (double)(float)o.routed_scaling_factor);
    goto done;
  }
  size_t npieces = (size_t)(T / PIECE + (T % PIECE != 0));
  int nt = bx_tc_threads(o.num_threads, npieces);
  size_t need = (size_t)E + (size_t)nt * 4 * (size_t)k * sizeof(double) + 16;
  char *ws = bx_workspace(need);
  if (!ws) {
    st = bx_fail(BX_ENOMEM, "%s: no memory for %zu bytes of scratch", fn, need);
    goto done;
  }
  double *dsc = (double *)ws;
  unsigned char *seen = (unsigned char *)(dsc + (size_t)nt * 4 * (size_t)k);
  memset(seen, 0, (size_t)E);
  if ((st = bx_moe_check_ids(fn, &ti, E, seen)) != BX_OK) goto done;
  bwd_job j = {tl.data, tw.data, &ti, td.data, T, E, k, o.norm_topk_prob,
               (double)(float)o.routed_scaling_factor, dsc};
  if (T > 0) bx_parallel_run(nt, npieces, bwd_piece, &j);
done:
  bx_call_leave(&call);
  return st;
}

/* ---- expert-bias update ------------------------------------------------------ */

bx_status bx_moe_bias_update(DLTensor *bias, const DLTensor *counts, double rate) {
  const char *fn = "bx_moe_bias_update";
  bx_call call;
  bx_status st = bx_call_enter(&call, fn);
  if (st != BX_OK) return st;
  bx_tc_tensor tb, tc;
  if ((st = bx_tc_check(fn, 0, "bias", bias, BX_TC_F32, 1, 1, NULL, 1, &tb)) != BX_OK) goto done;
  int64_t E = tb.dim[0];
  int cdim = counts && counts->ndim == 2 ? 2 : 1;
  int64_t w1[1] = {E}, w2[2] = {-1, E};
  if ((st = bx_tc_check(fn, 1, "counts", counts, BX_TC_I64, cdim, cdim, cdim == 2 ? w2 : w1, 0, &tc)) !=
      BX_OK)
    goto done;
  if (!isfinite(rate) || rate < 0.0 || !isfinite((float)rate)) {
    st = bx_fail(BX_EINVAL, "%s: rate must be finite and >= 0", fn);
    goto done;
  }
  const bx_tc_tensor *all[2] = {&tb, &tc};
  if ((st = bx_tc_overlap(fn, all, 2)) != BX_OK) goto done;
  const int64_t *cn = tc.data;
  const int64_t LIM = (int64_t)1 << 62;
  int64_t rows = cdim == 2 ? tc.dim[0] : 1;
  int64_t total = 0;
  for (int64_t i = 0; i < rows * E; i++) {
    if (cn[i] < 0 || cn[i] > LIM - total) {
      st = bx_fail_at(BX_EINVAL, -1, BX_NO_INDEX, 1,
                      cn[i] < 0 ? "%s: tensor 1 (counts): element %lld is negative"
                                : "%s: tensor 1 (counts): the sum passes 2^62 at element %lld",
                      fn, (long long)i);
      goto done;
    }
    total += cn[i];
  }
  /* E * count_e <= E * total: needs E * total < 2^63 */
  if (E > 0 && total > INT64_MAX / E) {
    st = bx_fail(BX_EINVAL, "%s: E * total count passes 2^63", fn);
    goto done;
  }
  float *b = tb.data;
  float fr = (float)rate;
  for (int64_t e = 0; e < E; e++) {
    int64_t ce = 0;
    for (int64_t r = 0; r < rows; r++) ce += cn[r * E + e];
    int64_t off = total - E * ce; /* E * (mean - count_e) */
    float step = off > 0 ? fr : off < 0 ? -fr : 0.0f;
    b[e] = bx_canon_f32(b[e] + step);
  }
done:
  bx_call_leave(&call);
  return st;
}
