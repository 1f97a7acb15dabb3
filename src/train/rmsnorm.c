/*
 * rmsnorm.c — bx_rmsnorm_forward / bx_rmsnorm_backward (bitexact_train.h,
 * "Layers"): Glm4MoeRMSNorm in fp32 with one sequential fmaf chain per row
 * for the sum of squares and for the backward's sum of g * xhat, and the
 * weight gradient as chunk partials (one fmaf chain over the chunk's rows
 * per column). Threads take whole rows (forward, dx) or whole (chunk,
 * column block) pieces (partials): no reduction is split, so the bits do
 * not depend on the count.
 */
#include <stddef.h>
#include <stdint.h>

#include "abi.h"
#include "bitexact_train.h"
#include "call.h"
#include "error.h"
#include "train_check.h"
#include "train_device.h"
#include "nan_canon.h"
#include "rmsnorm_hd.h"
#include "pool.h"

#define COL_BLOCK 512 /* columns per partials piece */

/* ---- forward ------------------------------------------------------------- */

typedef struct fwd_job {
  const float *x, *w;
  float *y, *rstd;
  size_t rows, h, piece;
  float eps;
} fwd_job;

static void fwd_piece(void *ctx, size_t task, int worker) {
  (void)worker;
  const fwd_job *j = ctx;
  size_t r0 = task * j->piece, r1 = j->rows - r0 < j->piece ? j->rows : r0 + j->piece;
  for (size_t r = r0; r < r1; r++) {
    const float *x = j->x + r * j->h;
    float *y = j->y + r * j->h;
    float rs = bx_rmsnorm_rstd_f32(x, 1, j->h, j->eps);
    for (size_t k = 0; k < j->h; k++) y[k] = bx_rmsnorm_y_f32(x[k], j->w[k], rs);
    if (j->rstd) j->rstd[r] = bx_canon_f32(rs);
  }
}

/* struct_size (first), num_threads, then the call is entered */
static bx_status enter(bx_call *c, const char *fn, const bx_rmsnorm_opts *opts, int *threads) {
  return bx_tc_enter(c, fn, opts, sizeof *opts, offsetof(bx_rmsnorm_opts, num_threads),
                     "bx_rmsnorm_opts", "BX_RMSNORM_OPTS_DEFAULT", threads);
}

/* H: 1 <= H <= 2^24 (fp32 converts it exactly) */
static bx_status check_features(const char *fn, const bx_tc_tensor *x) {
  if (x->cols < 1 || x->cols > ((size_t)1 << 24))
    return bx_fail_at(BX_EINVAL, -1, BX_NO_INDEX, x->index,
                      "%s: tensor %zu (%s) has %zu features (last dimension); want 1 to 2^24",
                      fn, x->index, x->name, x->cols);
  return BX_OK;
}

static bx_status check_weight(const char *fn, const bx_tc_tensor *w, size_t h) {
  if (w->ndim != 1 || w->cols != h)
    return bx_fail_at(BX_EINVAL, -1, BX_NO_INDEX, w->index,
                      "%s: tensor %zu (%s) must be 1-D [%zu] (the features of x)", fn, w->index,
                      w->name, h);
  return BX_OK;
}

static bx_status check_rstd(const char *fn, const bx_tc_tensor *r, size_t rows) {
  if (r->n != rows)
    return bx_fail_at(BX_EINVAL, -1, BX_NO_INDEX, r->index,
                      "%s: tensor %zu (%s) has %zu elements; want one per row of x (%zu)", fn,
                      r->index, r->name, r->n, rows);
  return BX_OK;
}

bx_status bx_rmsnorm_forward(const DLTensor *x, const DLTensor *weight, double eps, DLTensor *y,
                             DLTensor *rstd, const bx_rmsnorm_opts *opts) {
  static const char *fn = "bx_rmsnorm_forward";
  int threads;
  bx_call c;
  bx_status st = enter(&c, fn, opts, &threads);
  if (st != BX_OK) return st;
  bx_tc_tensor a[4];
  size_t count = rstd ? 4 : 3;
  const DLTensor *ts[4] = {x, weight, y, rstd};
  const bx_tc_place pl = bx_tc_place_of(ts, 4);
  if (!(eps >= 0.0 && eps <= 0x1.fffffep127)) /* finite in fp32 (NaN fails too) */
    st = bx_fail(BX_EINVAL, "%s: eps %g is negative, NaN or not finite in fp32", fn, eps);
  if (st == BX_OK) st = bx_tc_check_in(&pl, fn, 0, "x", x, BX_TC_F32, 1, 3, NULL, 0, &a[0]);
  if (st == BX_OK) st = bx_tc_check_in(&pl, fn, 1, "weight", weight, BX_TC_F32, 1, 1, NULL, 0, &a[1]);
  if (st == BX_OK) st = bx_tc_check_in(&pl, fn, 2, "y", y, BX_TC_F32, 1, 3, NULL, 1, &a[2]);
  if (st == BX_OK && rstd) st = bx_tc_check_in(&pl, fn, 3, "rstd", rstd, BX_TC_F32, 1, 3, NULL, 1, &a[3]);
  if (st == BX_OK) st = check_features(fn, &a[0]);
  if (st == BX_OK) st = check_weight(fn, &a[1], a[0].cols);
  if (st == BX_OK) st = bx_tc_shape(fn, &a[2], a[0].rows, a[0].cols, "x's shape");
  if (st == BX_OK && rstd) st = check_rstd(fn, &a[3], a[0].rows);
  if (st == BX_OK) {
    a[2].inplace = 0; /* y may be x exactly */
    const bx_tc_tensor *all[4] = {&a[0], &a[1], &a[2], &a[3]};
    st = bx_tc_overlap(fn, all, count);
  }
  if (st != BX_OK) goto done;
  fwd_job j = {a[0].data, a[1].data, a[2].data, rstd ? a[3].data : NULL, a[0].rows, a[0].cols,
               bx_tc_piece_rows(a[0].cols), (float)eps};
  if (pl.cuda) {
    const bx_train_device *dev;
    st = bx_train_cuda(fn, &dev);
    if (st == BX_OK && j.rows)
      st = dev->rmsnorm_fwd(fn, pl.device, j.x, j.w, j.y, j.rstd, j.rows, j.h, j.eps);
    goto done;
  }
  bx_tc_run(threads, (j.rows + j.piece - 1) / j.piece, fwd_piece, &j);
done:
  bx_call_leave(&c);
  return st;
}

/* ---- backward -------------------------------------------------------------- */

typedef struct bwd_job {
  const float *x, *w, *dy, *rstd;
  float *dx, *partials;
  size_t rows, h, piece, chunk, nchunks, nblocks;
} bwd_job;

/* dx of whole rows (after the partials: dx may be dy itself) */
static void dx_piece(void *ctx, size_t task, int worker) {
  (void)worker;
  const bwd_job *j = ctx;
  size_t r0 = task * j->piece, r1 = j->rows - r0 < j->piece ? j->rows : r0 + j->piece;
  for (size_t r = r0; r < r1; r++) {
    const float *x = j->x + r * j->h, *dy = j->dy + r * j->h;
    float *dx = j->dx + r * j->h;
    const float rs = j->rstd[r];
    float m = bx_rmsnorm_bwd_mean_f32(x, j->w, dy, 1, j->h, rs);
    for (size_t k = 0; k < j->h; k++) dx[k] = bx_rmsnorm_dx_f32(x[k], j->w[k], dy[k], rs, m);
  }
}

/* one (chunk, column block) of the weight-gradient partials */
static void partial_piece(void *ctx, size_t task, int worker) {
  (void)worker;
  const bwd_job *j = ctx;
  size_t c = task / j->nblocks, b = task % j->nblocks;
  size_t k0 = b * COL_BLOCK, k1 = j->h - k0 < COL_BLOCK ? j->h : k0 + COL_BLOCK;
  size_t t0 = c * j->chunk, t1 = j->rows - t0 < j->chunk ? j->rows : t0 + j->chunk;
  float *p = j->partials + c * j->h;
  for (size_t k = k0; k < k1; k++) p[k] = 0.0f;
  for (size_t t = t0; t < t1; t++) {
    const float *x = j->x + t * j->h, *dy = j->dy + t * j->h;
    const float rs = j->rstd[t];
    for (size_t k = k0; k < k1; k++) p[k] = bx_rmsnorm_wpart_step_f32(p[k], dy[k], x[k], rs);
  }
  bx_canon_f32_n(p + k0, k1 - k0);
}

bx_status bx_rmsnorm_backward(const DLTensor *x, const DLTensor *weight, const DLTensor *dy,
                              const DLTensor *rstd, int64_t chunk_tokens, DLTensor *dx,
                              DLTensor *dweight_partials, const bx_rmsnorm_opts *opts) {
  static const char *fn = "bx_rmsnorm_backward";
  int threads;
  bx_call c;
  bx_status st = enter(&c, fn, opts, &threads);
  if (st != BX_OK) return st;
  bx_tc_tensor a[6];
  size_t nchunks = 0;
  const DLTensor *ts[6] = {x, weight, dy, rstd, dx, dweight_partials};
  const bx_tc_place pl = bx_tc_place_of(ts, 6);
  if (chunk_tokens < 1)
    st = bx_fail(BX_EINVAL, "%s: chunk_tokens %lld is below 1", fn, (long long)chunk_tokens);
  if (st == BX_OK) st = bx_tc_check_in(&pl, fn, 0, "x", x, BX_TC_F32, 1, 3, NULL, 0, &a[0]);
  if (st == BX_OK) st = bx_tc_check_in(&pl, fn, 1, "weight", weight, BX_TC_F32, 1, 1, NULL, 0, &a[1]);
  if (st == BX_OK) st = bx_tc_check_in(&pl, fn, 2, "dy", dy, BX_TC_F32, 1, 3, NULL, 0, &a[2]);
  if (st == BX_OK) st = bx_tc_check_in(&pl, fn, 3, "rstd", rstd, BX_TC_F32, 1, 3, NULL, 0, &a[3]);
  if (st == BX_OK) st = bx_tc_check_in(&pl, fn, 4, "dx", dx, BX_TC_F32, 1, 3, NULL, 1, &a[4]);
  if (st == BX_OK && dweight_partials)
    st = bx_tc_check_in(&pl, fn, 5, "dweight_partials", dweight_partials, BX_TC_F32, 2, 2, NULL, 1, &a[5]);
  if (st == BX_OK) st = check_features(fn, &a[0]);
  if (st == BX_OK) st = check_weight(fn, &a[1], a[0].cols);
  if (st == BX_OK) st = bx_tc_shape(fn, &a[2], a[0].rows, a[0].cols, "x's shape");
  if (st == BX_OK) st = check_rstd(fn, &a[3], a[0].rows);
  if (st == BX_OK) st = bx_tc_shape(fn, &a[4], a[0].rows, a[0].cols, "x's shape");
  if (st == BX_OK) {
    uint64_t ct = (uint64_t)chunk_tokens;
    nchunks = (size_t)(((uint64_t)a[0].rows + ct - 1) / ct);
    if (ct > a[0].rows) nchunks = a[0].rows ? 1 : 0;
  }
  if (st == BX_OK && dweight_partials)
    st = bx_tc_shape(fn, &a[5], nchunks, a[0].cols, "[ceil(T / chunk_tokens), H] =");
  if (st == BX_OK) {
    a[4].inplace = 2; /* dx may be dy exactly */
    const bx_tc_tensor *all[6] = {&a[0], &a[1], &a[2], &a[3], &a[4], &a[5]};
    st = bx_tc_overlap(fn, all, dweight_partials ? 6 : 5);
  }
  if (st != BX_OK) goto done;
  bwd_job j;
  j.x = a[0].data;
  j.w = a[1].data;
  j.dy = a[2].data;
  j.rstd = a[3].data;
  j.dx = a[4].data;
  j.partials = dweight_partials ? a[5].data : NULL;
  j.rows = a[0].rows;
  j.h = a[0].cols;
  j.piece = bx_tc_piece_rows(j.h);
  j.chunk = (size_t)((uint64_t)chunk_tokens < j.rows ? (uint64_t)chunk_tokens : j.rows);
  j.nchunks = nchunks;
  j.nblocks = (j.h + COL_BLOCK - 1) / COL_BLOCK;
  if (pl.cuda) {
    const bx_train_device *dev;
    st = bx_train_cuda(fn, &dev);
    if (st == BX_OK && j.rows)
      st = dev->rmsnorm_bwd(fn, pl.device, j.x, j.w, j.dy, j.rstd, j.dx, j.partials, j.rows, j.h,
                            j.chunk, j.nchunks);
    goto done;
  }
  /* the partials first: dx may overwrite dy */
  if (j.partials) bx_tc_run(threads, nchunks * j.nblocks, partial_piece, &j);
  bx_tc_run(threads, (j.rows + j.piece - 1) / j.piece, dx_piece, &j);
done:
  bx_call_leave(&c);
  return st;
}
