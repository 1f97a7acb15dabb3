/*
 * embedding.c — the embedding lookup and its gradient as compact chunk
 * partials (bitexact_train.h, "Layers: embedding, cross-entropy"), and the
 * two helpers that feed such partials to a bx_tokred state through the
 * token reduction's public API (bx_tokred_bound_exp, bx_tokred_words,
 * bx_tokred_grid_exp, bx_tokred_add) and its observation helpers
 * (tokred_internal.h: the bound rule and the observed exponent): the
 * sparse add writes the state's documented wire words directly, as
 * bx_tokred_add would for the dense partial, so its cost is that of the
 * rows present, not of V x H.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "abi.h"
#include "bitexact_train.h"
#include "call.h"
#include "embedding_hd.h"
#include "error.h"
#include "kernels.h"
#include "nan_canon.h"
#include "pool.h"
#include "train_check.h"
#include "train_device.h"
#include "tokred_grid.h"
#include "tokred_internal.h"
#include "workspace.h"

/* The words' layout this file relies on (bx_tokred_words: per tensor its
 * elements and one non-finite word, then the coverage words, tensor-major). */
#if BX_TOKRED_FORMAT != 2
#error "embedding.c writes bx_tokred's wire words of format 1 (and 2); update bx_embedding_grad_add"
#endif

/* The first token whose id is outside [0, V) -> BX_EINVAL. */
static bx_status check_ids(const char *fn, size_t idx, const bx_tc_tensor *ids, int64_t V) {
  for (size_t t = 0; t < ids->n; t++) {
    int64_t id = bx_tc_id(ids, t);
    if (id < 0 || id >= V)
      return bx_fail_at(BX_EINVAL, -1, BX_NO_INDEX, idx,
                        "%s: tensor %zu (ids): token %zu has id %lld, outside [0, %lld); nothing "
                        "written", fn, idx, t, (long long)id, (long long)V);
  }
  return BX_OK;
}

/* ids [T] or [B, L] and x [T, H] or [B, L, H]: the leading dimensions agree. */
static bx_status check_token_major(const char *fn, size_t idx, const char *name, const bx_tc_tensor *ids,
                                   const bx_tc_tensor *x) {
  int ok = x->ndim == ids->ndim + 1;
  for (int k = 0; ok && k < ids->ndim; k++) ok = x->dim[k] == ids->dim[k];
  if (!ok)
    return bx_fail_at(BX_EINVAL, -1, BX_NO_INDEX, idx,
                      "%s: tensor %zu (%s) must be the ids' shape followed by the row size", fn,
                      idx, name);
  return BX_OK;
}

/* struct_size (first), the options into *o, then the call is entered. */
static bx_status enter(bx_call *c, const char *fn, const bx_embedding_opts *opts,
                       bx_embedding_opts *o) {
  if (opts) {
    bx_status st = bx_check_struct_size(fn, "opts->struct_size", opts->struct_size, sizeof *opts,
                                        "bx_embedding_opts", "BX_EMBEDDING_OPTS_DEFAULT");
    if (st != BX_OK) return st;
    *o = *opts;
  } else {
    bx_embedding_opts d = BX_EMBEDDING_OPTS_DEFAULT;
    *o = d;
  }
  return bx_call_enter(c, fn);
}

/* ---- forward ------------------------------------------------------------ */

typedef struct fwd_job {
  const bx_tc_tensor *ids;
  const float *w;
  float *y;
  size_t H, T, per;
} fwd_job;

/* a lookup: the rows keep their bits (a NaN included) */
static void fwd_task(void *ctx, size_t task, int worker) {
  (void)worker;
  const fwd_job *j = ctx;
  size_t t0 = task * j->per, t1 = t0 + j->per < j->T ? t0 + j->per : j->T;
  for (size_t t = t0; t < t1; t++)
    memcpy(j->y + t * j->H, j->w + (size_t)bx_tc_id(j->ids, t) * j->H, j->H * sizeof(float));
}

static bx_status forward_impl(const char *fn, const DLTensor *weight, const DLTensor *ids,
                              DLTensor *y, const bx_embedding_opts *o) {
  if (o->num_threads < 0)
    return bx_fail(BX_EINVAL, "%s: num_threads %d is negative", fn, o->num_threads);
  bx_tc_tensor W, I, Y;
  const DLTensor *ts[3] = {weight, ids, y};
  const bx_tc_place pl = bx_tc_place_of(ts, 3);
  bx_status st = bx_tc_check_in(&pl, fn, 0, "weight", weight, BX_TC_F32, 2, 2, NULL, 0, &W);
  if (st == BX_OK) st = bx_tc_check_in(&pl, fn, 1, "ids", ids, BX_TC_IDS, 1, 2, NULL, 0, &I);
  if (st == BX_OK) st = bx_tc_check_in(&pl, fn, 2, "y", y, BX_TC_F32, 2, 3, NULL, 1, &Y);
  if (st == BX_OK) st = check_token_major(fn, 2, "y", &I, &Y);
  if (st == BX_OK && Y.dim[Y.ndim - 1] != W.dim[1])
    st = bx_fail_at(BX_EINVAL, -1, BX_NO_INDEX, 2, "%s: tensor 2 (y) has rows of %lld, weight %lld",
                    fn, (long long)Y.dim[Y.ndim - 1], (long long)W.dim[1]);
  const bx_tc_tensor *all[3] = {&W, &I, &Y};
  if (st == BX_OK) st = bx_tc_overlap(fn, all, 3);
  if (st == BX_OK && pl.cuda) {
    /* the ids copied to the host and checked there, then one thread per element */
    const bx_train_device *dev;
    const bx_tc_tensor *src[1] = {&I};
    bx_tc_tensor hi;
    st = bx_train_cuda(fn, &dev);
    if (st == BX_OK) st = bx_tc_to_host(fn, &pl, dev, src, &hi, 1, 0, NULL);
    if (st == BX_OK) st = check_ids(fn, 1, &hi, W.dim[0]);
    if (st != BX_OK) return st;
    return dev->embedding_fwd(fn, pl.device, W.data, I.data, I.dtype == BX_TC_I64, Y.data, I.n,
                              (size_t)W.dim[1]);
  }
  if (st == BX_OK) st = check_ids(fn, 1, &I, W.dim[0]);
  if (st != BX_OK || I.n == 0 || W.dim[1] == 0) return st;
  size_t H = (size_t)W.dim[1];
  size_t per = H >= 4096 ? 1 : 4096 / H;
  fwd_job j = {&I, (const float *)(const void *)W.data, (float *)(void *)Y.data, H, I.n, per};
  size_t tasks = (I.n + per - 1) / per;
  bx_parallel_run(bx_tc_threads(o->num_threads, tasks), tasks, fwd_task, &j);
  return BX_OK;
}

bx_status bx_embedding_forward(const DLTensor *weight, const DLTensor *ids, DLTensor *y,
                               const bx_embedding_opts *opts) {
  static const char *fn = "bx_embedding_forward";
  bx_embedding_opts o;
  bx_call c;
  bx_status st = enter(&c, fn, opts, &o);
  if (st != BX_OK) return st;
  st = forward_impl(fn, weight, ids, y, &o);
  bx_call_leave(&c);
  return st;
}

/* ---- backward: compact chunk partials ---------------------------------- */

typedef struct pair {
  int64_t id, t;
} pair;

static int cmp_pair(const void *a, const void *b) {
  const pair *x = a, *y = b;
  if (x->id != y->id) return x->id < y->id ? -1 : 1;
  return x->t < y->t ? -1 : x->t > y->t;
}

typedef struct bwd_job {
  const bx_tc_tensor *ids;
  const float *dy;
  int64_t pad;
  size_t T, H, C, nchunks;
  pair *pairs;    /* [T]: chunk j's tokens sorted by (id, t) at [j*C, ...) */
  int64_t *runs;  /* [T]: chunk j's run starts (relative) at [j*C, ...) */
  int64_t *kcnt;  /* [nchunks] non-padding tokens */
  int64_t *ncnt;  /* [nchunks] distinct ids */
  int64_t *off;   /* [nchunks + 1] prefix of ncnt */
  int64_t *row_ids;
  float *rows;
  size_t per;     /* compact rows per task */
  size_t total;
} bwd_job;

static void sort_task(void *ctx, size_t j, int worker) {
  (void)worker;
  bwd_job *b = ctx;
  size_t t0 = j * b->C, t1 = t0 + b->C < b->T ? t0 + b->C : b->T;
  pair *p = b->pairs + t0;
  size_t k = 0;
  for (size_t t = t0; t < t1; t++) {
    int64_t id = bx_tc_id(b->ids, t);
    if (id == b->pad) continue;
    p[k].id = id;
    p[k].t = (int64_t)t;
    k++;
  }
  qsort(p, k, sizeof *p, cmp_pair); /* keys are distinct: one order */
  int64_t *r = b->runs + t0;
  size_t n = 0;
  for (size_t i = 0; i < k; i++)
    if (i == 0 || p[i].id != p[i - 1].id) r[n++] = (int64_t)i;
  b->kcnt[j] = (int64_t)k;
  b->ncnt[j] = (int64_t)n;
}

static void rows_task(void *ctx, size_t task, int worker) {
  (void)worker;
  const bwd_job *b = ctx;
  size_t k0 = task * b->per, k1 = k0 + b->per < b->total ? k0 + b->per : b->total;
  /* the chunk of row k0: the last j with off[j] <= k0 */
  size_t lo = 0, hi = b->nchunks; /* off[lo] <= k0 < off[hi] */
  while (hi - lo > 1) {
    size_t mid = lo + (hi - lo) / 2;
    if ((size_t)b->off[mid] <= k0) lo = mid;
    else hi = mid;
  }
  size_t j = lo;
  for (size_t k = k0; k < k1; k++) {
    while ((size_t)b->off[j + 1] <= k) j++;
    size_t t0 = j * b->C, r = k - (size_t)b->off[j];
    const pair *p = b->pairs + t0;
    size_t s = (size_t)b->runs[t0 + r];
    size_t e = r + 1 < (size_t)b->ncnt[j] ? (size_t)b->runs[t0 + r + 1] : (size_t)b->kcnt[j];
    float *row = b->rows + k * b->H;
    b->row_ids[k] = p[s].id;
    for (size_t h = 0; h < b->H; h++) row[h] = 0.0f;
    for (size_t i = s; i < e; i++) {
      const float *g = b->dy + (size_t)p[i].t * b->H;
      for (size_t h = 0; h < b->H; h++) row[h] = bx_embedding_add_f32(row[h], g[h]);
    }
    bx_canon_f32_n(row, b->H); /* the row's sum, still in cache */
  }
}

static bx_status backward_impl(const char *fn, const DLTensor *ids, const DLTensor *dy,
                               int64_t V, int64_t C, DLTensor *row_ids, DLTensor *rows,
                               DLTensor *offsets, const bx_embedding_opts *o) {
  if (o->num_threads < 0)
    return bx_fail(BX_EINVAL, "%s: num_threads %d is negative", fn, o->num_threads);
  if (V < 1) return bx_fail(BX_EINVAL, "%s: num_embeddings %lld must be >= 1", fn, (long long)V);
  if (C < 1)
    return bx_fail(BX_EINVAL, "%s: chunk_tokens %lld must be >= 1", fn, (long long)C);
  if (o->padding_idx >= V)
    return bx_fail(BX_EINVAL, "%s: padding_idx %lld is not below num_embeddings %lld", fn,
                   (long long)o->padding_idx, (long long)V);
  bx_tc_tensor I, D, R, W, F;
  const DLTensor *ts[5] = {ids, dy, row_ids, rows, offsets};
  const bx_tc_place pl = bx_tc_place_of(ts, 5);
  bx_status st = bx_tc_check_in(&pl, fn, 0, "ids", ids, BX_TC_IDS, 1, 2, NULL, 0, &I);
  if (st == BX_OK) st = bx_tc_check_in(&pl, fn, 1, "dy", dy, BX_TC_F32, 2, 3, NULL, 0, &D);
  if (st == BX_OK) st = check_token_major(fn, 1, "dy", &I, &D);
  if (st == BX_OK)
    st = bx_tc_check_in(&pl, fn, 2, "row_ids", row_ids, BX_TC_I64, 1, 1, NULL, 1, &R);
  if (st == BX_OK) st = bx_tc_check_in(&pl, fn, 3, "rows", rows, BX_TC_F32, 2, 2, NULL, 1, &W);
  if (st == BX_OK)
    st = bx_tc_check_in(&pl, fn, 4, "offsets", offsets, BX_TC_I64, 1, 1, NULL, 1, &F);
  if (st != BX_OK) return st;
  size_t T = I.n, H = (size_t)D.dim[D.ndim - 1];
  size_t nchunks = T / (size_t)C + (T % (size_t)C != 0);
  if ((size_t)R.dim[0] != T)
    return bx_fail_at(BX_EINVAL, -1, BX_NO_INDEX, 2, "%s: tensor 2 (row_ids) must be [T = %zu]",
                      fn, T);
  if ((size_t)W.dim[0] != T || (size_t)W.dim[1] != H)
    return bx_fail_at(BX_EINVAL, -1, BX_NO_INDEX, 3,
                      "%s: tensor 3 (rows) must be [T = %zu, H = %zu]", fn, T, H);
  if ((size_t)F.dim[0] != nchunks + 1)
    return bx_fail_at(BX_EINVAL, -1, BX_NO_INDEX, 4,
                      "%s: tensor 4 (offsets) must be [nchunks + 1 = %zu]", fn, nchunks + 1);
  const bx_tc_tensor *all[5] = {&I, &D, &R, &W, &F};
  st = bx_tc_overlap(fn, all, 5);
  size_t bytes = T * sizeof(pair) + T * sizeof(int64_t) + (3 * nchunks + 1) * sizeof(int64_t);
  const bx_train_device *dev = NULL;
  bx_tc_tensor hi = I; /* the ids the host reads: I, or the device path's copy */
  char *ws = NULL;
  if (st == BX_OK && pl.cuda) {
    /* the ids copied to the host, checked and sorted there (row ids and
     * offsets: the host's decision, copied to the outputs); the device
     * adds dy's rows (one thread per compact row and column) */
    const bx_tc_tensor *src[1] = {&I};
    st = bx_train_cuda(fn, &dev);
    if (st == BX_OK) st = bx_tc_to_host(fn, &pl, dev, src, &hi, 1, bytes + T * sizeof(int64_t),
                                        (void **)&ws);
  }
  if (st == BX_OK) st = check_ids(fn, 0, &hi, V);
  if (st != BX_OK) return st;
  int64_t *off = (int64_t *)(void *)F.data;
  if (T == 0) {
    int64_t zero = 0;
    if (dev) return dev->to_device(fn, pl.device, off, &zero, sizeof zero);
    off[0] = 0;
    return BX_OK;
  }
  if (!dev) ws = bx_workspace(bytes);
  if (!ws) return bx_fail(BX_ENOMEM, "%s: cannot allocate %zu bytes of scratch", fn, bytes);
  bwd_job b;
  memset(&b, 0, sizeof b);
  b.ids = &hi;
  b.dy = (const float *)(const void *)D.data;
  b.pad = o->padding_idx < 0 ? -1 : o->padding_idx;
  b.T = T;
  b.H = H;
  b.C = (size_t)C;
  b.nchunks = nchunks;
  b.pairs = (pair *)(void *)ws;
  b.runs = (int64_t *)(void *)(ws + T * sizeof(pair));
  b.kcnt = b.runs + T;
  b.ncnt = b.kcnt + nchunks;
  b.off = b.ncnt + nchunks;
  b.row_ids = (int64_t *)(void *)R.data;
  b.rows = (float *)(void *)W.data;
  bx_parallel_run(bx_tc_threads(o->num_threads, nchunks), nchunks, sort_task, &b);
  b.off[0] = 0;
  for (size_t j = 0; j < nchunks; j++) b.off[j + 1] = b.off[j] + b.ncnt[j];
  b.total = (size_t)b.off[nchunks];
  if (dev) {
    /* row ids in compact order, then both to the device and the rows there */
    int64_t *rid = (int64_t *)(void *)(ws + bytes);
    for (size_t j = 0, k = 0; j < nchunks; j++)
      for (int64_t r = 0; r < b.ncnt[j]; r++, k++)
        rid[k] = b.pairs[j * b.C + (size_t)b.runs[j * b.C + (size_t)r]].id;
    st = b.total ? dev->to_device(fn, pl.device, R.data, rid, b.total * sizeof *rid) : BX_OK;
    if (st == BX_OK) st = dev->to_device(fn, pl.device, off, b.off, (nchunks + 1) * sizeof *off);
    if (st != BX_OK) return st;
    return dev->embedding_bwd(fn, pl.device, I.data, I.dtype == BX_TC_I64, D.data, R.data, off,
                              W.data, T, H, b.C, nchunks, b.total);
  }
  b.per = H >= 1024 ? 4 : 4096 / (H ? H : 1);
  size_t tasks = (b.total + b.per - 1) / b.per;
  if (tasks) bx_parallel_run(bx_tc_threads(o->num_threads, tasks), tasks, rows_task, &b);
  memcpy(off, b.off, (nchunks + 1) * sizeof *off);
  return BX_OK;
}

bx_status bx_embedding_backward(const DLTensor *ids, const DLTensor *dy, int64_t num_embeddings,
                                int64_t chunk_tokens, DLTensor *row_ids, DLTensor *rows,
                                DLTensor *offsets, const bx_embedding_opts *opts) {
  static const char *fn = "bx_embedding_backward";
  bx_embedding_opts o;
  bx_call c;
  bx_status st = enter(&c, fn, opts, &o);
  if (st != BX_OK) return st;
  st = backward_impl(fn, ids, dy, num_embeddings, chunk_tokens, row_ids, rows, offsets, &o);
  bx_call_leave(&c);
  return st;
}

/* ---- feeding compact partials to bx_tokred ---------------------------- */

/* rows [R, H] fp32 and offsets [n + 1] int64 from 0, non-decreasing, at
 * most R: the checks of both helpers (tensor numbers: rows 1, offsets 2,
 * or as given). */
static bx_status check_compact(const char *fn, const DLTensor *rows, size_t irows,
                               const DLTensor *offsets, size_t ioff, bx_tc_tensor *W, bx_tc_tensor *F) {
  bx_status st = bx_tc_check(fn, irows, "rows", rows, BX_TC_F32, 2, 2, NULL, 0, W);
  if (st == BX_OK) st = bx_tc_check(fn, ioff, "offsets", offsets, BX_TC_I64, 1, 1, NULL, 0, F);
  if (st != BX_OK) return st;
  if (F->n == 0)
    return bx_fail_at(BX_EINVAL, -1, BX_NO_INDEX, ioff,
                      "%s: tensor %zu (offsets) is empty; it has nchunks + 1 >= 1 entries", fn,
                      ioff);
  const int64_t *off = (const int64_t *)(const void *)F->data;
  if (off[0] != 0)
    return bx_fail_at(BX_EINVAL, -1, BX_NO_INDEX, ioff,
                      "%s: tensor %zu (offsets): offsets[0] = %lld, want 0", fn, ioff,
                      (long long)off[0]);
  for (size_t j = 1; j < F->n; j++)
    if (off[j] < off[j - 1] || off[j] > W->dim[0])
      return bx_fail_at(BX_EINVAL, -1, BX_NO_INDEX, ioff,
                        "%s: tensor %zu (offsets): offsets[%zu] = %lld is below offsets[%zu] or "
                        "past the %lld rows", fn, ioff, j, (long long)off[j], j - 1,
                        (long long)W->dim[0]);
  return BX_OK;
}

/* Largest |bits| of the finite elements of a[0..n). */
static uint32_t max_finite_abs(const float *a, size_t n) {
  uint32_t mx = 0;
  for (size_t i = 0; i < n; i++) {
    uint32_t b;
    memcpy(&b, &a[i], sizeof b);
    b &= 0x7fffffffu;
    if (b < 0x7f800000u && b > mx) mx = b;
  }
  return mx;
}

/* An error of a nested tokred call, renamed as this call's. */
static bx_status renamed(const char *fn, bx_status st, size_t tensor) {
  return bx_fail_at(st, -1, BX_NO_INDEX, tensor, "%s: %s", fn, bx_last_error());
}

static bx_status grad_bound_impl(const char *fn, bx_tokred *s, size_t tensor,
                                 const DLTensor *rows, const DLTensor *offsets) {
  if (!s) return bx_fail(BX_EINVAL, "%s: s is NULL", fn);
  bx_tc_tensor W, F;
  bx_status st = check_compact(fn, rows, 1, offsets, 2, &W, &F);
  if (st != BX_OK) return st;
  size_t used = (size_t)((const int64_t *)(const void *)F.data)[F.n - 1];
  int E = bx_tokred_exp_of_abs(
      max_finite_abs((const float *)(const void *)W.data, used * (size_t)W.dim[1]));
  st = bx_tokred_bound_exp(s, tensor, E);
  return st == BX_OK ? st : renamed(fn, st, tensor);
}

bx_status bx_embedding_grad_bound(bx_tokred *s, size_t tensor, const DLTensor *rows,
                                  const DLTensor *offsets) {
  static const char *fn = "bx_embedding_grad_bound";
  bx_call c;
  bx_status st = bx_call_enter(&c, fn);
  if (st != BX_OK) return st;
  st = grad_bound_impl(fn, s, tensor, rows, offsets);
  bx_call_leave(&c);
  return st;
}

/* Grid mode: the words of bx_tokred_add for the dense partials, from the
 * compact rows. All checks first; then the additions, which cannot fail. */
static bx_status add_words(const char *fn, bx_tokred *s, const DLTensor *grads, size_t ntensors,
                           size_t tensor, int64_t first_chunk, const int64_t *ids,
                           const float *rows, const int64_t *off, size_t nch, size_t H,
                           int64_t *w, size_t count) {
  size_t before = 0, wsum = 0;
  for (size_t t = 0; t < ntensors; t++) {
    uint64_t n = 1;
    if (grads[t].ndim < 0 || (grads[t].ndim > 0 && !grads[t].shape))
      return bx_fail_at(BX_EINVAL, -1, BX_NO_INDEX, t, "%s: grads[%zu]: bad ndim or shape", fn, t);
    for (int d = 0; d < grads[t].ndim; d++) {
      if (grads[t].shape[d] < 0 || (grads[t].shape[d] && n > ((uint64_t)1 << 50) /
                                    (uint64_t)grads[t].shape[d]))
        return bx_fail_at(BX_EINVAL, -1, BX_NO_INDEX, t, "%s: grads[%zu]: bad shape", fn, t);
      n *= (uint64_t)grads[t].shape[d];
    }
    if (t == tensor) before = wsum;
    wsum += (size_t)n + 1;
  }
  if (count < wsum || (count - wsum) % ntensors)
    return bx_fail(BX_EINVAL, "%s: grads (%zu tensors) does not describe the state: %zu words",
                   fn, ntensors, count);
  int64_t nchunks = (int64_t)((count - wsum) / ntensors);
  if (first_chunk > nchunks || (int64_t)nch > nchunks - first_chunk)
    return bx_fail_at(BX_EINVAL, -1, BX_NO_INDEX, tensor,
                      "%s: chunks [%lld, %lld) are not inside the state's [0, %lld)", fn,
                      (long long)first_chunk, (long long)(first_chunk + (int64_t)nch),
                      (long long)nchunks);
  int e;
  bx_status st = bx_tokred_grid_exp(s, tensor, &e);
  if (st != BX_OK) return renamed(fn, st, tensor);
  int E = e + bx_tokred_precision(nchunks);
  uint32_t lim = bx_tokred_abs_limit(E);
  size_t used = (size_t)off[nch];
  uint32_t mx = used ? bx_tokred_kernels_active()->max_abs(rows, used * H) : 0;
  for (size_t k = 0; bx_tokred_breaks(s, tensor, mx) && k < used; k++)
    for (size_t h = 0; h < H; h++) {
      uint32_t b;
      memcpy(&b, &rows[k * H + h], sizeof b);
      b &= 0x7fffffffu;
      if (b >= lim && b < 0x7f800000u) {
        size_t j = 0;
        while ((size_t)off[j + 1] <= k) j++;
        return bx_fail_at(BX_EINVAL, -1, BX_NO_INDEX, tensor,
                          "%s: tensor %zu, chunk %lld, row %zu (id %lld), element %zu: |%a| is "
                          "not below the agreed bound 2^%d; nothing was added",
                          fn, tensor, (long long)(first_chunk + (int64_t)j), k, (long long)ids[k],
                          h, (double)rows[k * H + h], E);
      }
    }
  double inv = bx_tokred_pow2(-e);
  int64_t *g = w + before, nf = 0;
  for (size_t k = 0; k < used; k++) {
    int64_t *gr = g + (size_t)ids[k] * H;
    for (size_t h = 0; h < H; h++) {
      float a = rows[k * H + h];
      uint32_t b;
      memcpy(&b, &a, sizeof b);
      if ((b & 0x7fffffffu) < 0x7f800000u) /* modulo 2^64: a flagged add may wrap */
        gr[h] = (int64_t)((uint64_t)gr[h] + (uint64_t)bx_tokred_q(a, inv));
      else nf++;
    }
  }
  size_t V = (size_t)grads[tensor].shape[0];
  g[V * H] += nf;
  if (used) bx_tokred_observe(s, tensor, mx);
  int64_t *cover = w + wsum + tensor * (size_t)nchunks + (size_t)first_chunk;
  for (size_t j = 0; j < nch; j++) cover[j] += 1;
  return BX_OK;
}

/* Ordinary mode (or a state not agreed: bx_tokred_add says so): dense
 * partials through bx_tokred_add, last chunk first. */
static bx_status add_dense(const char *fn, bx_tokred *s, size_t tensor, int64_t first_chunk,
                           const int64_t *ids, const float *rows, const int64_t *off, size_t nch,
                           int64_t V, size_t H) {
  if (nch == 0) return BX_OK;
  size_t nel = (size_t)V * H;
  float *dense = calloc(nel > 0 ? nel : 1, sizeof *dense);
  if (!dense)
    return bx_fail(BX_ENOMEM, "%s: cannot allocate the dense [%lld, %zu] partial", fn,
                   (long long)V, H);
  int64_t shape[2] = {V, (int64_t)H};
  DLTensor d;
  memset(&d, 0, sizeof d);
  d.data = dense;
  d.device.device_type = kDLCPU;
  d.ndim = 2;
  d.shape = shape;
  d.dtype.code = kDLFloat;
  d.dtype.bits = 32;
  d.dtype.lanes = 1;
  bx_status st = BX_OK;
  for (size_t j = nch; j-- > 0 && st == BX_OK;) {
    for (int64_t k = off[j]; k < off[j + 1]; k++)
      memcpy(dense + (size_t)ids[k] * H, rows + (size_t)k * H, H * sizeof *dense);
    st = bx_tokred_add(s, tensor, first_chunk + (int64_t)j, &d);
    for (int64_t k = off[j]; k < off[j + 1]; k++)
      memset(dense + (size_t)ids[k] * H, 0, H * sizeof *dense);
  }
  free(dense);
  return st == BX_OK ? st : renamed(fn, st, tensor);
}

static bx_status grad_add_impl(const char *fn, bx_tokred *s, const DLTensor *grads,
                               size_t ntensors, size_t tensor, int64_t first_chunk,
                               const DLTensor *row_ids, const DLTensor *rows,
                               const DLTensor *offsets) {
  if (!s) return bx_fail(BX_EINVAL, "%s: s is NULL", fn);
  if (!grads || tensor >= ntensors)
    return bx_fail(BX_EINVAL, "%s: %s", fn,
                   !grads ? "grads is NULL" : "tensor is not below ntensors");
  const DLTensor *g = &grads[tensor];
  if (g->ndim != 2 || !g->shape || g->shape[0] < 1 || g->shape[1] < 0)
    return bx_fail_at(BX_EINVAL, -1, BX_NO_INDEX, tensor,
                      "%s: grads[%zu] must be the [V, H] embedding gradient", fn, tensor);
  if (first_chunk < 0)
    return bx_fail(BX_EINVAL, "%s: first_chunk %lld is negative", fn, (long long)first_chunk);
  bx_tc_tensor R, W, F;
  bx_status st = bx_tc_check(fn, 0, "row_ids", row_ids, BX_TC_I64, 1, 1, NULL, 0, &R);
  if (st == BX_OK) st = check_compact(fn, rows, 1, offsets, 2, &W, &F);
  if (st != BX_OK) return st;
  int64_t V = g->shape[0];
  size_t H = (size_t)g->shape[1];
  if ((size_t)W.dim[1] != H || R.dim[0] != W.dim[0])
    return bx_fail_at(BX_EINVAL, -1, BX_NO_INDEX, 1,
                      "%s: tensor 1 (rows) must be [R, H = %zu] with row_ids [R]", fn, H);
  const int64_t *ids = (const int64_t *)(const void *)R.data;
  const int64_t *off = (const int64_t *)(const void *)F.data;
  const float *rv = (const float *)(const void *)W.data;
  size_t nch = F.n - 1;
  for (size_t j = 0; j < nch; j++)
    for (int64_t k = off[j]; k < off[j + 1]; k++)
      if (ids[k] < 0 || ids[k] >= V || (k > off[j] && ids[k] <= ids[k - 1]))
        return bx_fail_at(BX_EINVAL, -1, BX_NO_INDEX, 0,
                          "%s: tensor 0 (row_ids): chunk %zu, row %lld has id %lld: ids must be "
                          "in [0, %lld) and strictly ascending within a chunk", fn, j,
                          (long long)k, (long long)ids[k], (long long)V);
  int64_t *w;
  size_t count;
  bx_error_saved saved;
  bx_error_save(&saved);
  st = bx_tokred_words(s, &w, &count);
  if (st == BX_OK)
    return add_words(fn, s, grads, ntensors, tensor, first_chunk, ids, rv, off, nch, H, w, count);
  bx_error_restore(&saved);
  return add_dense(fn, s, tensor, first_chunk, ids, rv, off, nch, V, H);
}

bx_status bx_embedding_grad_add(bx_tokred *s, const DLTensor *grads, size_t ntensors,
                                size_t tensor, int64_t first_chunk, const DLTensor *row_ids,
                                const DLTensor *rows, const DLTensor *offsets) {
  static const char *fn = "bx_embedding_grad_add";
  bx_call c;
  bx_status st = bx_call_enter(&c, fn);
  if (st != BX_OK) return st;
  st = grad_add_impl(fn, s, grads, ntensors, tensor, first_chunk, row_ids, rows, offsets);
  bx_call_leave(&c);
  return st;
}
