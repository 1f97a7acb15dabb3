/*
 * permute.c — the token dispatch of bitexact_train.h ("MoE router and
 * token dispatch"): the dispatch plan (rows sorted by expert, then global
 * token id), the order of rows gathered from many ranks, the global chunks
 * of an expert's rows, and the permute / unpermute gathers forward and
 * backward. No scatter-add anywhere: every output element is written by
 * one task, as a gather in one fixed order, so no bit depends on the
 * thread count.
 */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "abi.h"
#include "bitexact_train.h"
#include "call.h"
#include "error.h"
#include "moe_internal.h"
#include "nan_canon.h"
#include "permute_hd.h"
#include "pool.h"
#include "train_device.h"
#include "workspace.h"

#define ROWS 16 /* rows (or tokens) per task */

/* struct_size (first), num_threads, then the call is entered */
static bx_status enter(bx_call *c, const char *fn, const bx_moe_dispatch_opts *opts,
                       int *threads) {
  return bx_tc_enter(c, fn, opts, sizeof *opts, offsetof(bx_moe_dispatch_opts, num_threads),
                     "bx_moe_dispatch_opts", "BX_MOE_DISPATCH_OPTS_DEFAULT", threads);
}

static size_t pieces_of(int64_t n) { return (size_t)(n / ROWS + (n % ROWS != 0)); }

/* Strictly ascending, >= 0 (index: the argument number). */
static bx_status check_ascending(const char *fn, const bx_tc_tensor *ids) {
  const int64_t *g = bx_tc_i64(ids);
  for (size_t i = 0; i < ids->n; i++) {
    if (g[i] < 0)
      return bx_fail_at(BX_EINVAL, -1, BX_NO_INDEX, ids->index,
                        "%s: tensor %zu (%s): element %zu = %lld is negative", fn, ids->index,
                        ids->name, i, (long long)g[i]);
    if (i && g[i] <= g[i - 1])
      return bx_fail_at(BX_EINVAL, -1, BX_NO_INDEX, ids->index,
                        "%s: tensor %zu (%s): element %zu = %lld after %lld: %s (global token ids "
                        "must be distinct and ascending)",
                        fn, ids->index, ids->name, i, (long long)g[i], (long long)g[i - 1],
                        g[i] == g[i - 1] ? "a duplicate" : "not ascending");
  }
  return BX_OK;
}

/* ---- the plan ---------------------------------------------------------------- */

bx_status bx_moe_dispatch_plan(const DLTensor *topk_ids, const DLTensor *token_ids,
                               DLTensor *offsets, DLTensor *row_map, DLTensor *pos,
                               const bx_moe_dispatch_opts *opts) {
  const char *fn = "bx_moe_dispatch_plan";
  int threads;
  bx_call call;
  bx_status st = enter(&call, fn, opts, &threads);
  if (st != BX_OK) return st;
  bx_tc_tensor ti, tg, to, tr, tp;
  int have_g = token_ids != NULL;
  if ((st = bx_tc_check(fn, 0, "topk_ids", topk_ids, BX_TC_IDS, 2, 2, NULL, 0, &ti)) != BX_OK) goto done;
  int64_t T = ti.dim[0], k = ti.dim[1], R = T * k;
  int64_t wg[1] = {T};
  if (have_g && (st = bx_tc_check(fn, 1, "token_ids", token_ids, BX_TC_I64, 1, 1, wg, 0, &tg)) != BX_OK)
    goto done;
  if ((st = bx_tc_check(fn, 2, "offsets", offsets, BX_TC_I64, 1, 1, NULL, 1, &to)) != BX_OK) goto done;
  int64_t E = to.dim[0] - 1;
  if (E < 1) {
    st = bx_fail_at(BX_EINVAL, -1, BX_NO_INDEX, 2, "%s: tensor 2 (offsets) has %lld elements, want E+1 >= 2",
                    fn, (long long)to.dim[0]);
    goto done;
  }
  int64_t wr[2] = {R, 2}, wp[2] = {T, k};
  if ((st = bx_tc_check(fn, 3, "row_map", row_map, BX_TC_I64, 2, 2, wr, 1, &tr)) != BX_OK) goto done;
  if ((st = bx_tc_check(fn, 4, "pos", pos, BX_TC_I64, 2, 2, wp, 1, &tp)) != BX_OK) goto done;
  const bx_tc_tensor *all[5] = {&ti, have_g ? &tg : NULL, &to, &tr, &tp};
  if ((st = bx_tc_overlap(fn, all, 5)) != BX_OK) goto done;
  if (have_g && (st = check_ascending(fn, &tg)) != BX_OK) goto done;
  size_t need = (size_t)E * 9 + 8;
  int64_t *cursor = bx_workspace(need);
  if (!cursor) {
    st = bx_fail(BX_ENOMEM, "%s: no memory for %zu bytes of scratch", fn, need);
    goto done;
  }
  unsigned char *seen = (unsigned char *)(cursor + E);
  memset(seen, 0, (size_t)E);
  if ((st = bx_moe_check_ids(fn, &ti, E, seen)) != BX_OK) goto done;
  /* counting sort: tokens ascending (= global ids ascending) within each expert */
  int64_t *off = to.data, *rm = tr.data, *p = tp.data;
  memset(cursor, 0, (size_t)E * sizeof *cursor);
  for (int64_t i = 0; i < R; i++) cursor[bx_tc_id(&ti, (size_t)i)]++;
  off[0] = 0;
  for (int64_t e = 0; e < E; e++) {
    off[e + 1] = off[e] + cursor[e];
    cursor[e] = off[e];
  }
  for (int64_t t = 0; t < T; t++)
    for (int64_t j = 0; j < k; j++) {
      int64_t r = cursor[bx_tc_id(&ti, (size_t)(t * k + j))]++;
      rm[2 * r] = t;
      rm[2 * r + 1] = j;
      p[t * k + j] = r;
    }
done:
  bx_call_leave(&call);
  return st;
}

/* ---- rows from many ranks --------------------------------------------------- */

typedef struct order_item {
  int64_t token, row;
} order_item;

static int by_token(const void *a, const void *b) {
  const order_item *x = a, *y = b;
  if (x->token != y->token) return x->token < y->token ? -1 : 1;
  return x->row < y->row ? -1 : x->row > y->row;
}

bx_status bx_moe_dispatch_order(const DLTensor *expert_ids, const DLTensor *token_ids,
                                DLTensor *offsets, DLTensor *order) {
  const char *fn = "bx_moe_dispatch_order";
  bx_call call;
  bx_status st = bx_call_enter(&call, fn);
  if (st != BX_OK) return st;
  bx_tc_tensor te, tg, to, tr;
  if ((st = bx_tc_check(fn, 0, "expert_ids", expert_ids, BX_TC_IDS, 1, 1, NULL, 0, &te)) != BX_OK)
    goto done;
  int64_t n = te.dim[0];
  int64_t wn[1] = {n};
  if ((st = bx_tc_check(fn, 1, "token_ids", token_ids, BX_TC_I64, 1, 1, wn, 0, &tg)) != BX_OK) goto done;
  if ((st = bx_tc_check(fn, 2, "offsets", offsets, BX_TC_I64, 1, 1, NULL, 1, &to)) != BX_OK) goto done;
  int64_t E = to.dim[0] - 1;
  if (E < 1) {
    st = bx_fail_at(BX_EINVAL, -1, BX_NO_INDEX, 2, "%s: tensor 2 (offsets) has %lld elements, want E+1 >= 2",
                    fn, (long long)to.dim[0]);
    goto done;
  }
  if ((st = bx_tc_check(fn, 3, "order", order, BX_TC_I64, 1, 1, wn, 1, &tr)) != BX_OK) goto done;
  const bx_tc_tensor *all[4] = {&te, &tg, &to, &tr};
  if ((st = bx_tc_overlap(fn, all, 4)) != BX_OK) goto done;
  const int64_t *g = bx_tc_i64(&tg);
  for (int64_t i = 0; i < n; i++) {
    int64_t e = bx_tc_id(&te, (size_t)i);
    if (e < 0 || e >= E) {
      st = bx_fail_at(BX_EINVAL, -1, BX_NO_INDEX, 0,
                      "%s: tensor 0 (expert_ids): element %lld = %lld is outside [0, %lld)", fn,
                      (long long)i, (long long)e, (long long)E);
      goto done;
    }
    if (g[i] < 0) {
      st = bx_fail_at(BX_EINVAL, -1, BX_NO_INDEX, 1,
                      "%s: tensor 1 (token_ids): element %lld = %lld is negative", fn,
                      (long long)i, (long long)g[i]);
      goto done;
    }
  }
  size_t need = (size_t)(E + 1) * 8 + (size_t)n * sizeof(order_item);
  int64_t *start = bx_workspace(need);
  if (!start) {
    st = bx_fail(BX_ENOMEM, "%s: no memory for %zu bytes of scratch", fn, need);
    goto done;
  }
  order_item *items = (order_item *)(start + E + 1);
  memset(start, 0, (size_t)(E + 1) * 8);
  for (int64_t i = 0; i < n; i++) start[bx_tc_id(&te, (size_t)i) + 1]++;
  for (int64_t e = 0; e < E; e++) start[e + 1] += start[e];
  {
    /* place by expert (cursor in offsets' future values, kept in start) */
    for (int64_t i = 0; i < n; i++) {
      int64_t e = bx_tc_id(&te, (size_t)i);
      items[start[e]].token = g[i];
      items[start[e]].row = i;
      start[e]++;
    }
    /* start[e] is now the end of expert e; its segment begins at start[e-1] */
    for (int64_t e = 0; e < E; e++) {
      int64_t b = e ? start[e - 1] : 0, m = start[e] - b;
      qsort(items + b, (size_t)m, sizeof *items, by_token);
      for (int64_t i = b + 1; i < start[e]; i++)
        if (items[i].token == items[i - 1].token) {
          st = bx_fail_at(BX_EINVAL, -1, BX_NO_INDEX, 1,
                          "%s: tensor 1 (token_ids): token %lld sent to expert %lld twice "
                          "(rows %lld and %lld)",
                          fn, (long long)items[i].token, (long long)e, (long long)items[i - 1].row,
                          (long long)items[i].row);
          goto done;
        }
    }
  }
  int64_t *off = to.data, *ord = tr.data;
  off[0] = 0;
  for (int64_t e = 0; e < E; e++) off[e + 1] = start[e];
  for (int64_t i = 0; i < n; i++) ord[i] = items[i].row;
done:
  bx_call_leave(&call);
  return st;
}

/* ---- global chunks of one expert's rows --------------------------------------- */

bx_status bx_moe_expert_chunks(const DLTensor *token_ids, int64_t chunk_tokens,
                               int64_t first_chunk, DLTensor *bounds) {
  const char *fn = "bx_moe_expert_chunks";
  bx_call call;
  bx_status st = bx_call_enter(&call, fn);
  if (st != BX_OK) return st;
  bx_tc_tensor tg, tb;
  if ((st = bx_tc_check(fn, 0, "token_ids", token_ids, BX_TC_I64, 1, 1, NULL, 0, &tg)) != BX_OK) goto done;
  if ((st = bx_tc_check(fn, 3, "bounds", bounds, BX_TC_I64, 1, 1, NULL, 1, &tb)) != BX_OK) goto done;
  int64_t m = tb.dim[0] - 1, C = chunk_tokens;
  if (m < 0) {
    st = bx_fail_at(BX_EINVAL, -1, BX_NO_INDEX, 3, "%s: tensor 3 (bounds) is empty, want m+1 >= 1 elements", fn);
    goto done;
  }
  if (C < 1 || first_chunk < 0 || first_chunk > INT64_MAX / C - m) {
    st = bx_fail(BX_EINVAL, "%s: chunk_tokens = %lld, first_chunk = %lld: want C >= 1, "
                 "first_chunk >= 0 and (first_chunk + m) * C < 2^63", fn, (long long)C,
                 (long long)first_chunk);
    goto done;
  }
  const bx_tc_tensor *all[2] = {&tg, &tb};
  if ((st = bx_tc_overlap(fn, all, 2)) != BX_OK) goto done;
  if ((st = check_ascending(fn, &tg)) != BX_OK) goto done;
  const int64_t *g = bx_tc_i64(&tg);
  int64_t n = tg.dim[0], lo = first_chunk * C, hi = (first_chunk + m) * C;
  if (n && (g[0] < lo || g[n - 1] >= hi)) {
    st = bx_fail_at(BX_EINVAL, -1, BX_NO_INDEX, 0,
                    "%s: tensor 0 (token_ids): ids %lld..%lld are not all in chunks %lld..%lld "
                    "(tokens [%lld, %lld))",
                    fn, (long long)g[0], (long long)g[n - 1], (long long)first_chunk,
                    (long long)(first_chunk + m - 1), (long long)lo, (long long)hi);
    goto done;
  }
  int64_t *b = tb.data, r = 0;
  for (int64_t i = 0; i <= m; i++) {
    int64_t edge = (first_chunk + i) * C;
    while (r < n && g[r] < edge) r++;
    b[i] = r;
  }
done:
  bx_call_leave(&call);
  return st;
}

/* ---- the gathers -------------------------------------------------------------- */

typedef struct gather_job {
  const float *x, *w, *init, *dout;
  const int64_t *rm, *pos;
  float *y, *dw;
  int64_t n, k, H; /* n: rows or tokens of the loop */
} gather_job;

/* a copy: the rows keep their bits (a NaN included) */
static void permute_piece(void *ctx, size_t task, int worker) {
  (void)worker;
  const gather_job *j = ctx;
  int64_t r0 = (int64_t)task * ROWS, r1 = r0 + ROWS < j->n ? r0 + ROWS : j->n;
  for (int64_t r = r0; r < r1; r++)
    memcpy(j->y + r * j->H, j->x + j->rm[2 * r] * j->H, (size_t)j->H * sizeof(float));
}

/* dx[t] = sum_j x[pos[t][j]] (x = dx_perm), fp32 adds from +0, j ascending. */
static void gather_sum_piece(void *ctx, size_t task, int worker) {
  (void)worker;
  const gather_job *j = ctx;
  int64_t t0 = (int64_t)task * ROWS, t1 = t0 + ROWS < j->n ? t0 + ROWS : j->n;
  for (int64_t t = t0; t < t1; t++) {
    float *o = j->y + t * j->H;
    for (int64_t h = 0; h < j->H; h++) o[h] = 0.0f;
    for (int64_t a = 0; a < j->k; a++) {
      const float *src = j->x + j->pos[t * j->k + a] * j->H;
      for (int64_t h = 0; h < j->H; h++) o[h] = bx_permute_sum_step_f32(o[h], src[h]);
    }
    bx_canon_f32_n(o, (uint64_t)j->H); /* the row, still in cache */
  }
}

/* out[t] = (sum_j f32(w[t][j] * y[pos[t][j]])) (+ initial[t]). */
static void unpermute_piece(void *ctx, size_t task, int worker) {
  (void)worker;
  const gather_job *j = ctx;
  int64_t t0 = (int64_t)task * ROWS, t1 = t0 + ROWS < j->n ? t0 + ROWS : j->n;
  for (int64_t t = t0; t < t1; t++) {
    float *o = j->y + t * j->H;
    for (int64_t h = 0; h < j->H; h++) o[h] = 0.0f;
    for (int64_t a = 0; a < j->k; a++) {
      const float *src = j->x + j->pos[t * j->k + a] * j->H;
      float w = j->w[t * j->k + a];
      for (int64_t h = 0; h < j->H; h++) o[h] = bx_unpermute_step_f32(o[h], w, src[h]);
    }
    if (j->init) {
      const float *in = j->init + t * j->H;
      for (int64_t h = 0; h < j->H; h++) o[h] = bx_permute_sum_step_f32(o[h], in[h]);
    }
    bx_canon_f32_n(o, (uint64_t)j->H); /* the row, still in cache */
  }
}

/* dy_perm[r] = w[t][j] * dout[t], (t, j) = row_map[r]. */
static void dyperm_piece(void *ctx, size_t task, int worker) {
  (void)worker;
  const gather_job *j = ctx;
  int64_t r0 = (int64_t)task * ROWS, r1 = r0 + ROWS < j->n ? r0 + ROWS : j->n;
  for (int64_t r = r0; r < r1; r++) {
    int64_t t = j->rm[2 * r], a = j->rm[2 * r + 1];
    float w = j->w[t * j->k + a];
    const float *d = j->dout + t * j->H;
    float *o = j->y + r * j->H;
    for (int64_t h = 0; h < j->H; h++) o[h] = bx_unpermute_dy_f32(w, d[h]);
  }
}

/* dw[t][j] = fmaf chain over h of dout[t][h] * y_perm[pos[t][j]][h]. */
static void dweights_piece(void *ctx, size_t task, int worker) {
  (void)worker;
  const gather_job *j = ctx;
  int64_t t0 = (int64_t)task * ROWS, t1 = t0 + ROWS < j->n ? t0 + ROWS : j->n;
  for (int64_t t = t0; t < t1; t++) {
    const float *d = j->dout + t * j->H;
    for (int64_t a = 0; a < j->k; a++) {
      const float *src = j->x + j->pos[t * j->k + a] * j->H;
      j->dw[t * j->k + a] = bx_unpermute_dw_out_f32(d, src, j->H);
    }
  }
}

/* row_map's rows within [0, T) x [0, k) (bx_moe_permute's check). */
static bx_status check_rows(const char *fn, const bx_tc_tensor *tr, int64_t T, int64_t k) {
  const int64_t *rm = bx_tc_i64(tr);
  for (int64_t r = 0; r < tr->dim[0]; r++)
    if (rm[2 * r] < 0 || rm[2 * r] >= T || rm[2 * r + 1] < 0 || rm[2 * r + 1] >= k)
      return bx_fail_at(BX_EINVAL, -1, BX_NO_INDEX, 1,
                        "%s: tensor 1 (row_map): row %lld = (%lld, %lld) is outside [0, %lld) x "
                        "[0, %lld)",
                        fn, (long long)r, (long long)rm[2 * r], (long long)rm[2 * r + 1],
                        (long long)T, (long long)k);
  return BX_OK;
}

/* The CUDA path's plan check: row_map and pos copied to the host and
 * checked there (bx_moe_check_plan: the host path's errors, before any
 * launch); *dev the backend. */
static bx_status plan_cuda(const char *fn, const bx_tc_place *pl, const bx_train_device **dev,
                           const bx_tc_tensor *tr, const bx_tc_tensor *tp) {
  bx_status st = bx_train_cuda(fn, dev);
  if (st != BX_OK) return st;
  const bx_tc_tensor *src[2] = {tr, tp};
  bx_tc_tensor host[2];
  st = bx_tc_to_host(fn, pl, *dev, src, host, 2, 0, NULL);
  return st == BX_OK ? bx_moe_check_plan(fn, &host[0], &host[1]) : st;
}

bx_status bx_moe_permute(const DLTensor *x, const DLTensor *row_map, DLTensor *x_perm,
                         const bx_moe_dispatch_opts *opts) {
  const char *fn = "bx_moe_permute";
  int threads;
  bx_call call;
  bx_status st = enter(&call, fn, opts, &threads);
  if (st != BX_OK) return st;
  bx_tc_tensor tx, tr, ty;
  const DLTensor *ts[3] = {x, row_map, x_perm};
  const bx_tc_place pl = bx_tc_place_of(ts, 3);
  if ((st = bx_tc_check_in(&pl, fn, 0, "x", x, BX_TC_F32, 2, 2, NULL, 0, &tx)) != BX_OK) goto done;
  int64_t T = tx.dim[0], H = tx.dim[1];
  int64_t wr[2] = {-1, 2};
  if ((st = bx_tc_check_in(&pl, fn, 1, "row_map", row_map, BX_TC_I64, 2, 2, wr, 0, &tr)) != BX_OK)
    goto done;
  int64_t R = tr.dim[0];
  int64_t wy[2] = {R, H};
  if ((st = bx_tc_check_in(&pl, fn, 2, "x_perm", x_perm, BX_TC_F32, 2, 2, wy, 1, &ty)) != BX_OK)
    goto done;
  const bx_tc_tensor *all[3] = {&tx, &tr, &ty};
  if ((st = bx_tc_overlap(fn, all, 3)) != BX_OK) goto done;
  if (T == 0 ? R != 0 : R % T != 0) {
    st = bx_fail_at(BX_EINVAL, -1, BX_NO_INDEX, 1,
                    "%s: tensor 1 (row_map) has %lld rows, not a multiple of T = %lld", fn,
                    (long long)R, (long long)T);
    goto done;
  }
  int64_t k = T ? R / T : 0;
  if (pl.cuda) {
    /* row_map copied to the host and checked there, then one thread per element */
    const bx_train_device *dev;
    const bx_tc_tensor *src[1] = {&tr};
    bx_tc_tensor hr;
    if ((st = bx_train_cuda(fn, &dev)) != BX_OK) goto done;
    if ((st = bx_tc_to_host(fn, &pl, dev, src, &hr, 1, 0, NULL)) != BX_OK) goto done;
    if ((st = check_rows(fn, &hr, T, k)) != BX_OK) goto done;
    st = dev->moe_permute(fn, pl.device, tx.data, tr.data, ty.data, (size_t)R, (size_t)H);
    goto done;
  }
  if ((st = check_rows(fn, &tr, T, k)) != BX_OK) goto done;
  const int64_t *rm = bx_tc_i64(&tr);
  gather_job j = {tx.data, NULL, NULL, NULL, rm, NULL, ty.data, NULL, R, k, H};
  if (R && H) bx_parallel_run(bx_tc_threads(threads, pieces_of(R)), pieces_of(R), permute_piece, &j);
done:
  bx_call_leave(&call);
  return st;
}

/* The checks of a gather that takes a plan: plan tensors at argument
 * numbers ir, ip; T and k from pos. */
static bx_status plan_args(const bx_tc_place *pl, const char *fn, const DLTensor *row_map,
                           const DLTensor *pos, size_t ir, size_t ip, bx_tc_tensor *tr,
                           bx_tc_tensor *tp) {
  int64_t wr[2] = {-1, 2};
  bx_status st = bx_tc_check_in(pl, fn, ir, "row_map", row_map, BX_TC_I64, 2, 2, wr, 0, tr);
  if (st == BX_OK) st = bx_tc_check_in(pl, fn, ip, "pos", pos, BX_TC_I64, 2, 2, NULL, 0, tp);
  return st;
}

bx_status bx_moe_permute_backward(const DLTensor *dx_perm, const DLTensor *row_map,
                                  const DLTensor *pos, DLTensor *dx,
                                  const bx_moe_dispatch_opts *opts) {
  const char *fn = "bx_moe_permute_backward";
  int threads;
  bx_call call;
  bx_status st = enter(&call, fn, opts, &threads);
  if (st != BX_OK) return st;
  bx_tc_tensor ty, tr, tp, tx;
  const DLTensor *ts[4] = {dx_perm, row_map, pos, dx};
  const bx_tc_place pl = bx_tc_place_of(ts, 4);
  if ((st = bx_tc_check_in(&pl, fn, 0, "dx_perm", dx_perm, BX_TC_F32, 2, 2, NULL, 0, &ty)) != BX_OK)
    goto done;
  if ((st = plan_args(&pl, fn, row_map, pos, 1, 2, &tr, &tp)) != BX_OK) goto done;
  int64_t T = tp.dim[0], k = tp.dim[1], H = ty.dim[1];
  int64_t wx[2] = {T, H};
  if ((st = bx_tc_check_in(&pl, fn, 3, "dx", dx, BX_TC_F32, 2, 2, wx, 1, &tx)) != BX_OK) goto done;
  if (ty.dim[0] != tr.dim[0]) {
    st = bx_fail_at(BX_EINVAL, -1, BX_NO_INDEX, 0, "%s: tensor 0 (dx_perm) has %lld rows, row_map %lld",
                    fn, (long long)ty.dim[0], (long long)tr.dim[0]);
    goto done;
  }
  const bx_tc_tensor *all[4] = {&ty, &tr, &tp, &tx};
  if ((st = bx_tc_overlap(fn, all, 4)) != BX_OK) goto done;
  if (pl.cuda) {
    const bx_train_device *dev;
    if ((st = plan_cuda(fn, &pl, &dev, &tr, &tp)) != BX_OK) goto done;
    st = dev->moe_permute_bwd(fn, pl.device, ty.data, tp.data, tx.data, (size_t)T, (size_t)k,
                              (size_t)H);
    goto done;
  }
  if ((st = bx_moe_check_plan(fn, &tr, &tp)) != BX_OK) goto done;
  gather_job j = {ty.data, NULL, NULL, NULL, tr.data, tp.data, tx.data, NULL, T, k, H};
  if (T && H) bx_parallel_run(bx_tc_threads(threads, pieces_of(T)), pieces_of(T), gather_sum_piece, &j);
done:
  bx_call_leave(&call);
  return st;
}

bx_status bx_moe_unpermute(const DLTensor *y_perm, const DLTensor *weights,
                           const DLTensor *row_map, const DLTensor *pos, const DLTensor *initial,
                           DLTensor *out, const bx_moe_dispatch_opts *opts) {
  const char *fn = "bx_moe_unpermute";
  int threads;
  bx_call call;
  bx_status st = enter(&call, fn, opts, &threads);
  if (st != BX_OK) return st;
  bx_tc_tensor ty, tw, tr, tp, ti, to;
  int have_i = initial != NULL;
  const DLTensor *ts[6] = {y_perm, weights, row_map, pos, initial, out};
  const bx_tc_place pl = bx_tc_place_of(ts, 6);
  if ((st = bx_tc_check_in(&pl, fn, 0, "y_perm", y_perm, BX_TC_F32, 2, 2, NULL, 0, &ty)) != BX_OK)
    goto done;
  if ((st = bx_tc_check_in(&pl, fn, 1, "weights", weights, BX_TC_F32, 2, 2, NULL, 0, &tw)) != BX_OK)
    goto done;
  if ((st = plan_args(&pl, fn, row_map, pos, 2, 3, &tr, &tp)) != BX_OK) goto done;
  int64_t T = tp.dim[0], k = tp.dim[1], H = ty.dim[1];
  int64_t wtk[2] = {T, k}, wth[2] = {T, H};
  if (tw.dim[0] != T || tw.dim[1] != k) {
    st = bx_fail_at(BX_EINVAL, -1, BX_NO_INDEX, 1, "%s: tensor 1 (weights) is [%lld, %lld], pos [%lld, %lld]",
                    fn, (long long)tw.dim[0], (long long)tw.dim[1], (long long)T, (long long)k);
    goto done;
  }
  (void)wtk;
  if (have_i &&
      (st = bx_tc_check_in(&pl, fn, 4, "initial", initial, BX_TC_F32, 2, 2, wth, 0, &ti)) != BX_OK)
    goto done;
  if ((st = bx_tc_check_in(&pl, fn, 5, "out", out, BX_TC_F32, 2, 2, wth, 1, &to)) != BX_OK)
    goto done;
  if (ty.dim[0] != tr.dim[0]) {
    st = bx_fail_at(BX_EINVAL, -1, BX_NO_INDEX, 0, "%s: tensor 0 (y_perm) has %lld rows, row_map %lld",
                    fn, (long long)ty.dim[0], (long long)tr.dim[0]);
    goto done;
  }
  const bx_tc_tensor *all[6] = {&ty, &tw, &tr, &tp, have_i ? &ti : NULL, &to};
  if ((st = bx_tc_overlap(fn, all, 6)) != BX_OK) goto done;
  if (pl.cuda) {
    const bx_train_device *dev;
    if ((st = plan_cuda(fn, &pl, &dev, &tr, &tp)) != BX_OK) goto done;
    st = dev->moe_unpermute(fn, pl.device, ty.data, tw.data, tp.data, have_i ? ti.data : NULL,
                            to.data, (size_t)T, (size_t)k, (size_t)H);
    goto done;
  }
  if ((st = bx_moe_check_plan(fn, &tr, &tp)) != BX_OK) goto done;
  gather_job j = {ty.data, tw.data, have_i ? ti.data : NULL, NULL, tr.data, tp.data, to.data,
                  NULL, T, k, H};
  if (T && H) bx_parallel_run(bx_tc_threads(threads, pieces_of(T)), pieces_of(T), unpermute_piece, &j);
done:
  bx_call_leave(&call);
  return st;
}

bx_status bx_moe_unpermute_backward(const DLTensor *dout, const DLTensor *y_perm,
                                    const DLTensor *weights, const DLTensor *row_map,
                                    const DLTensor *pos, DLTensor *dy_perm, DLTensor *dweights,
                                    const bx_moe_dispatch_opts *opts) {
  const char *fn = "bx_moe_unpermute_backward";
  int threads;
  bx_call call;
  bx_status st = enter(&call, fn, opts, &threads);
  if (st != BX_OK) return st;
  bx_tc_tensor td, ty, tw, tr, tp, tdy, tdw;
  int have_dy = dy_perm != NULL, have_dw = dweights != NULL;
  const DLTensor *ts[7] = {dout, y_perm, weights, row_map, pos, dy_perm, dweights};
  const bx_tc_place pl = bx_tc_place_of(ts, 7);
  if ((st = bx_tc_check_in(&pl, fn, 0, "dout", dout, BX_TC_F32, 2, 2, NULL, 0, &td)) != BX_OK)
    goto done;
  int64_t T = td.dim[0], H = td.dim[1];
  int64_t wy[2] = {-1, H};
  if ((st = bx_tc_check_in(&pl, fn, 1, "y_perm", y_perm, BX_TC_F32, 2, 2, wy, 0, &ty)) != BX_OK)
    goto done;
  int64_t wt[2] = {T, -1};
  if ((st = bx_tc_check_in(&pl, fn, 2, "weights", weights, BX_TC_F32, 2, 2, wt, 0, &tw)) != BX_OK)
    goto done;
  if ((st = plan_args(&pl, fn, row_map, pos, 3, 4, &tr, &tp)) != BX_OK) goto done;
  int64_t k = tw.dim[1], R = ty.dim[0];
  if (tp.dim[0] != T || tp.dim[1] != k) {
    st = bx_fail_at(BX_EINVAL, -1, BX_NO_INDEX, 4, "%s: tensor 4 (pos) is [%lld, %lld], weights [%lld, %lld]",
                    fn, (long long)tp.dim[0], (long long)tp.dim[1], (long long)T, (long long)k);
    goto done;
  }
  if (R != tr.dim[0]) {
    st = bx_fail_at(BX_EINVAL, -1, BX_NO_INDEX, 1, "%s: tensor 1 (y_perm) has %lld rows, row_map %lld",
                    fn, (long long)R, (long long)tr.dim[0]);
    goto done;
  }
  int64_t wdy[2] = {R, H}, wdw[2] = {T, k};
  if (have_dy &&
      (st = bx_tc_check_in(&pl, fn, 5, "dy_perm", dy_perm, BX_TC_F32, 2, 2, wdy, 1, &tdy)) != BX_OK)
    goto done;
  if (have_dw && (st = bx_tc_check_in(&pl, fn, 6, "dweights", dweights, BX_TC_F32, 2, 2, wdw,
                                       1, &tdw)) != BX_OK)
    goto done;
  if (!have_dy && !have_dw) {
    st = bx_fail(BX_EINVAL, "%s: dy_perm and dweights are both NULL: nothing to compute", fn);
    goto done;
  }
  const bx_tc_tensor *all[7] = {&td, &ty, &tw, &tr, &tp, have_dy ? &tdy : NULL,
                                 have_dw ? &tdw : NULL};
  if ((st = bx_tc_overlap(fn, all, 7)) != BX_OK) goto done;
  if (pl.cuda) {
    const bx_train_device *dev;
    if ((st = plan_cuda(fn, &pl, &dev, &tr, &tp)) != BX_OK) goto done;
    st = dev->moe_unpermute_bwd(fn, pl.device, td.data, ty.data, tw.data, tr.data, tp.data,
                                have_dy ? tdy.data : NULL, have_dw ? tdw.data : NULL, (size_t)T,
                                (size_t)k, (size_t)H);
    goto done;
  }
  if ((st = bx_moe_check_plan(fn, &tr, &tp)) != BX_OK) goto done;
  int nt = bx_tc_threads(threads, pieces_of(R > T ? R : T));
  if (have_dy && R && H) {
    gather_job j = {NULL, tw.data, NULL, td.data, tr.data, tp.data, tdy.data, NULL, R, k, H};
    bx_parallel_run(nt, pieces_of(R), dyperm_piece, &j);
  }
  if (have_dw && T) {
    gather_job j = {ty.data, NULL, NULL, td.data, tr.data, tp.data, NULL, tdw.data, T, k, H};
    bx_parallel_run(nt, pieces_of(T), dweights_piece, &j);
  }
done:
  bx_call_leave(&call);
  return st;
}
