/*
 * scale.c — bx_scale (multi-tensor g *= coef with a documented rounding),
 * bx_clip_coef and bx_clip_grad_norm. Every check runs before the first
 * write, so a failing call leaves all gradients as they were.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

#define PIECE ((size_t)1 << 16) /* elements per scaling task */

typedef struct scale_item {
  void *data;
  size_t n;
  bx_dtype dt;
} scale_item;

typedef struct scale_job {
  const scale_item *items;
  double coef;
  bx_scale_mode mode;
} scale_job;

static void run_scale(void *ctx, size_t t, int worker) {
  (void)worker;
  const scale_job *j = ctx;
  const scale_item *it = &j->items[t];
  const bx_scale_kernels *k = bx_scale_kernels_active();
  bx_scale_fn f = j->mode == BX_SCALE_EXACT ? k->exact[it->dt] : k->torch[it->dt];
  f(it->data, it->n, j->coef);
}

/* ---- validation shared by bx_scale and bx_clip_grad_norm ------------- */

typedef struct interval {
  uintptr_t lo, hi; /* [lo, hi) bytes */
  size_t group, index;
} interval;

static int cmp_interval(const void *a, const void *b) {
  const interval *x = a, *y = b;
  return x->lo < y->lo ? -1 : x->lo > y->lo;
}

static void name_of(char *buf, size_t len, size_t group, size_t index) {
  if (group == BX_NO_GROUP) snprintf(buf, len, "tensor %zu", index);
  else snprintf(buf, len, "group %zu, tensor %zu", group, index);
}

/* Tensors to scale, given either as one array (groups == NULL) or as
 * groups; every one is validated, spans must not overlap. On success the
 * workspace holds the scale items and *nitems their number. */
static bx_status prepare_scale(const char *fn, const DLTensor *flat, size_t count,
                               const bx_group *groups, size_t ngroups, int cuda,
                               scale_item **items_out, size_t *nitems_out) {
  size_t ntensors = 0, nitems = 0;
  size_t ng = groups ? ngroups : 1;
  for (size_t g = 0; g < ng; g++) {
    const DLTensor *ts = groups ? groups[g].tensors : flat;
    size_t cnt = groups ? groups[g].count : count;
    size_t gid = groups ? g : BX_NO_GROUP;
    if (cnt > 0 && !ts)
      return groups ? bx_fail(BX_EINVAL, "%s: group %zu: tensors is NULL with count %zu", fn, g, cnt)
                    : bx_fail(BX_EINVAL, "%s: tensors is NULL with count %zu", fn, cnt);
    for (size_t i = 0; i < cnt; i++) {
      bx_span s;
      bx_status st = cuda ? bx_tensor_span_cuda(&ts[i], fn, gid, i, &s)
                          : bx_tensor_span(&ts[i], fn, gid, i, &s);
      if (st != BX_OK) return st;
      ntensors++;
      nitems += (s.n + PIECE - 1) / PIECE;
    }
  }
  size_t ib = ntensors * sizeof(interval);
  char *ws = bx_workspace(ib + nitems * sizeof(scale_item) + 16);
  if (!ws) return bx_fail(BX_ENOMEM, "%s: cannot allocate workspace", fn);
  interval *iv = (interval *)ws;
  scale_item *items = (scale_item *)(ws + ib);
  size_t k = 0, it = 0;
  for (size_t g = 0; g < ng; g++) {
    const DLTensor *ts = groups ? groups[g].tensors : flat;
    size_t cnt = groups ? groups[g].count : count;
    for (size_t i = 0; i < cnt; i++) {
      bx_span s;
      if (cuda) bx_tensor_span_cuda(&ts[i], fn, BX_NO_GROUP, i, &s);
      else bx_tensor_span(&ts[i], fn, BX_NO_GROUP, i, &s);
      if (s.n == 0) continue;
      size_t es = bx_dtype_size(s.dtype);
      iv[k].lo = (uintptr_t)s.data;
      iv[k].hi = (uintptr_t)s.data + s.n * es;
      iv[k].group = groups ? g : BX_NO_GROUP;
      iv[k].index = i;
      k++;
      for (size_t off = 0; off < s.n; off += PIECE) {
        items[it].data = (char *)s.data + off * es;
        items[it].n = s.n - off < PIECE ? s.n - off : PIECE;
        items[it].dt = s.dtype;
        it++;
      }
    }
  }
  qsort(iv, k, sizeof *iv, cmp_interval);
  for (size_t i = 1; i < k; i++)
    if (iv[i].lo < iv[i - 1].hi) {
      char a[64], b[64];
      name_of(a, sizeof a, iv[i - 1].group, iv[i - 1].index);
      name_of(b, sizeof b, iv[i].group, iv[i].index);
      return bx_fail(BX_ELAYOUT,
                     "%s: %s and %s share memory (the same tensor twice, or "
                     "overlapping views); each element must be scaled once",
                     fn, a, b);
    }
  *items_out = items;
  *nitems_out = it;
  return BX_OK;
}

bx_status bx_validate_scale_targets(const char *fn, const DLTensor *flat, size_t count,
                                    const bx_group *groups, size_t ngroups, int cuda) {
  scale_item *items;
  size_t nitems;
  return prepare_scale(fn, flat, count, groups, ngroups, cuda, &items, &nitems);
}

static bx_status check_scale_opts(const char *fn, const bx_scale_opts *o) {
  if (o->mode != BX_SCALE_TORCH && o->mode != BX_SCALE_EXACT)
    return bx_fail(BX_EINVAL, "%s: unknown scale mode %d", fn, o->mode);
  if (o->num_threads < 0) return bx_fail(BX_EINVAL, "%s: num_threads %d is negative", fn, o->num_threads);
  return BX_OK;
}

static void run_scale_items(scale_item *items, size_t nitems, double coef,
                            const bx_scale_opts *o) {
  size_t total = nitems * PIECE;
  int nthreads = o->num_threads > 0 ? o->num_threads : bx_default_threads();
  if ((size_t)nthreads > total / (1u << 16) + 1) nthreads = (int)(total / (1u << 16) + 1);
  scale_job j = {items, coef, o->mode};
  bx_parallel_run(nthreads, nitems, run_scale, &j);
}

bx_status bx_scale(DLTensor *tensors, size_t count, double coef, const bx_scale_opts *opts) {
  static const char *fn = "bx_scale";
  bx_scale_opts o = BX_SCALE_OPTS_DEFAULT;
  if (opts) o = *opts;
  bx_status st = check_scale_opts(fn, &o);
  if (st != BX_OK) return st;
  if (coef != coef) return bx_fail(BX_EINVAL, "%s: coef is NaN", fn);
  bx_where where;
  st = bx_tensors_where(fn, NULL, 0, tensors, count, &where);
  if (st != BX_OK) return st;
  scale_item *items;
  size_t nitems;
  st = prepare_scale(fn, tensors, count, NULL, 0, where == BX_ON_CUDA, &items, &nitems);
  if (st != BX_OK) return st;
  if (where == BX_ON_CUDA) return bx_cuda_scale_blocking(fn, tensors, count, NULL, 0, coef, &o, 0);
  run_scale_items(items, nitems, coef, &o);
  return BX_OK;
}

/* ---- clipping ---------------------------------------------------------- */

bx_status bx_clip_coef(double total_norm, double max_norm, const bx_clip_opts *opts,
                       double *coef) {
  bx_clip_opts o = BX_CLIP_OPTS_DEFAULT;
  if (opts) o = *opts;
  if (!coef) return bx_fail(BX_EINVAL, "bx_clip_coef: coef is NULL");
  if (!(max_norm >= 0)) return bx_fail(BX_EINVAL, "bx_clip_coef: max_norm %g is negative or NaN", max_norm);
  if (!(o.eps >= 0)) return bx_fail(BX_EINVAL, "bx_clip_coef: eps %g is negative or NaN", o.eps);
  double c;
  if (max_norm == 0.0) c = 1.0;
  else if (o.formula == BX_COEF_TORCH) c = max_norm / (total_norm + o.eps);
  else if (o.formula == BX_COEF_MAX) c = max_norm / (total_norm > max_norm || total_norm != total_norm ? total_norm : max_norm);
  else return bx_fail(BX_EINVAL, "bx_clip_coef: unknown formula %d", o.formula);
  if (c > 1.0) c = 1.0; /* NaN stays NaN, as torch.clamp */
  *coef = c;
  return BX_OK;
}

bx_status bx_clip_grad_norm(const bx_group *groups, size_t ngroups, const bx_comm *comm,
                            double max_norm, const bx_clip_opts *opts, double *total_norm,
                            double *coef) {
  static const char *fn = "bx_clip_grad_norm";
  bx_clip_opts o = BX_CLIP_OPTS_DEFAULT;
  if (opts) o = *opts;
  /* Local checks. With a communicator a failure here still goes through
   * the agreement step (bx_norm_agreed with prior != BX_OK), so the other
   * ranks fail too instead of waiting in the collective. */
  bx_status st = BX_OK;
  scale_item *items;
  size_t nitems;
  bx_where where = BX_ON_HOST;
  if (!(max_norm >= 0)) st = bx_fail(BX_EINVAL, "%s: max_norm %g is negative or NaN", fn, max_norm);
  else if (!(o.eps >= 0)) st = bx_fail(BX_EINVAL, "%s: eps %g is negative or NaN", fn, o.eps);
  else if (o.formula != BX_COEF_TORCH && o.formula != BX_COEF_MAX)
    st = bx_fail(BX_EINVAL, "%s: unknown formula %d", fn, o.formula);
  else if (!total_norm) st = bx_fail(BX_EINVAL, "%s: total_norm is NULL", fn);
  else if ((st = check_scale_opts(fn, &o.scale)) != BX_OK) {
  } else if (ngroups > 0 && !groups)
    st = bx_fail(BX_EINVAL, "%s: groups is NULL with ngroups %zu", fn, ngroups);
  else if ((st = bx_tensors_where(fn, groups, ngroups, NULL, 0, &where)) != BX_OK) {
  } else /* layout checks (overlap) before the expensive norm */
    st = prepare_scale(fn, NULL, 0, groups, ngroups, where == BX_ON_CUDA, &items, &nitems);
  if (st != BX_OK && !comm) return st;

  double norm, c;
  /* in a multi-rank call, every rank must also agree on the clip options */
  int64_t mn, ep;
  memcpy(&mn, &max_norm, 8);
  memcpy(&ep, &o.eps, 8);
  const bx_agree_item extra[] = {{"max_norm", mn},
                                 {"eps", ep},
                                 {"the coefficient formula", (int64_t)o.formula},
                                 {"the scale mode", (int64_t)o.scale.mode}};
  st = bx_norm_agreed(fn, groups, ngroups, comm, &o.norm, extra, 4, st, &norm, NULL);
  if (st != BX_OK) return st;
  bx_clip_coef(norm, max_norm, &o, &c);
  if (c != 1.0 && where == BX_ON_CUDA) {
    st = bx_cuda_scale_blocking(fn, NULL, 0, groups, ngroups, c, &o.scale, 1);
    if (st != BX_OK) return st;
  } else if (c != 1.0) {
    /* the norm call reused the workspace: build the items again */
    st = prepare_scale(fn, NULL, 0, groups, ngroups, 0, &items, &nitems);
    if (st != BX_OK) return st;
    run_scale_items(items, nitems, c, &o.scale);
  }
  *total_norm = norm;
  if (coef) *coef = c;
  return BX_OK;
}
