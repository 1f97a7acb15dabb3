/*
 * attention.c — bx_attention_forward (bitexact_train.h, "Layers: causal
 * GQA attention") and the argument checks it shares with the backward
 * (attention_bwd.c). One piece of work is (sequence, query head, block of
 * ATTN_ROWS positions); every row i is computed alone, in the documented
 * order, from its own scores: the pieces, the thread count and the batch
 * cannot change a bit.
 */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "abi.h"
#include "attention_hd.h"
#include "attention_internal.h"
#include "call.h"
#include "dtype.h"
#include "error.h"
#include "kernels.h"
#include "math_det.h"
#include "nan_canon.h"
#include "pool.h"
#include "tensor.h"
#include "train_check.h"
#include "train_device.h"
#include "workspace.h"

#define ATTN_ROWS 32 /* about this many positions per forward piece (speed only) */

/* ---- checks ----------------------------------------------------------------- */

bx_status bx_attn_enter(bx_call *call, const char *fn, const bx_attention_opts *opts) {
  int threads;
  return bx_tc_enter(call, fn, opts, sizeof *opts, offsetof(bx_attention_opts, num_threads),
                     "bx_attention_opts", "BX_ATTENTION_OPTS_DEFAULT", &threads);
}

bx_status bx_attn_check(const char *fn, const bx_tc_place *pl, const bx_attention_opts *opts,
                        int64_t seq_len,
                        int64_t num_heads, int64_t num_kv_heads, int64_t head_dim,
                        const bx_attn_arg *args, size_t nargs, float **data, bx_attn_geom *g) {
  bx_attention_opts o = BX_ATTENTION_OPTS_DEFAULT;
  if (opts) o = *opts;
  if (seq_len < 1 || seq_len > BX_ATTN_MAX_LEN)
    return bx_fail(BX_EINVAL, "%s: seq_len %lld is not in [1, 2^30]", fn, (long long)seq_len);
  if (head_dim < 1 || head_dim > BX_ATTN_MAX_DIM)
    return bx_fail(BX_EINVAL, "%s: head_dim %lld is not in [1, 2^20]", fn, (long long)head_dim);
  if (num_heads < 1 || num_heads > BX_ATTN_MAX_DIM || num_kv_heads < 1 || num_kv_heads > num_heads)
    return bx_fail(BX_EINVAL, "%s: num_heads %lld, num_kv_heads %lld: want 1 <= num_kv_heads <= "
                   "num_heads <= 2^20", fn, (long long)num_heads, (long long)num_kv_heads);
  if (num_heads % num_kv_heads)
    return bx_fail(BX_EINVAL, "%s: num_heads %lld is not a multiple of num_kv_heads %lld", fn,
                   (long long)num_heads, (long long)num_kv_heads);
  if ((uint64_t)num_heads * (uint64_t)head_dim > ((uint64_t)1 << 31))
    return bx_fail(BX_EINVAL, "%s: num_heads * head_dim = %lld is too large", fn,
                   (long long)(num_heads * head_dim));
  bx_tc_tensor sp[8];
  const bx_tc_tensor *all[8];
  if (nargs == 0 || nargs > 8) return bx_fail(BX_EINVAL, "%s: internal: too many tensors", fn);
  for (size_t i = 0; i < nargs; i++) {
    int stats = args[i].kind == BX_ATTN_STATS;
    bx_status st = bx_tc_check_in(pl, fn, i, args[i].name, args[i].t, BX_TC_F32, stats ? 3 : 2,
                                  3, NULL, args[i].writable, &sp[i]);
    if (st != BX_OK) return st;
    if (stats) sp[i].rows = (size_t)sp[i].dim[0]; /* [T, num_heads, 2]: T rows */
    all[i] = &sp[i];
  }
  size_t L = (size_t)seq_len, Hq = (size_t)num_heads, Hkv = (size_t)num_kv_heads, D = (size_t)head_dim;
  size_t T = sp[0].rows;
  for (size_t i = 0; i < nargs; i++) {
    const bx_attn_arg *a = &args[i];
    const DLTensor *t = a->t;
    size_t cols = a->kind == BX_ATTN_Q ? Hq * D : a->kind == BX_ATTN_KV ? Hkv * D : 2;
    const char *what = a->kind == BX_ATTN_Q ? "num_heads * head_dim"
                       : a->kind == BX_ATTN_KV ? "num_kv_heads * head_dim" : "2";
    if (sp[i].cols != cols)
      return bx_fail_at(BX_EINVAL, -1, BX_NO_GROUP, i,
                        "%s: tensor %zu (%s): last dimension %zu, want %s = %zu", fn, i, a->name,
                        sp[i].cols, what, cols);
    if (sp[i].rows != T)
      return bx_fail_at(BX_EINVAL, -1, BX_NO_GROUP, i,
                        "%s: tensor %zu (%s) has %zu tokens, tensor 0 (%s) has %zu", fn, i, a->name,
                        sp[i].rows, args[0].name, T);
    if (a->kind == BX_ATTN_STATS && (size_t)t->shape[1] != Hq)
      return bx_fail_at(BX_EINVAL, -1, BX_NO_GROUP, i,
                        "%s: tensor %zu (%s) is [%zu, %lld, 2], want [T, num_heads = %zu, 2]", fn,
                        i, a->name, T, (long long)t->shape[1], Hq);
    if (a->kind != BX_ATTN_STATS && t->ndim == 3 && (size_t)t->shape[1] != L)
      return bx_fail_at(BX_EINVAL, -1, BX_NO_GROUP, i,
                        "%s: tensor %zu (%s) is [B, %lld, F] but seq_len is %zu", fn, i, a->name,
                        (long long)t->shape[1], L);
  }
  if (T % L)
    return bx_fail_at(BX_EINVAL, -1, BX_NO_GROUP, 0,
                      "%s: tensor 0 (%s): T = %zu tokens is not a multiple of seq_len = %zu "
                      "(T = B * L)", fn, args[0].name, T, L);
  bx_status st = bx_tc_overlap(fn, all, nargs);
  if (st != BX_OK) return st;
  for (size_t i = 0; i < nargs; i++) data[i] = sp[i].data;
  g->T = T;
  g->L = L;
  g->B = T / L;
  g->Hq = Hq;
  g->Hkv = Hkv;
  g->R = Hq / Hkv;
  g->D = D;
  g->ldq = Hq * D;
  g->ldk = Hkv * D;
  g->scale = bx_rsqrtf_det((float)D);
  int nt = o.num_threads > 0 ? o.num_threads : bx_default_threads();
  if (nt > BX_MAX_THREADS) nt = BX_MAX_THREADS;
  g->nthreads = nt;
  return BX_OK;
}

/* ---- the forward ------------------------------------------------------------
 *
 * First k and v of each (sequence, kv head) are packed for the
 * micro-kernel, once. Then per piece (sequence b, query head h, rows
 * [i0, i1)): the score chains
 * dot(q_i, k_j) for the block's rows and every j < i1 come from the GEMM
 * micro-kernel of the active ISA (kernels.h: per element the chain
 * acc = +0, acc = fma(a_k, b_k, acc) for k = 0..kc-1, the same bits on
 * every ISA), on q and k packed into its slivers; the softmax is scalar;
 * o_i = sum_j p_j v_j is the micro-kernel's chain over j = 0..i0+r (r the
 * row's mr-sliver in the block: those j are in every row's window),
 * continued for the sliver's rows by one-step calls (kc = 1) at the
 * diagonal, each row taken as soon as its last term is in. Each element is
 * thus exactly the documented chain. */

typedef struct fwd_job {
  bx_attn_geom g;
  const float *q, *k, *v;
  float *o, *stats;
  const bx_gemm_kernel *kern;
  size_t rows;     /* positions per piece, a multiple of mr */
  size_t nblk;     /* row blocks per (sequence, head) */
  float *kp, *vp;  /* per (sequence, kv head): k packed as the B of q.k^T (kpe
                    * floats), v as the B of p.V (vpe floats); 64-byte aligned */
  size_t kpe, vpe;
  char *scratch;   /* per worker: each bytes, 64-byte aligned */
  size_t each;
} fwd_job;

static size_t rup(size_t x, size_t q) { return (x + q - 1) / q * q; }

/* attention_internal.h describes the two packings */
void bx_attn_pack_rows(const float *x, size_t ld, size_t n, size_t kc, size_t w, float *out) {
  for (size_t s = 0; s < n; s += w) {
    size_t hgt = n - s < w ? n - s : w;
    for (size_t k = 0; k < kc; k++) {
      float *dst = out + s * kc + k * w;
      for (size_t ii = 0; ii < hgt; ii++) dst[ii] = x[(s + ii) * ld + k];
      for (size_t ii = hgt; ii < w; ii++) dst[ii] = 0.0f;
    }
  }
}

void bx_attn_pack_cols(const float *x, size_t ld, size_t kc, size_t D, size_t w, float *out) {
  for (size_t s = 0; s < D; s += w) {
    size_t wd = D - s < w ? D - s : w;
    for (size_t k = 0; k < kc; k++) {
      float *dst = out + s * kc + k * w;
      for (size_t jj = 0; jj < wd; jj++) dst[jj] = x[k * ld + s + jj];
      for (size_t jj = wd; jj < w; jj++) dst[jj] = 0.0f;
    }
  }
}

/* floats of one worker's scratch for rows rp (a multiple of mr) and L */
static size_t fwd_scratch_floats(const bx_attn_geom *g, size_t rp, size_t nr) {
  size_t ncp = rup(g->L, nr), dp = rup(g->D, nr);
  return rup(rp * g->D, 16) + rup(rp * ncp, 16) + rup(rp * g->L, 16) + rup(rp * dp, 16);
}

/* the first pass: k and v of (sequence, kv head) packed once for all the
 * blocks of the group's query heads */
static void fwd_pack_task(void *ctx, size_t task, int worker) {
  const fwd_job *j = ctx;
  const bx_attn_geom *g = &j->g;
  size_t b = task / g->Hkv, kvh = task % g->Hkv, nr = j->kern->nr;
  const float *kbase = j->k + b * g->L * g->ldk + kvh * g->D, *vbase = j->v + b * g->L * g->ldk + kvh * g->D;
  (void)worker;
  bx_attn_pack_rows(kbase, g->ldk, g->L, g->D, nr, j->kp + task * j->kpe);
  bx_attn_pack_cols(vbase, g->ldk, g->L, g->D, nr, j->vp + task * j->vpe);
}

static void fwd_task(void *ctx, size_t task, int worker) {
  const fwd_job *j = ctx;
  const bx_attn_geom *g = &j->g;
  const bx_gemm_kernel *kern = j->kern;
  size_t mr = kern->mr, nr = kern->nr, D = g->D;
  size_t blk = task % j->nblk, bh = task / j->nblk;
  size_t b = bh / g->Hq, h = bh % g->Hq, kvh = h / g->R, t0 = b * g->L;
  size_t i0 = blk * j->rows, i1 = g->L - i0 < j->rows ? g->L : i0 + j->rows;
  size_t rows = i1 - i0, rp = rup(rows, mr), ncp = rup(i1, nr), dp = rup(D, nr);
  float *qa = (float *)(j->scratch + (size_t)worker * j->each);
  float *S = qa + rup(rp * D, 16), *pa = S + rup(rp * ncp, 16), *ot = pa + rup(rp * g->L, 16);
  const float *kb = j->kp + (b * g->Hkv + kvh) * j->kpe, *vb = j->vp + (b * g->Hkv + kvh) * j->vpe;
  /* scores: the tiles that touch j <= i */
  bx_attn_pack_rows(j->q + (t0 + i0) * g->ldq + h * D, g->ldq, rows, D, mr, qa);
  for (size_t r = 0; r < rp; r += mr)
    for (size_t c = 0; c < ncp && c <= i0 + r + mr - 1; c += nr)
      kern->micro(D, qa + r * D, kb + c * D, S + r * ncp + c, ncp, 0);
  /* softmax per row, in place in S: p_j */
  for (size_t ii = 0; ii < rows; ii++) {
    size_t i = i0 + ii;
    float *s = S + ii * ncp, m, l;
    bx_attn_softmax_row_f32(s, i + 1, g->scale, &m, &l); /* attention_hd.h */
    for (size_t c = i + 1; c < i1; c++) s[c] = 0.0f; /* read by the packing, never kept */
    bx_attn_store_stats(j->stats + ((t0 + i) * g->Hq + h) * 2, m, l);
  }
  /* o, per mr-sliver r of rows: the micro-kernel over j = 0..i0+r (in
   * every row's window) leaves row 0 finished; then one step per j =
   * i0+r+s (s = 1..mr-1) for the whole tile finishes row s, whose value is
   * taken before the next step (the lanes of rows < s that a step spoils
   * are never read again) */
  bx_attn_pack_rows(S, ncp, rows, i1, mr, pa);
  for (size_t r = 0; r < rp; r += mr) {
    size_t hgt = rows - r < mr ? rows - r : mr;
    const float *ar = pa + r * i1;
    for (size_t c = 0; c < dp; c += nr) {
      size_t wd = D - c < nr ? D - c : nr;
      float *out = j->o + (t0 + i0 + r) * g->ldq + h * D + c;
      kern->micro(i0 + r + 1, ar, vb + c * g->L, ot, dp, 0);
      bx_canon_f32_copy(out, ot, wd); /* the stored rows: canonical NaN */
      for (size_t s = 1; s < hgt; s++) {
        size_t jj = i0 + r + s;
        kern->micro(1, ar + jj * mr, vb + c * g->L + jj * nr, ot, dp, 1);
        bx_canon_f32_copy(out + s * g->ldq, ot + s * dp, wd);
      }
    }
  }
}

bx_status bx_attention_forward(const DLTensor *q, const DLTensor *k, const DLTensor *v,
                               int64_t seq_len, int64_t num_heads, int64_t num_kv_heads,
                               int64_t head_dim, DLTensor *o, DLTensor *stats,
                               const bx_attention_opts *opts) {
  static const char *fn = "bx_attention_forward";
  bx_call call;
  bx_status st = bx_attn_enter(&call, fn, opts);
  if (st != BX_OK) return st;
  const bx_attn_arg args[5] = {{q, "q", BX_ATTN_Q, 0},     {k, "k", BX_ATTN_KV, 0},
                               {v, "v", BX_ATTN_KV, 0},    {o, "o", BX_ATTN_Q, 1},
                               {stats, "stats", BX_ATTN_STATS, 1}};
  const DLTensor *ts[5] = {q, k, v, o, stats};
  const bx_tc_place pl = bx_tc_place_of(ts, 5);
  float *data[5];
  fwd_job j;
  st = bx_attn_check(fn, &pl, opts, seq_len, num_heads, num_kv_heads, head_dim, args, 5, data,
                     &j.g);
  if (st != BX_OK) goto done;
  j.q = data[0];
  j.k = data[1];
  j.v = data[2];
  j.o = data[3];
  j.stats = data[4];
  if (pl.cuda) { /* every tensor on one CUDA device: train_device.h */
    const bx_train_device *dev;
    st = bx_train_cuda(fn, &dev);
    if (st == BX_OK && j.g.T)
      st = dev->attention_fwd(fn, pl.device, j.q, j.k, j.v, j.o, j.stats, j.g.T, j.g.L, j.g.Hq,
                              j.g.Hkv, j.g.D, j.g.scale);
    goto done;
  }
  if (j.g.T == 0) goto done;
  j.kern = bx_gemm_kernel_active();
  j.rows = rup(ATTN_ROWS, j.kern->mr);
  j.nblk = (j.g.L + j.rows - 1) / j.rows;
  size_t ntasks = j.g.B * j.g.Hq * j.nblk;
  int nt = j.g.nthreads;
  if ((size_t)nt > ntasks) nt = (int)ntasks;
  size_t npk = j.g.B * j.g.Hkv, nr = j.kern->nr;
  j.kpe = rup(rup(j.g.L, nr) * j.g.D, 16);
  j.vpe = rup(rup(j.g.D, nr) * j.g.L, 16);
  j.each = rup(fwd_scratch_floats(&j.g, j.rows, nr) * sizeof(float), 64);
  double need = (double)j.each * nt + 4.0 * (double)npk * (double)(j.kpe + j.vpe) + 64;
  if (need > (double)(SIZE_MAX / 2)) {
    st = bx_fail(BX_ENOMEM, "%s: seq_len and head_dim need too much scratch", fn);
    goto done;
  }
  size_t bytes = j.each * (size_t)nt + npk * (j.kpe + j.vpe) * sizeof(float) + 64;
  char *ws = bx_workspace(bytes);
  if (!ws) {
    st = bx_fail(BX_ENOMEM, "%s: cannot allocate %zu bytes of scratch", fn, bytes);
    goto done;
  }
  j.scratch = ws + (64 - (uintptr_t)ws % 64) % 64;
  j.kp = (float *)(j.scratch + j.each * (size_t)nt);
  j.vp = j.kp + npk * j.kpe;
  bx_parallel_run((size_t)nt > npk ? (int)npk : nt, npk, fwd_pack_task, &j);
  bx_parallel_run(nt, ntasks, fwd_task, &j);
done:
  bx_call_leave(&call);
  return st;
}
