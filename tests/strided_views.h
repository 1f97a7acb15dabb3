/*
 * strided_views.h — strided views for the tests of test_strided.c and
 * test_negative_p.c: a buffer, a DLTensor view of it with any strides
 * (gaps, permuted, negative, zero), and the dense row-major copy of the
 * view's logical elements, made by walking the view's indices (the
 * reference: written without the library's layout code).
 */
#ifndef BX_TEST_STRIDED_VIEWS_H
#define BX_TEST_STRIDED_VIEWS_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "util.h"

typedef struct bxt_sview {
  bxt_tensor store; /* the buffer */
  DLTensor t;       /* the view: shape, strides below */
  int64_t shape[4], strides[4];
  bxt_tensor dense; /* the logical elements, row-major */
  size_t origin;    /* the store's element at index (0, ..., 0) */
} bxt_sview;

/* Visit the view's logical elements in row-major order: fn(ctx, i, at)
 * with i the row-major index and at the store's element. */
static inline void bxt_sview_walk(const bxt_sview *v, void (*fn)(void *, size_t, size_t),
                                  void *ctx) {
  int nd = v->t.ndim;
  size_t n = 1;
  for (int d = 0; d < nd; d++) n *= (size_t)v->shape[d];
  int64_t idx[4] = {0, 0, 0, 0}, off = 0;
  for (size_t i = 0; i < n; i++) {
    fn(ctx, i, (size_t)((int64_t)v->origin + off));
    for (int d = nd - 1; d >= 0; d--) { /* the last index fastest */
      off += v->strides[d];
      if (++idx[d] < v->shape[d]) break;
      off -= v->strides[d] * v->shape[d];
      idx[d] = 0;
    }
  }
}

static inline void bxt_sview_copy_(void *ctx, size_t i, size_t at) {
  bxt_sview *v = ctx;
  bxt_set_bits(&v->dense, i, bxt_get_bits(&v->store, at));
}

/* (Re)make the dense copy from the store. */
static inline void bxt_sview_refresh(bxt_sview *v) { bxt_sview_walk(v, bxt_sview_copy_, v); }

/* A view of dtype dt with the given shape and strides (elements) on a
 * fresh buffer of mixed values with a few elements of padding each side. */
static inline void bxt_sview_make(bxt_rng *r, bxt_sview *v, int dt, int ndim, const int64_t *sh,
                                  const int64_t *st) {
  memset(v, 0, sizeof *v);
  int64_t back = 0, reach = 0;
  size_t n = 1;
  for (int d = 0; d < ndim; d++) {
    v->shape[d] = sh[d];
    v->strides[d] = st[d];
    n *= (size_t)sh[d];
    if (sh[d] > 0) {
      if (st[d] < 0) back += -st[d] * (sh[d] - 1);
      else reach += st[d] * (sh[d] - 1);
    }
  }
  size_t before = (size_t)bxt_below(r, 4), after = (size_t)bxt_below(r, 4);
  bxt_tensor_alloc(&v->store, dt, before + (size_t)(back + reach) + 1 + after);
  bxt_fill_mixed(r, &v->store);
  v->origin = before + (size_t)back;
  v->t = v->store.t;
  v->t.ndim = ndim;
  v->t.shape = v->shape;
  v->t.strides = v->strides;
  v->t.byte_offset = v->origin * bxt_dt_size(dt);
  bxt_tensor_alloc(&v->dense, dt, n);
  bxt_sview_refresh(v);
}

/* A random view: 1 to 4 dims of sizes 1..8 (rarely 0), at most maxn
 * elements, in a random order of strides with random gaps and signs; with
 * overlapping = 1 also stride-0 and overlapping strides. */
static inline void bxt_sview_random(bxt_rng *r, bxt_sview *v, int dt, int disjoint, size_t maxn) {
  int ndim = 1 + (int)bxt_below(r, 4), perm[4] = {0, 1, 2, 3};
  int64_t sh[4], st[4];
  size_t n = 1;
  for (int d = 0; d < ndim; d++) {
    sh[d] = 1 + (int64_t)bxt_below(r, 8);
    if (n * (size_t)sh[d] > maxn) sh[d] = 1;
    n *= (size_t)sh[d];
  }
  if (bxt_below(r, 30) == 0) sh[bxt_below(r, (uint64_t)ndim)] = 0;
  bxt_shuffle(r, perm, (size_t)ndim, sizeof perm[0]);
  int64_t ext = 1; /* elements the inner dims reach, + 1 */
  for (int k = 0; k < ndim; k++) {
    int d = perm[k];
    int64_t s = ext * (bxt_below(r, 2) ? 1 : 1 + (int64_t)bxt_below(r, 3)) +
                (bxt_below(r, 3) ? 0 : (int64_t)bxt_below(r, 3));
    if (!disjoint && bxt_below(r, 7) == 0) s = 0;
    else if (!disjoint && bxt_below(r, 10) == 0) s = 1 + (int64_t)bxt_below(r, (uint64_t)ext);
    ext = s * (sh[d] > 0 ? sh[d] - 1 : 0) + ext;
    st[d] = bxt_below(r, 3) == 0 ? -s : s;
  }
  bxt_sview_make(r, v, dt, ndim, sh, st);
}

typedef struct bxt_sview_cmp_ {
  const bxt_sview *v;
  const bxt_tensor *before;
  unsigned char *covered;
  int ok;
} bxt_sview_cmp_;

static inline void bxt_sview_match_(void *ctx, size_t i, size_t at) {
  bxt_sview_cmp_ *c = ctx;
  if (bxt_get_bits(&c->v->store, at) != bxt_get_bits(&c->v->dense, i)) c->ok = 0;
  if (c->covered) c->covered[at] = 1;
}

/* Does every logical element hold the dense copy's bits? */
static inline int bxt_sview_matches(const bxt_sview *v) {
  bxt_sview_cmp_ c = {v, NULL, NULL, 1};
  bxt_sview_walk(v, bxt_sview_match_, &c);
  return c.ok;
}

/* Are the store's elements outside the view as in before (a clone)? */
static inline int bxt_sview_gaps_kept(const bxt_sview *v, const bxt_tensor *before) {
  bxt_sview_cmp_ c = {v, before, calloc(v->store.n, 1), 1};
  bxt_sview_walk(v, bxt_sview_match_, &c);
  int ok = 1;
  for (size_t i = 0; i < v->store.n; i++)
    if (!c.covered[i] && bxt_get_bits(&v->store, i) != bxt_get_bits(before, i)) ok = 0;
  free(c.covered);
  return ok;
}

static inline void bxt_sview_free(bxt_sview *v) {
  bxt_tensor_free(&v->store);
  bxt_tensor_free(&v->dense);
}

#endif /* BX_TEST_STRIDED_VIEWS_H */
