/*
 * gemm.c — bx_gemm's generic blocked driver (BLIS-style): the checks, then
 * per task one nc-column block of C over a range of rows and all of K, in
 * kc blocks: pack a kc x nc panel of B into nr-wide slivers (once per kc
 * block), then per mc rows an mc x kc block of A into mr-high slivers (fp32; bf16 widened exactly), then the active ISA's
 * micro-kernel (kernels.h) on each mr x nr tile. Between kc blocks the
 * running fp32 accumulator of every element lives in C itself (stored and
 * reloaded exactly), so the k blocking leaves each element's chain of fmas
 * as it would be unblocked: k = 0..K-1, one rounding per step. Threads take
 * whole blocks of C (never a split of K), padding rows and columns are
 * computed in a scratch tile and dropped: no layout choice reaches the
 * bits.
 */
#include <stdint.h>
#include <string.h>

#include "abi.h"
#include "call.h"
#include "dtype.h"
#include "error.h"
#include "gemm_hd.h"
#include "gemm_internal.h"
#include "kernels.h"
#include "nan_canon.h"
#include "pool.h"
#include "tensor.h"
#include "train_check.h"
#include "train_device.h"
#include "workspace.h"

/* ---- checks -------------------------------------------------------------- */

static int host_readable(DLDeviceType dev) {
  return dev == kDLCPU || dev == kDLCUDAHost || dev == kDLCUDAManaged || dev == kDLROCMHost;
}

bx_status bx_gemm_check_operand(const char *fn, const char *name, const DLTensor *t, int max_ndim,
                               int c_dtype, gemm_operand *o) {
  return bx_gemm_check_operand_in(fn, name, t, max_ndim, c_dtype, -1, o);
}

bx_status bx_gemm_check_operand_in(const char *fn, const char *name, const DLTensor *t,
                                   int max_ndim, int c_dtype, int cuda_device, gemm_operand *o) {
  if (!t) return bx_fail(BX_EINVAL, "%s: tensor %s is NULL", fn, name);
  if (cuda_device >= 0) { /* managed memory: any device reads it */
    if (t->device.device_type != kDLCUDAManaged &&
        (t->device.device_type != kDLCUDA || t->device.device_id != cuda_device))
      return bx_fail(BX_EDEVICE, "%s: tensor %s is on device type %d id %d, not CUDA device %d "
                     "like the call's other tensors", fn, name, (int)t->device.device_type,
                     (int)t->device.device_id, cuda_device);
  } else if (!host_readable(t->device.device_type))
    return bx_fail(BX_EDEVICE, "%s: tensor %s is on device type %d, not host memory", fn, name,
                   (int)t->device.device_type);
  if (bx_dtype_from_dl(t->dtype, &o->dt) != BX_OK ||
      (c_dtype ? o->dt != BX_DT_F32 : (o->dt != BX_DT_F32 && o->dt != BX_DT_BF16)))
    return bx_fail(BX_EDTYPE, "%s: tensor %s has dtype code %u bits %u lanes %u; want %s", fn, name,
                   (unsigned)t->dtype.code, (unsigned)t->dtype.bits, (unsigned)t->dtype.lanes,
                   c_dtype ? "float32" : "float32 or bfloat16");
  if (t->ndim < 2 || t->ndim > max_ndim)
    return bx_fail(BX_EINVAL, "%s: tensor %s has %d dimensions, want 2%s", fn, name, t->ndim,
                   max_ndim == 3 ? " or 3" : "");
  if (!t->shape) return bx_fail(BX_EINVAL, "%s: tensor %s has no shape", fn, name);
  o->ndim = t->ndim;
  size_t n = 1;
  for (int d = 0; d < t->ndim; d++) {
    if (t->shape[d] < 0)
      return bx_fail(BX_EINVAL, "%s: tensor %s: shape[%d] = %lld is negative", fn, name, d,
                     (long long)t->shape[d]);
    o->dim[d] = (size_t)t->shape[d];
    if (o->dim[d] && n > (SIZE_MAX / 8) / o->dim[d])
      return bx_fail(BX_EINVAL, "%s: tensor %s: too many elements", fn, name);
    n *= o->dim[d];
  }
  if (t->strides) {
    int64_t want = 1;
    for (int d = t->ndim - 1; d >= 0; d--) {
      if (t->shape[d] != 1 && t->strides[d] != want)
        return bx_fail(BX_ELAYOUT, "%s: tensor %s is not row-major contiguous: strides[%d] = %lld, "
                       "want %lld", fn, name, d, (long long)t->strides[d], (long long)want);
      want *= t->shape[d];
    }
  }
  size_t es = bx_dtype_size(o->dt);
  o->bytes = n * es;
  if (n && !t->data) return bx_fail(BX_EINVAL, "%s: tensor %s: data is NULL", fn, name);
  o->data = (const char *)t->data + t->byte_offset;
  if ((uintptr_t)o->data % es)
    return bx_fail(BX_ELAYOUT, "%s: tensor %s: data + byte_offset is not aligned to %zu bytes", fn,
                   name, es);
  return BX_OK;
}

int bx_gemm_overlaps(const gemm_operand *x, const gemm_operand *y) {
  if (!x->bytes || !y->bytes) return 0;
  uintptr_t x0 = (uintptr_t)x->data, y0 = (uintptr_t)y->data;
  return x0 < y0 + y->bytes && y0 < x0 + x->bytes;
}

/* ---- packing (fp32 and bf16, one function each) ------------------------- */

/* bf16 widening: gemm_hd.h (scale_round.h's bx_bf16_to_f32, exact) */
static inline float bf16_to_f32(uint16_t h) { return bx_bf16_to_f32(h); }

/* A[i0.., k0..] (row stride lda) -> ap: ceil(mb/mr) slivers of kb x mr, k-major, zero-padded rows. */
static void pack_a_f32(const float *a, size_t lda, size_t mb, size_t kb, size_t mr, float *ap) {
  for (size_t r = 0; r < mb; r += mr, ap += kb * mr) {
    size_t h = mb - r < mr ? mb - r : mr;
    const float *rows = a + r * lda;
    for (size_t k0 = 0; k0 < kb; k0 += 16) { /* 16 k at a time: one cache line of each row */
      size_t k1 = kb - k0 < 16 ? kb : k0 + 16;
      for (size_t k = k0; k < k1; k++) {
        float *dst = ap + k * mr;
        for (size_t ii = 0; ii < h; ii++) dst[ii] = rows[ii * lda + k];
        for (size_t ii = h; ii < mr; ii++) dst[ii] = 0.0f;
      }
    }
  }
}

static void pack_a_bf16(const uint16_t *a, size_t lda, size_t mb, size_t kb, size_t mr, float *ap) {
  for (size_t r = 0; r < mb; r += mr, ap += kb * mr)
    for (size_t ii = 0; ii < mr; ii++) {
      if (r + ii < mb) {
        const uint16_t *row = a + (r + ii) * lda;
        for (size_t k = 0; k < kb; k++) ap[k * mr + ii] = bf16_to_f32(row[k]);
      } else {
        for (size_t k = 0; k < kb; k++) ap[k * mr + ii] = 0.0f;
      }
    }
}

/* TN: A is stored [K,M] (dY, token-major): element (i, k) of the product's
 * A is a[k*lda + i], so each k step of a sliver is mr contiguous values. */
static void pack_a_tn_f32(const float *a, size_t lda, size_t mb, size_t kb, size_t mr, float *ap) {
  /* token by token: each row's mb values are read once, contiguously (a
   * sliver-major walk would stride over kb rows per sliver) */
  size_t full = mb / mr * mr;
  for (size_t k = 0; k < kb; k++) {
    const float *src = a + k * lda;
    float *dst = ap + k * mr;
    switch (mr) { /* the kernels' mr: fixed-size copies the compiler inlines */
    case 12:
      for (size_t r = 0; r < full; r += 12, dst += kb * 12) memcpy(dst, src + r, 12 * sizeof(float));
      break;
    case 6:
      for (size_t r = 0; r < full; r += 6, dst += kb * 6) memcpy(dst, src + r, 6 * sizeof(float));
      break;
    case 4:
      for (size_t r = 0; r < full; r += 4, dst += kb * 4) memcpy(dst, src + r, 4 * sizeof(float));
      break;
    default:
      for (size_t r = 0; r < full; r += mr, dst += kb * mr)
        for (size_t ii = 0; ii < mr; ii++) dst[ii] = src[r + ii];
    }
    if (full < mb) {
      size_t h = mb - full;
      for (size_t ii = 0; ii < h; ii++) dst[ii] = src[full + ii];
      for (size_t ii = h; ii < mr; ii++) dst[ii] = 0.0f;
    }
  }
}

static void pack_a_tn_bf16(const uint16_t *a, size_t lda, size_t mb, size_t kb, size_t mr,
                           float *ap) {
  for (size_t k = 0; k < kb; k++) {
    const uint16_t *src = a + k * lda;
    float *dst = ap + k * mr;
    for (size_t r = 0; r < mb; r += mr, dst += kb * mr) {
      size_t h = mb - r < mr ? mb - r : mr;
      for (size_t ii = 0; ii < h; ii++) dst[ii] = bf16_to_f32(src[r + ii]);
      for (size_t ii = h; ii < mr; ii++) dst[ii] = 0.0f;
    }
  }
}

/* NT: B is [N,K]; columns j of C are rows of B: b[j*ldb + k]. */
static void pack_b_nt_f32(const float *b, size_t ldb, size_t nb, size_t kb, size_t nr, float *bp) {
  for (size_t s = 0; s < nb; s += nr, bp += kb * nr)
    for (size_t jj = 0; jj < nr; jj++) {
      if (s + jj < nb) {
        const float *row = b + (s + jj) * ldb;
        for (size_t k = 0; k < kb; k++) bp[k * nr + jj] = row[k];
      } else {
        for (size_t k = 0; k < kb; k++) bp[k * nr + jj] = 0.0f;
      }
    }
}

static void pack_b_nt_bf16(const uint16_t *b, size_t ldb, size_t nb, size_t kb, size_t nr,
                           float *bp) {
  for (size_t s = 0; s < nb; s += nr, bp += kb * nr)
    for (size_t jj = 0; jj < nr; jj++) {
      if (s + jj < nb) {
        const uint16_t *row = b + (s + jj) * ldb;
        for (size_t k = 0; k < kb; k++) bp[k * nr + jj] = bf16_to_f32(row[k]);
      } else {
        for (size_t k = 0; k < kb; k++) bp[k * nr + jj] = 0.0f;
      }
    }
}

/* NN: B is [K,N]: b[k*ldb + j]. */
static void pack_b_nn_f32(const float *b, size_t ldb, size_t nb, size_t kb, size_t nr, float *bp) {
  for (size_t s = 0; s < nb; s += nr, bp += kb * nr) {
    size_t w = nb - s < nr ? nb - s : nr;
    for (size_t k = 0; k < kb; k++) {
      const float *row = b + k * ldb + s;
      float *dst = bp + k * nr;
      for (size_t jj = 0; jj < w; jj++) dst[jj] = row[jj];
      for (size_t jj = w; jj < nr; jj++) dst[jj] = 0.0f;
    }
  }
}

static void pack_b_nn_bf16(const uint16_t *b, size_t ldb, size_t nb, size_t kb, size_t nr,
                           float *bp) {
  for (size_t s = 0; s < nb; s += nr, bp += kb * nr) {
    size_t w = nb - s < nr ? nb - s : nr;
    for (size_t k = 0; k < kb; k++) {
      const uint16_t *row = b + k * ldb + s;
      float *dst = bp + k * nr;
      for (size_t jj = 0; jj < w; jj++) dst[jj] = bf16_to_f32(row[jj]);
      for (size_t jj = w; jj < nr; jj++) dst[jj] = 0.0f;
    }
  }
}

/* ---- the blocked product -------------------------------------------------- */

typedef struct gemm_job {
  const void *a, *b;
  bx_dtype adt, bdt;
  bx_gemm_layout layout;
  float *c;
  size_t m, n, k;
  size_t mc, kc, nc, nblocks_n;
  size_t mtask; /* rows of C per task, a multiple of mc */
  int accumulate;
  const bx_gemm_kernel *kern;
  char *scratch;       /* per worker: packed A block, then packed B panel */
  size_t scratch_each; /* bytes per worker, a multiple of 64 */
  bx_gemm_epilogue_fn epi; /* NULL, or called on each finished block of C */
  void *epi_ctx;
  size_t chunk;            /* 0, or the length of the chain segments */
  size_t group;            /* segments per group (group_task) when > 1 */
  int direct_b;            /* B (fp32, [K,N]) read in place by kern->micro_ldb */
} gemm_job;

static void pack_a(const gemm_job *j, size_t i0, size_t p0, size_t mb, size_t kb, float *ap) {
  if (j->layout == BX_GEMM_TN) { /* a is [K rows, M cols] in the product's terms */
    if (j->adt == BX_DT_BF16)
      pack_a_tn_bf16((const uint16_t *)j->a + p0 * j->m + i0, j->m, mb, kb, j->kern->mr, ap);
    else
      pack_a_tn_f32((const float *)j->a + p0 * j->m + i0, j->m, mb, kb, j->kern->mr, ap);
    return;
  }
  if (j->adt == BX_DT_BF16)
    pack_a_bf16((const uint16_t *)j->a + i0 * j->k + p0, j->k, mb, kb, j->kern->mr, ap);
  else
    pack_a_f32((const float *)j->a + i0 * j->k + p0, j->k, mb, kb, j->kern->mr, ap);
}

static void pack_b(const gemm_job *j, size_t j0, size_t p0, size_t nb, size_t kb, float *bp) {
  size_t nr = j->kern->nr;
  if (j->layout == BX_GEMM_NT) {
    if (j->bdt == BX_DT_BF16) pack_b_nt_bf16((const uint16_t *)j->b + j0 * j->k + p0, j->k, nb, kb, nr, bp);
    else pack_b_nt_f32((const float *)j->b + j0 * j->k + p0, j->k, nb, kb, nr, bp);
  } else {
    if (j->bdt == BX_DT_BF16) pack_b_nn_bf16((const uint16_t *)j->b + p0 * j->n + j0, j->n, nb, kb, nr, bp);
    else pack_b_nn_f32((const float *)j->b + p0 * j->n + j0, j->n, nb, kb, nr, bp);
  }
}

/* One tile: the micro-kernel on C directly when the tile is whole, else on
 * a scratch tile holding the chain's start (C's value or +0) whose mb x nb
 * corner is copied back. */
static void run_tile(const bx_gemm_kernel *kern, size_t kb, const float *ap, const float *bp,
                     float *c, size_t ldc, size_t mb, size_t nb, int load_c) {
  if (mb == kern->mr && nb == kern->nr) {
    kern->micro(kb, ap, bp, c, ldc, load_c);
    return;
  }
  _Alignas(64) float t[BX_GEMM_MR_MAX * BX_GEMM_NR_MAX];
  size_t nr = kern->nr;
  for (size_t i = 0; i < kern->mr; i++)
    for (size_t jj = 0; jj < nr; jj++)
      t[i * nr + jj] = load_c && i < mb && jj < nb ? c[i * ldc + jj] : 0.0f;
  kern->micro(kb, ap, bp, t, nr, 1);
  for (size_t i = 0; i < mb; i++) memcpy(c + i * ldc, t + i * nr, nb * sizeof(float));
}

/* run_tile with B unpacked (kern->micro_ldb; a whole nr-wide sliver) */
static void run_tile_ldb(const bx_gemm_kernel *kern, size_t kb, const float *ap, const float *bs,
                         size_t ldb, float *c, size_t ldc, size_t mb, int load_c) {
  if (mb == kern->mr) {
    kern->micro_ldb(kb, ap, bs, ldb, c, ldc, load_c);
    return;
  }
  _Alignas(64) float t[BX_GEMM_MR_MAX * BX_GEMM_NR_MAX];
  size_t nr = kern->nr;
  for (size_t i = 0; i < kern->mr; i++)
    for (size_t jj = 0; jj < nr; jj++) t[i * nr + jj] = load_c && i < mb ? c[i * ldc + jj] : 0.0f;
  kern->micro_ldb(kb, ap, bs, ldb, t, nr, 1);
  for (size_t i = 0; i < mb; i++) memcpy(c + i * ldc, t + i * nr, nr * sizeof(float));
}

/* bytes of a packed A block, rounded up so that the B panel after it is
 * 64-byte aligned (the micro-kernels load B slivers aligned) */
static size_t a_bytes(size_t mc, size_t kc) { return (mc * kc * sizeof(float) + 63) / 64 * 64; }

/* A finished tile of C (rows x cols at c, row stride ldc), still in the
 * first-level cache: a NaN becomes the canonical 0x7FC00000 (nan_canon.h).
 * Only the stored outputs, never the chain: a NaN stays a NaN along it, so
 * which NaN the fma chain carried does not matter. */
static void canon_tile(float *c, size_t ldc, size_t rows, size_t cols) {
  for (size_t i = 0; i < rows; i++)
    for (size_t jj = 0; jj < cols; jj++) c[i * ldc + jj] = bx_gemm_store_f32(c[i * ldc + jj]);
}

/* Every tile of the mb x nb block of C at (i0, j0) over the k block [p0,
 * p0 + kb): A packed at ap; B packed at bpk, or (bpk NULL: j->direct_b)
 * read in place, its edge sliver (narrower than nr) packed into edge.
 * final: the k block ends the chain (or segment): the tiles are stored
 * values, canonicalised. */
static void block_tiles(const gemm_job *j, size_t i0, size_t mb, size_t j0, size_t nb, size_t p0,
                        size_t kb, const float *ap, const float *bpk, float *edge, int load_c,
                        int final) {
  const bx_gemm_kernel *kern = j->kern;
  for (size_t s = 0; s < nb; s += kern->nr) {
    size_t w = nb - s < kern->nr ? nb - s : kern->nr;
    const float *bs;
    if (!bpk && w == kern->nr) { /* in place: rows of B (fp32, [K,N] row-major) */
      bs = (const float *)j->b + p0 * j->n + j0 + s;
      for (size_t r = 0; r < mb; r += kern->mr) {
        size_t h = mb - r < kern->mr ? mb - r : kern->mr;
        run_tile_ldb(kern, kb, ap + (r / kern->mr) * kb * kern->mr, bs, j->n,
                     j->c + (i0 + r) * j->n + j0 + s, j->n, h, load_c);
        if (final) canon_tile(j->c + (i0 + r) * j->n + j0 + s, j->n, h, w);
      }
      continue;
    }
    if (!bpk) {
      pack_b(j, j0 + s, p0, w, kb, edge);
      bs = edge;
    } else {
      bs = bpk + (s / kern->nr) * kb * kern->nr;
    }
    for (size_t r = 0; r < mb; r += kern->mr) {
      size_t h = mb - r < kern->mr ? mb - r : kern->mr;
      run_tile(kern, kb, ap + (r / kern->mr) * kb * kern->mr, bs, j->c + (i0 + r) * j->n + j0 + s,
               j->n, h, w, load_c);
      if (final) canon_tile(j->c + (i0 + r) * j->n + j0 + s, j->n, h, w);
    }
  }
}

/* Segments in groups of j->group: B packed once per group for all its
 * segments and k blocks, then per mc block of rows every segment of the
 * group in turn, so that the epilogue's per-block data (C's block and what
 * the epilogue adds it to) stays in cache across the group's segments.
 * Each segment's chain is the same as in gemm_task's loop. */
static void group_task(const gemm_job *j, int worker, size_t r0, size_t r1, size_t j0, size_t nb,
                       float *ap, float *bp) {
  const bx_gemm_kernel *kern = j->kern;
  size_t nbr = (nb + kern->nr - 1) / kern->nr * kern->nr, gt = j->group * j->chunk;
  for (size_t g0 = 0; g0 < j->k; g0 += gt) {
    size_t g1 = j->k - g0 < gt ? j->k : g0 + gt;
    float *q = bp;
    if (!j->direct_b)
      for (size_t p0 = g0; p0 < g1;) { /* every k block of every segment, in order */
        size_t c1 = (p0 - g0) / j->chunk * j->chunk + g0 + j->chunk;
        if (c1 > g1) c1 = g1;
        size_t kb = c1 - p0 < j->kc ? c1 - p0 : j->kc;
        pack_b(j, j0, p0, nb, kb, q);
        q += kb * nbr;
        p0 += kb;
      }
    for (size_t i0 = r0; i0 < r1; i0 += j->mc) {
      size_t mb = r1 - i0 < j->mc ? r1 - i0 : j->mc;
      q = bp;
      for (size_t c0 = g0; c0 < g1; c0 += j->chunk) {
        size_t c1 = g1 - c0 < j->chunk ? g1 : c0 + j->chunk;
        for (size_t p0 = c0; p0 < c1; p0 += j->kc) {
          size_t kb = c1 - p0 < j->kc ? c1 - p0 : j->kc;
          pack_a(j, i0, p0, mb, kb, ap);
          block_tiles(j, i0, mb, j0, nb, p0, kb, ap, j->direct_b ? NULL : q, bp, p0 > c0, p0 + kb == c1);
          q += kb * nbr;
        }
        j->epi(j->epi_ctx, worker, j->c + i0 * j->n + j0, j->n, c0, i0, j0, mb, nb);
      }
    }
  }
}

static void gemm_task(void *ctx, size_t task, int worker) {
  const gemm_job *j = ctx;
  size_t r0 = (task / j->nblocks_n) * j->mtask, j0 = (task % j->nblocks_n) * j->nc;
  size_t r1 = j->m - r0 < j->mtask ? j->m : r0 + j->mtask;
  size_t nb = j->n - j0 < j->nc ? j->n - j0 : j->nc;
  float *ap = (float *)(j->scratch + (size_t)worker * j->scratch_each);
  float *bp = (float *)(j->scratch + (size_t)worker * j->scratch_each + a_bytes(j->mc, j->kc));
  if (j->group > 1) {
    group_task(j, worker, r0, r1, j0, nb, ap, bp);
    return;
  }
  /* the chains over [c0, c1): all of k, or one segment (chunk) after the
   * other, each from +0, with the epilogue after each segment */
  size_t seg = j->chunk ? j->chunk : j->k;
  for (size_t c0 = 0; c0 < j->k; c0 += seg) {
    size_t c1 = j->k - c0 < seg ? j->k : c0 + seg;
    for (size_t p0 = c0; p0 < c1; p0 += j->kc) {
      size_t kb = c1 - p0 < j->kc ? c1 - p0 : j->kc;
      int load_c = p0 > c0 || j->accumulate; /* the running accumulator is in C */
      if (!j->direct_b) pack_b(j, j0, p0, nb, kb, bp); /* once per k block, for all the task's rows */
      for (size_t i0 = r0; i0 < r1; i0 += j->mc) {
        size_t mb = r1 - i0 < j->mc ? r1 - i0 : j->mc;
        pack_a(j, i0, p0, mb, kb, ap);
        block_tiles(j, i0, mb, j0, nb, p0, kb, ap, j->direct_b ? NULL : bp, bp, load_c, p0 + kb == c1);
        if (j->epi && p0 + kb == c1) /* the block is final, and still in cache */
          j->epi(j->epi_ctx, worker, j->c + i0 * j->n + j0, j->n, c0, i0, j0, mb, nb);
      }
    }
  }
}

static size_t round_up(size_t x, size_t q) { return (x + q - 1) / q * q; }

static bx_status gemm_run(const char *fn, const gemm_operand *A, const gemm_operand *B,
                          bx_gemm_layout layout, const gemm_operand *C, size_t m, size_t n,
                          size_t k, const bx_gemm_opts *opts, const bx_gemm_blocking *blk,
                          bx_gemm_epilogue_fn epi, void *epi_ctx, int cuda_device);

static bx_status gemm_impl(const char *fn, const DLTensor *a, const DLTensor *b,
                           bx_gemm_layout layout, DLTensor *c, const bx_gemm_opts *opts,
                           const bx_gemm_blocking *blk, bx_gemm_epilogue_fn epi, void *epi_ctx) {
  bx_gemm_opts o = BX_GEMM_OPTS_DEFAULT;
  if (opts) o = *opts;
  if (o.num_threads < 0)
    return bx_fail(BX_EINVAL, "%s: num_threads %d is negative", fn, o.num_threads);
  if (layout != BX_GEMM_NT && layout != BX_GEMM_NN && layout != BX_GEMM_TN)
    return bx_fail(BX_EINVAL, "%s: unknown layout %d (BX_GEMM_NT, BX_GEMM_NN or BX_GEMM_TN)", fn,
                   (int)layout);
  gemm_operand A, B, C;
  int tn = layout == BX_GEMM_TN;
  /* every operand a CUDA (or managed) tensor: the device's kernel (gemm_hd.h's chains) */
  const DLTensor *ts[3] = {a, b, c};
  bx_tc_place pl = {0, 0};
  if (a && b && c) pl = bx_tc_place_of(ts, 3);
  if (pl.cuda && (epi || (blk && blk->chunk))) {
    if (a->device.device_type == kDLCUDA || b->device.device_type == kDLCUDA ||
        c->device.device_type == kDLCUDA)
      return bx_fail(BX_EDEVICE, "%s: chunked or fused products are host-only; CUDA tensors go "
                     "through bx_gemm", fn);
    pl.cuda = 0; /* managed operands: the host's chunked product reads them */
  }
  int dev = pl.cuda ? pl.device : -1;
  bx_status st = bx_gemm_check_operand_in(fn, "a", a, 3, 0, dev, &A);
  if (st == BX_OK) st = bx_gemm_check_operand_in(fn, "b", b, tn ? 3 : 2, 0, dev, &B);
  if (st == BX_OK) st = bx_gemm_check_operand_in(fn, "c", c, tn ? 2 : 3, 1, dev, &C);
  if (st != BX_OK) return st;
  size_t m, n, k;
  if (tn) { /* a = dY [T, N], b = X [T, K] (or 3-D, read as [T, .]); c [N, K] */
    size_t ta = A.ndim == 3 ? A.dim[0] * A.dim[1] : A.dim[0];
    size_t tb = B.ndim == 3 ? B.dim[0] * B.dim[1] : B.dim[0];
    m = A.dim[A.ndim - 1];
    n = B.dim[B.ndim - 1];
    k = ta;
    if (tb != ta)
      return bx_fail(BX_EINVAL, "%s: TN: a has %zu rows (tokens) but b has %zu", fn, ta, tb);
    if (C.dim[0] != m || C.dim[1] != n)
      return bx_fail(BX_EINVAL, "%s: TN: c's shape [%zu, %zu] is not [N = %zu columns of a, "
                     "K = %zu columns of b]", fn, C.dim[0], C.dim[1], m, n);
    if (bx_gemm_overlaps(&C, &A)) return bx_fail(BX_ELAYOUT, "%s: c overlaps a", fn);
    if (bx_gemm_overlaps(&C, &B)) return bx_fail(BX_ELAYOUT, "%s: c overlaps b", fn);
    return gemm_run(fn, &A, &B, layout, &C, m, n, k, &o, blk, epi, epi_ctx, dev);
  }
  m = A.ndim == 3 ? A.dim[0] * A.dim[1] : A.dim[0];
  k = A.dim[A.ndim - 1];
  size_t bk = layout == BX_GEMM_NT ? B.dim[1] : B.dim[0];
  n = layout == BX_GEMM_NT ? B.dim[0] : B.dim[1];
  if (bk != k)
    return bx_fail(BX_EINVAL, "%s: a is [..., %zu] but b (%s) is [%zu, %zu]: K differs", fn, k,
                   layout == BX_GEMM_NT ? "NT, [N,K]" : "NN, [K,N]", B.dim[0], B.dim[1]);
  if (C.ndim != A.ndim)
    return bx_fail(BX_EINVAL, "%s: c has %d dimensions, a has %d", fn, C.ndim, A.ndim);
  if ((A.ndim == 3 && (C.dim[0] != A.dim[0] || C.dim[1] != A.dim[1])) ||
      (A.ndim == 2 && C.dim[0] != A.dim[0]) || C.dim[C.ndim - 1] != n)
    return bx_fail(BX_EINVAL, "%s: c's shape does not match [M = %zu rows of a, N = %zu]", fn, m, n);
  if (bx_gemm_overlaps(&C, &A)) return bx_fail(BX_ELAYOUT, "%s: c overlaps a", fn);
  if (bx_gemm_overlaps(&C, &B)) return bx_fail(BX_ELAYOUT, "%s: c overlaps b", fn);
  return gemm_run(fn, &A, &B, layout, &C, m, n, k, &o, blk, epi, epi_ctx, dev);
}

/* The product of checked operands: m x n outputs, chains of length k; on
 * CUDA device cuda_device (>= 0: every operand there) the device's kernel. */
static bx_status gemm_run(const char *fn, const gemm_operand *A, const gemm_operand *B,
                          bx_gemm_layout layout, const gemm_operand *C, size_t m, size_t n,
                          size_t k, const bx_gemm_opts *opts, const bx_gemm_blocking *blk,
                          bx_gemm_epilogue_fn epi, void *epi_ctx, int cuda_device) {
  bx_gemm_opts o = *opts;
  float *cd = (float *)C->data;
  if (m == 0 || n == 0) return BX_OK;
  if (cuda_device >= 0) {
    const bx_train_device *dev;
    bx_status st = bx_train_cuda(fn, &dev);
    if (st != BX_OK) return st;
    return dev->gemm(fn, cuda_device, A->data, A->dt == BX_DT_BF16, B->data, B->dt == BX_DT_BF16,
                     (int)layout, cd, m, n, k, o.accumulate != 0);
  }
  if (k == 0) {
    if (!o.accumulate) memset(cd, 0, m * n * sizeof(float));
    if (epi) epi(epi_ctx, 0, cd, n, 0, 0, 0, m, n);
    return BX_OK;
  }

  const bx_gemm_kernel *kern = bx_gemm_kernel_active();
  size_t mc = round_up(blk && blk->mc ? blk->mc : BX_GEMM_MC, kern->mr);
  size_t kc = blk && blk->kc ? blk->kc : BX_GEMM_KC;
  size_t nc = round_up(blk && blk->nc ? blk->nc : BX_GEMM_NC, kern->nr);
  size_t chunk = blk && blk->chunk && blk->chunk < k ? blk->chunk : 0;
  if (chunk) o.accumulate = 0; /* the segments start from +0 */
  if (mc > round_up(m, kern->mr)) mc = round_up(m, kern->mr);
  if (kc > k) kc = k;
  if (chunk && kc > chunk) kc = chunk;
  if (nc > round_up(n, kern->nr)) nc = round_up(n, kern->nr);
  int nthreads = o.num_threads > 0 ? o.num_threads : bx_default_threads();
  if (nthreads > BX_MAX_THREADS) nthreads = BX_MAX_THREADS;
  /* Tasks: nc-column blocks of C, each over a range of rows (several mc
   * blocks, so that B's panel is packed once per k block for all of
   * them). With the default blocking, narrower column blocks, then row
   * ranges, until every thread has about two tasks. Speed only. */
  size_t mblocks = (m + mc - 1) / mc;
  if (!(blk && blk->nc) && nthreads > 1)
    while (mblocks * ((n + nc - 1) / nc) < 2 * (size_t)nthreads && nc > 4 * kern->nr &&
           (n + nc - 1) / nc < 2 * (size_t)nthreads)
      nc = round_up(nc / 2, kern->nr);
  size_t nblocks = (n + nc - 1) / nc;
  size_t msplit = nblocks >= 2 * (size_t)nthreads ? 1 : (2 * (size_t)nthreads + nblocks - 1) / nblocks;
  if (nthreads == 1) msplit = 1;
  if (msplit > mblocks) msplit = mblocks;
  size_t mtask = (mblocks + msplit - 1) / msplit * mc;
  size_t ntasks = (m + mtask - 1) / mtask * nblocks;
  if ((size_t)nthreads > ntasks) nthreads = (int)ntasks;
  /* segments (with an epilogue) in groups of blk->group_tokens k steps */
  size_t gt = chunk && epi && blk->group_tokens ? blk->group_tokens : 0;
  size_t group = gt > chunk ? gt / chunk : 1;
  if (group > 1 && group * chunk > k) group = (k + chunk - 1) / chunk;
  /* NN and TN with fp32 B: the kernel reads B's rows in place when it has
   * the entry and a k block of B's rows spans at most 256 KiB (64 pages:
   * within the first-level TLB; wider rows measured no better than
   * packing). Only an edge sliver narrower than nr is then packed. Speed
   * only: the chain is the same. */
  int direct = layout != BX_GEMM_NT && B->dt == BX_DT_F32 && kern->micro_ldb != NULL &&
               kc * n * sizeof(float) <= ((size_t)256 << 10);
  size_t panel = direct ? kc * kern->nr : group > 1 ? group * chunk * round_up(nc, kern->nr) : kc * nc;
  size_t each = a_bytes(mc, kc) + round_up(panel * sizeof(float), 64);
  if (each > (SIZE_MAX - 64) / (size_t)nthreads)
    return bx_fail(BX_ENOMEM, "%s: blocking needs too much scratch", fn);
  char *ws = bx_workspace(each * (size_t)nthreads + 64);
  if (!ws) return bx_fail(BX_ENOMEM, "%s: cannot allocate %zu bytes of packing scratch", fn,
                          each * (size_t)nthreads + 64);
  gemm_job j = {A->data, B->data, A->dt, B->dt, layout, cd, m, n, k, mc, kc, nc, nblocks, mtask,
                o.accumulate != 0, kern, ws + (64 - (uintptr_t)ws % 64) % 64, each, epi, epi_ctx,
                chunk, group, direct};
  bx_parallel_run(nthreads, ntasks, gemm_task, &j);
  return BX_OK;
}

bx_status bx_gemm_blocked(const DLTensor *a, const DLTensor *b, bx_gemm_layout layout,
                          DLTensor *c, const bx_gemm_opts *opts, const bx_gemm_blocking *blk) {
  return bx_gemm_fused("bx_gemm", a, b, layout, c, opts, blk, NULL, NULL);
}

bx_status bx_gemm_fused(const char *fn, const DLTensor *a, const DLTensor *b,
                        bx_gemm_layout layout, DLTensor *c, const bx_gemm_opts *opts,
                        const bx_gemm_blocking *blk, bx_gemm_epilogue_fn epi, void *epi_ctx) {
  if (opts) { /* before anything else */
    bx_status st = bx_check_struct_size(fn, "opts->struct_size", opts->struct_size, sizeof *opts,
                                        "bx_gemm_opts", "BX_GEMM_OPTS_DEFAULT");
    if (st != BX_OK) return st;
  }
  bx_call call;
  bx_status st = bx_call_enter(&call, fn);
  if (st != BX_OK) return st;
  st = gemm_impl(fn, a, b, layout, c, opts, blk, epi, epi_ctx);
  bx_call_leave(&call);
  return st;
}

bx_status bx_gemm(const DLTensor *a, const DLTensor *b, bx_gemm_layout layout, DLTensor *c,
                  const bx_gemm_opts *opts) {
  return bx_gemm_blocked(a, b, layout, c, opts, NULL);
}
