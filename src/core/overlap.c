/*
 * overlap.c — bx_check_writable (tensor.h): may these tensors be written
 * in place, each logical element once? Refused (BX_ELAYOUT, nothing
 * written by anyone yet): a tensor whose own logical elements share
 * memory (an expanded, stride-0 view, or strides that overlap), and two
 * tensors that share a byte.
 *
 * Two tensors are compared by their address ranges first (sorted, one
 * sweep): disjoint ranges share nothing; overlapping ranges of two dense
 * tensors share bytes (today's fast path, the only one for CUDA tensors,
 * which are dense). Only ranges that overlap with a strided tensor among
 * them (e.g. the even and odd columns of one buffer: interleaved, but
 * disjoint) are decided exactly: a bitmap over their common address range,
 * one bit per unit of the smallest element size, every element's units
 * marked in turn; a unit marked twice is a shared byte. The bitmap is
 * heap memory of at most 2^31 bits (256 MiB); a wider range is refused
 * with a message saying so. Calling thread only.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tensor.h"
#include "workspace.h"

#define MAX_BITS ((uint64_t)1 << 31)

typedef struct interval {
  uintptr_t lo, hi; /* [lo, hi) bytes: every element lies inside */
  size_t group, index;
  const DLTensor *t;
  int dense;        /* its elements fill [lo, hi) */
} interval;

static int cmp_interval(const void *a, const void *b) {
  const interval *x = a, *y = b;
  if (x->lo != y->lo) return x->lo < y->lo ? -1 : 1;
  if (x->group != y->group) return x->group < y->group ? -1 : 1;
  return x->index < y->index ? -1 : x->index > y->index;
}

static void name_of(char *buf, size_t len, size_t group, size_t index) {
  if (group == BX_NO_GROUP) snprintf(buf, len, "tensor %zu", index);
  else snprintf(buf, len, "group %zu, tensor %zu", group, index);
}

/* Set bits [u0, u1) of map; the first that was set already, or -1. */
static int64_t mark(uint64_t *map, uint64_t u0, uint64_t u1) {
  for (uint64_t u = u0; u < u1;) {
    uint64_t w = u >> 6, b0 = u & 63, b1 = (u1 - (u & ~(uint64_t)63)) < 64 ? (u1 & 63) : 64;
    uint64_t bits = (b1 == 64 ? ~(uint64_t)0 : ((uint64_t)1 << b1) - 1) & ~(((uint64_t)1 << b0) - 1);
    uint64_t hit = map[w] & bits;
    if (hit) return (int64_t)((w << 6) + (uint64_t)__builtin_ctzll(hit));
    map[w] |= bits;
    u = (w + 1) << 6;
  }
  return -1;
}

/* Does the tensor of iv hold a byte at address a? (failure path only) */
static int covers(const interval *iv, uintptr_t a) {
  if (a < iv->lo || a >= iv->hi) return 0;
  if (iv->dense) return 1;
  bx_layout l;
  bx_tensor_layout(iv->t, "", BX_NO_GROUP, 0, &l);
  size_t es = bx_dtype_size(l.dtype);
  bx_layout_cursor c;
  bx_layout_seek(&c, &l, 0);
  for (size_t done = 0; done < l.n;) {
    size_t k;
    uintptr_t at = (uintptr_t)bx_layout_run(&c, l.n - done, &k);
    if (a >= at && a < at + k * es) return 1;
    done += k;
  }
  return 0;
}

static bx_status refuse_self(const char *fn, const interval *iv, const char *why) {
  char a[64];
  name_of(a, sizeof a, iv->group, iv->index);
  return bx_fail_at(BX_ELAYOUT, -1, iv->group, iv->index,
                    "%s: %s: %s, so it cannot be scaled in place (torch's mul_ refuses it "
                    "too); pass a tensor that owns its elements (.contiguous() or .clone()); "
                    "nothing was modified",
                    fn, a, why);
}

static bx_status refuse_pair(const char *fn, const interval *x, const interval *y) {
  char a[64], b[64];
  name_of(a, sizeof a, x->group, x->index);
  name_of(b, sizeof b, y->group, y->index);
  return bx_fail_at(BX_ELAYOUT, -1, y->group, y->index,
                    "%s: %s and %s share memory (the same tensor twice, or overlapping "
                    "views); each element must be scaled once, nothing was modified",
                    fn, a, b);
}

/* The exact check of iv[0..m) (sorted; m == 1: a tensor against itself). */
static bx_status exact_check(const char *fn, const interval *iv, size_t m) {
  uintptr_t lo = iv[0].lo, hi = iv[0].hi;
  size_t unit = 8;
  for (size_t i = 0; i < m; i++) {
    bx_dtype dt;
    bx_dtype_from_dl(iv[i].t->dtype, &dt);
    if (bx_dtype_size(dt) < unit) unit = bx_dtype_size(dt);
    if (iv[i].hi > hi) hi = iv[i].hi;
  }
  uint64_t bits = (uint64_t)(hi - lo) / unit;
  if (bits > MAX_BITS) {
    char a[64], b[64];
    name_of(a, sizeof a, iv[0].group, iv[0].index);
    name_of(b, sizeof b, iv[m > 1].group, iv[m > 1].index);
    if (m == 1)
      return bx_fail_at(BX_ELAYOUT, -1, iv[0].group, iv[0].index,
                        "%s: %s: cannot decide whether its strides make elements share "
                        "memory: they span %llu elements (the exact check handles 2^31); "
                        "pass a contiguous tensor; nothing was modified",
                        fn, a, (unsigned long long)bits);
    return bx_fail_at(BX_ELAYOUT, -1, iv[1].group, iv[1].index,
                      "%s: cannot decide whether %s and %s share memory: strided views "
                      "interleaved over %llu bytes (the exact check handles 2^31 units of "
                      "%zu bytes); pass contiguous tensors; nothing was modified",
                      fn, a, b, (unsigned long long)(hi - lo), unit);
  }
  uint64_t *map = calloc((size_t)(bits / 64 + 1), sizeof *map);
  if (!map)
    return bx_fail(BX_ENOMEM, "%s: cannot allocate %llu bytes for the overlap check", fn,
                   (unsigned long long)(bits / 8 + 8));
  bx_status st = BX_OK;
  for (size_t i = 0; i < m && st == BX_OK; i++) {
    bx_layout l;
    bx_tensor_layout(iv[i].t, "", BX_NO_GROUP, 0, &l);
    size_t es = bx_dtype_size(l.dtype);
    bx_layout_cursor c;
    bx_layout_seek(&c, &l, 0);
    for (size_t done = 0; done < l.n;) {
      size_t k;
      uintptr_t at = (uintptr_t)bx_layout_run(&c, l.n - done, &k);
      int64_t u = mark(map, (at - lo) / unit, (at - lo + k * es) / unit);
      if (u >= 0) { /* a byte marked before: by which tensor? */
        uintptr_t a = lo + (uintptr_t)u * unit;
        size_t j = 0;
        while (j < i && !covers(&iv[j], a)) j++;
        st = j < i ? refuse_pair(fn, &iv[j], &iv[i])
                   : refuse_self(fn, &iv[i], "its strides make logical elements share memory");
        break;
      }
      done += k;
    }
  }
  free(map);
  return st;
}

bx_status bx_check_writable(const char *fn, const DLTensor *flat, size_t count,
                            const bx_group *groups, size_t ngroups, int cuda) {
  size_t ng = groups ? ngroups : 1, ntensors = 0;
  for (size_t g = 0; g < ng; g++) {
    const DLTensor *ts = groups ? groups[g].tensors : flat;
    size_t cnt = groups ? groups[g].count : count;
    size_t gid = groups ? g : BX_NO_GROUP;
    if (cnt > 0 && !ts)
      return groups ? bx_fail_at(BX_EINVAL, -1, g, BX_NO_INDEX,
                                 "%s: group %zu: tensors is NULL with count %zu", fn, g, cnt)
                    : bx_fail(BX_EINVAL, "%s: tensors is NULL with count %zu", fn, cnt);
    for (size_t i = 0; i < cnt; i++) {
      bx_status st;
      if (cuda) {
        bx_span s;
        st = bx_tensor_span_cuda(&ts[i], fn, gid, i, &s);
      } else {
        bx_layout l;
        st = bx_tensor_layout(&ts[i], fn, gid, i, &l);
        if (st == BX_OK && l.self != BX_DISJOINT) {
          interval self = {(uintptr_t)l.base,
                           (uintptr_t)l.base + l.extent * bx_dtype_size(l.dtype), gid, i,
                           &ts[i], 0};
          st = l.self == BX_OVERLAP_STRIDE0
                   ? refuse_self(fn, &self, "it is an expanded view (a stride-0 dim of size "
                                            "> 1): its logical elements share memory")
                   : exact_check(fn, &self, 1);
        }
      }
      if (st != BX_OK) return st;
      ntensors++;
    }
  }
  if (ntensors < 2) return BX_OK;
  interval *iv = bx_workspace(ntensors * sizeof *iv);
  if (!iv) return bx_fail(BX_ENOMEM, "%s: cannot allocate workspace for %zu tensors", fn, ntensors);
  size_t k = 0;
  for (size_t g = 0; g < ng; g++) {
    const DLTensor *ts = groups ? groups[g].tensors : flat;
    size_t cnt = groups ? groups[g].count : count;
    for (size_t i = 0; i < cnt; i++) {
      size_t n, es;
      uintptr_t lo, hi;
      int dense = 1;
      if (cuda) {
        bx_span s;
        bx_tensor_span_cuda(&ts[i], fn, BX_NO_GROUP, i, &s);
        n = s.n;
        es = bx_dtype_size(s.dtype);
        lo = (uintptr_t)s.data;
        hi = lo + n * es;
      } else {
        bx_layout l;
        bx_tensor_layout(&ts[i], fn, BX_NO_GROUP, i, &l);
        n = l.n;
        es = bx_dtype_size(l.dtype);
        lo = (uintptr_t)l.base;
        hi = lo + l.extent * es;
        dense = l.ndims == 0;
      }
      if (n == 0) continue; /* no element: shares nothing */
      iv[k].lo = lo;
      iv[k].hi = hi;
      iv[k].group = groups ? g : BX_NO_GROUP;
      iv[k].index = i;
      iv[k].t = &ts[i];
      iv[k].dense = dense;
      k++;
    }
  }
  qsort(iv, k, sizeof *iv, cmp_interval);
  /* the sweep: runs of ranges that overlap (by the running maximum end) */
  for (size_t i = 0; i < k;) {
    size_t j = i + 1;
    uintptr_t end = iv[i].hi;
    int exact = 0;
    for (; j < k && iv[j].lo < end; j++) {
      /* all dense so far (and no overlap reported): iv[i] alone so far */
      if (!exact && iv[i].dense && iv[j].dense) return refuse_pair(fn, &iv[j - 1], &iv[j]);
      exact = 1;
      if (iv[j].hi > end) end = iv[j].hi;
    }
    if (exact) {
      bx_status st = exact_check(fn, iv + i, j - i);
      if (st != BX_OK) return st;
    }
    i = j;
  }
  return BX_OK;
}
