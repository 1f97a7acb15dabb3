/*
 * attention_bwd.c — bx_attention_backward (bitexact_train.h, "Layers:
 * causal GQA attention"). One piece of work is (sequence, kv head): it
 * owns the dk and dv rows of that kv head in that sequence (each element
 * one fmaf chain over the group's query heads h ascending and positions i
 * ascending, from +0) and the dq rows of the group's query heads. Nothing
 * crosses a piece, so neither the batch nor the thread count can change a
 * bit.
 *
 * Within a piece, per query head h (ascending) and block of positions
 * [i0, i1) (ascending; a multiple of the micro-kernel's mr rows), every
 * fmaf chain runs in the active ISA's GEMM micro-kernel (kernels.h: per
 * element acc = load_c ? c : +0, then acc = fma(a_k, b_k, acc) for k
 * ascending, the same bits on every ISA); at the causal diagonal the
 * length of each call and the lanes kept do the masking:
 *   scores q_i.k_j and dp_j = dout_i.v_j: tiles over d (as the forward),
 *     lanes right of the diagonal computed and ignored;
 *   p, delta, gs: scalar, per row;
 *   dq_i = sum_j gs_ij k_j: the micro-kernel over j = 0..i0+r (r the row's
 *     mr-sliver in the block, so j <= i for all its rows), then one kc = 1
 *     call per j = i0+r+s, row s copied out as soon as its last term is in;
 *   dk_j += gs_ij q_i, dv_j += p_ij dout_i (chains over i = j..L-1 within
 *     head h, continued from the previous heads and blocks, on a running
 *     accumulator of the sequence's dk, dv rows, load_c = 1): for j below
 *     the block, the micro-kernel over i = i0..i1-1; for a sliver
 *     [j0, j0+mr) in the block, one kc = 1 call per i = j0+s
 *     (s = 0..mr-2), row s put back to its value before the block just
 *     before its first term, then the micro-kernel over i = j0+mr-1..i1-1.
 * Each element thus gets exactly its documented chain: the tiles run many
 * chains in parallel lanes and never reorder or split one.
 */
#include <stdint.h>
#include <string.h>

#include "abi.h"
#include "attention_hd.h"
#include "attention_internal.h"
#include "call.h"
#include "error.h"
#include "kernels.h"
#include "nan_canon.h"
#include "pool.h"
#include "train_device.h"
#include "workspace.h"

#define BWD_ROWS 64 /* about this many positions per block (speed only) */

typedef struct bwd_job {
  bx_attn_geom g;
  const float *dout, *q, *k, *v, *stats;
  float *dq, *dk, *dv;
  const bx_gemm_kernel *kern;
  size_t rows;   /* positions per block, a multiple of mr */
  char *scratch; /* per worker: each bytes, 64-byte aligned */
  size_t each;
} bwd_job;

static size_t rup(size_t x, size_t q) { return (x + q - 1) / q * q; }

/* One worker's scratch, in this order (each part a multiple of 16 floats,
 * so every part starts 64-byte aligned: the micro-kernels load packed B
 * aligned). */
typedef struct bwd_bufs {
  float *kt, *vt;   /* k, v packed as the B of q.k^T, dout.v^T: rup(L, nr) x D */
  float *kn;        /* k packed as the B of gs.K: L x rup(D, nr) */
  float *dka, *dva; /* running dk, dv rows of the piece: rup(L, mr) x rup(D, nr) */
  float *qa, *da;   /* the block's q, dout rows packed as A: rows x D */
  float *S, *G;     /* scores, then p; dp, then gs: rows x rup(L, nr) */
  float *ga;        /* gs packed as the A of gs.K: rows x L */
  float *gt, *pt;   /* gs, p transposed, packed as the A of gs^T.Q, p^T.dout: rup(L, mr) x rows */
  float *qn, *dn;   /* the block's q, dout rows packed as B: rows x rup(D, nr) */
  float *dqt;       /* the block's dq tile: rows x rup(D, nr) */
  float *keep;      /* a diagonal sliver's dk, dv rows before the block: 2 mr x rup(D, nr) */
} bwd_bufs;

#define BWD_NBUF 16

/* floats of one worker's scratch for rows rb per block (a multiple of mr);
 * with base, also points b's parts into it. 0 if the size overflows. */
static size_t bwd_carve(const bx_attn_geom *g, size_t rb, size_t mr, size_t nr, float *base,
                        bwd_bufs *b) {
  size_t L = g->L, D = g->D, ncl = rup(L, nr), dpd = rup(D, nr), lm = rup(L, mr);
  size_t sz[BWD_NBUF][2] = {{ncl, D}, {ncl, D}, {dpd, L}, {lm, dpd}, {lm, dpd},
                            {rb, D},  {rb, D},  {rb, ncl}, {rb, ncl}, {rb, L},
                            {lm, rb}, {lm, rb}, {rb, dpd}, {rb, dpd}, {rb, dpd}, {2 * mr, dpd}};
  float **part[BWD_NBUF] = {&b->kt, &b->vt, &b->kn, &b->dka, &b->dva, &b->qa, &b->da, &b->S,
                            &b->G,  &b->ga, &b->gt, &b->pt, &b->qn,  &b->dn,  &b->dqt, &b->keep};
  size_t total = 0;
  for (int i = 0; i < BWD_NBUF; i++) {
    if (sz[i][1] && sz[i][0] > (SIZE_MAX / 8) / sz[i][1]) return 0;
    size_t n = rup(sz[i][0] * sz[i][1], 16);
    if (base) *part[i] = base + total;
    if (total > SIZE_MAX / 8 - n) return 0;
    total += n;
  }
  return total;
}

/* Block [i0, i1) of query head h of sequence b (w holds its kv head's
 * packed k, v and running dk, dv). */
static void bwd_block(const bwd_job *j, const bwd_bufs *w, size_t b, size_t h, size_t i0,
                      size_t i1) {
  const bx_attn_geom *g = &j->g;
  const bx_gemm_kernel *kern = j->kern;
  bx_gemm_micro_fn micro = kern->micro;
  size_t mr = kern->mr, nr = kern->nr, D = g->D, L = g->L, t0 = b * L;
  size_t rows = i1 - i0, rp = rup(rows, mr), ncp = rup(i1, nr), dpd = rup(D, nr);
  const float *qb = j->q + (t0 + i0) * g->ldq + h * D, *db = j->dout + (t0 + i0) * g->ldq + h * D;
  float *S = w->S, *G = w->G;
  /* scores and dp: the tiles that touch j <= i */
  bx_attn_pack_rows(qb, g->ldq, rows, D, mr, w->qa);
  bx_attn_pack_rows(db, g->ldq, rows, D, mr, w->da);
  for (size_t r = 0; r < rp; r += mr)
    for (size_t c = 0; c < ncp && c <= i0 + r + mr - 1; c += nr) {
      micro(D, w->qa + r * D, w->kt + c * D, S + r * ncp + c, ncp, 0);
      micro(D, w->da + r * D, w->vt + c * D, G + r * ncp + c, ncp, 0);
    }
  /* per row: p (in S), delta, gs (in G); zeros right of the diagonal up to
   * i1 (read by the packings below, never by a lane that is kept) */
  for (size_t ii = 0; ii < rows; ii++) {
    size_t i = i0 + ii;
    float *s = S + ii * ncp, *dp = G + ii * ncp;
    const float *st = j->stats + ((t0 + i) * g->Hq + h) * 2;
    (void)bx_attn_bwd_row_f32(s, dp, i + 1, g->scale, st[0], st[1]); /* attention_hd.h */
    for (size_t c = i + 1; c < i1; c++) s[c] = dp[c] = 0.0f;
  }
  /* dq, per mr-sliver r of rows: the micro-kernel over j = 0..i0+r (in
   * every row's window) leaves row 0 finished; then one step per j =
   * i0+r+s (s = 1..mr-1) for the whole tile finishes row s, whose value is
   * taken before the next step (the lanes of rows < s that a step spoils
   * are never read again) */
  bx_attn_pack_rows(G, ncp, rows, i1, mr, w->ga);
  for (size_t r = 0; r < rp; r += mr) {
    size_t hgt = rows - r < mr ? rows - r : mr;
    const float *ar = w->ga + r * i1;
    for (size_t c = 0; c < dpd; c += nr) {
      float *tile = w->dqt + c;
      size_t wd = D - c < nr ? D - c : nr;
      float *out = j->dq + (t0 + i0 + r) * g->ldq + h * D + c;
      micro(i0 + r + 1, ar, w->kn + c * L, tile, dpd, 0);
      bx_canon_f32_copy(out, tile, wd); /* the stored rows: canonical NaN */
      for (size_t s = 1; s < hgt; s++) {
        size_t jj = i0 + r + s;
        micro(1, ar + jj * mr, w->kn + c * L + jj * nr, tile, dpd, 1);
        bx_canon_f32_copy(out + s * g->ldq, tile + s * dpd, wd);
      }
    }
  }
  /* dk, dv, per mr-sliver [j0, j0+mr) of j: the block's terms i =
   * max(j, i0)..i1-1. Below the block, one micro-kernel call over i =
   * i0..i1-1. In the block, row s of the sliver starts at i = j0+s: one
   * step per i = j0+s (s = 0..mr-2) for the whole tile, each after row s
   * is put back to its value before the block (kept aside: the steps
   * before spoilt it), then the micro-kernel over i = j0+mr-1..i1-1. */
  bx_attn_pack_cols(G, ncp, rows, i1, mr, w->gt);
  bx_attn_pack_cols(S, ncp, rows, i1, mr, w->pt);
  bx_attn_pack_cols(qb, g->ldq, rows, D, nr, w->qn);
  bx_attn_pack_cols(db, g->ldq, rows, D, nr, w->dn);
  float *keep = w->keep; /* mr rows of dk, then mr rows of dv */
  for (size_t j0 = 0; j0 < i1; j0 += mr) {
    float *tk = w->dka + j0 * dpd, *tv = w->dva + j0 * dpd;
    const float *ak = w->gt + j0 * rows, *av = w->pt + j0 * rows;
    size_t is = i0; /* the first i of the long call */
    if (j0 >= i0) {
      size_t ns = i1 - j0 < mr - 1 ? i1 - j0 : mr - 1;
      is = j0 + ns;
      memcpy(keep, tk, mr * dpd * sizeof(float));
      memcpy(keep + mr * dpd, tv, mr * dpd * sizeof(float));
      for (size_t s = 0; s <= ns; s++) {
        if (s > 0) { /* row s starts at i = j0+s */
          memcpy(tk + s * dpd, keep + s * dpd, dpd * sizeof(float));
          memcpy(tv + s * dpd, keep + (mr + s) * dpd, dpd * sizeof(float));
        }
        if (s == ns) break;
        size_t off = j0 + s - i0;
        for (size_t c = 0; c < dpd; c += nr) {
          micro(1, ak + off * mr, w->qn + c * rows + off * nr, tk + c, dpd, 1);
          micro(1, av + off * mr, w->dn + c * rows + off * nr, tv + c, dpd, 1);
        }
      }
    }
    if (is == i1) continue;
    size_t kc = i1 - is, off = is - i0;
    for (size_t c = 0; c < dpd; c += nr) {
      micro(kc, ak + off * mr, w->qn + c * rows + off * nr, tk + c, dpd, 1);
      micro(kc, av + off * mr, w->dn + c * rows + off * nr, tv + c, dpd, 1);
    }
  }
}

static void bwd_task(void *ctx, size_t task, int worker) {
  const bwd_job *j = ctx;
  const bx_attn_geom *g = &j->g;
  size_t mr = j->kern->mr, nr = j->kern->nr, L = g->L, D = g->D, dpd = rup(D, nr);
  size_t b = task / g->Hkv, kvh = task % g->Hkv, t0 = b * L;
  bwd_bufs w;
  bwd_carve(g, j->rows, mr, nr, (float *)(j->scratch + (size_t)worker * j->each), &w);
  const float *kb = j->k + t0 * g->ldk + kvh * D, *vb = j->v + t0 * g->ldk + kvh * D;
  bx_attn_pack_rows(kb, g->ldk, L, D, nr, w.kt);
  bx_attn_pack_rows(vb, g->ldk, L, D, nr, w.vt);
  bx_attn_pack_cols(kb, g->ldk, L, D, nr, w.kn);
  memset(w.dka, 0, rup(L, mr) * dpd * sizeof(float));
  memset(w.dva, 0, rup(L, mr) * dpd * sizeof(float));
  for (size_t h = kvh * g->R; h < (kvh + 1) * g->R; h++)
    for (size_t i0 = 0; i0 < L; i0 += j->rows)
      bwd_block(j, &w, b, h, i0, L - i0 < j->rows ? L : i0 + j->rows);
  for (size_t i = 0; i < L; i++) {
    bx_canon_f32_copy(j->dk + (t0 + i) * g->ldk + kvh * D, w.dka + i * dpd, D);
    bx_canon_f32_copy(j->dv + (t0 + i) * g->ldk + kvh * D, w.dva + i * dpd, D);
  }
}

bx_status bx_attention_backward(const DLTensor *dout, const DLTensor *q, const DLTensor *k,
                                const DLTensor *v, const DLTensor *stats, int64_t seq_len,
                                int64_t num_heads, int64_t num_kv_heads, int64_t head_dim,
                                DLTensor *dq, DLTensor *dk, DLTensor *dv,
                                const bx_attention_opts *opts) {
  static const char *fn = "bx_attention_backward";
  bx_call call;
  bx_status st = bx_attn_enter(&call, fn, opts);
  if (st != BX_OK) return st;
  const bx_attn_arg args[8] = {
      {dout, "dout", BX_ATTN_Q, 0}, {q, "q", BX_ATTN_Q, 0},   {k, "k", BX_ATTN_KV, 0},
      {v, "v", BX_ATTN_KV, 0},      {stats, "stats", BX_ATTN_STATS, 0},
      {dq, "dq", BX_ATTN_Q, 1},     {dk, "dk", BX_ATTN_KV, 1}, {dv, "dv", BX_ATTN_KV, 1}};
  const DLTensor *ts[8] = {dout, q, k, v, stats, dq, dk, dv};
  const bx_tc_place pl = bx_tc_place_of(ts, 8);
  float *data[8];
  bwd_job j;
  st = bx_attn_check(fn, &pl, opts, seq_len, num_heads, num_kv_heads, head_dim, args, 8, data,
                     &j.g);
  if (st != BX_OK) goto done;
  j.dout = data[0];
  j.q = data[1];
  j.k = data[2];
  j.v = data[3];
  j.stats = data[4];
  j.dq = data[5];
  j.dk = data[6];
  j.dv = data[7];
  if (pl.cuda) { /* every tensor on one CUDA device: train_device.h */
    const bx_train_device *dev;
    st = bx_train_cuda(fn, &dev);
    if (st == BX_OK && j.g.T)
      st = dev->attention_bwd(fn, pl.device, j.dout, j.q, j.k, j.v, j.stats, j.dq, j.dk, j.dv,
                              j.g.T, j.g.L, j.g.Hq, j.g.Hkv, j.g.D, j.g.scale);
    goto done;
  }
  if (j.g.T == 0) goto done;
  j.kern = bx_gemm_kernel_active();
  j.rows = rup(BWD_ROWS, j.kern->mr);
  if (j.rows > rup(j.g.L, j.kern->mr)) j.rows = rup(j.g.L, j.kern->mr);
  size_t ntasks = j.g.B * j.g.Hkv;
  int nt = j.g.nthreads;
  if ((size_t)nt > ntasks) nt = (int)ntasks;
  bwd_bufs unused;
  size_t floats = bwd_carve(&j.g, j.rows, j.kern->mr, j.kern->nr, NULL, &unused);
  j.each = floats * sizeof(float); /* a multiple of 64 bytes */
  if (!floats || j.each > (SIZE_MAX - 64) / (size_t)nt) {
    st = bx_fail(BX_ENOMEM, "%s: seq_len and head_dim need too much scratch", fn);
    goto done;
  }
  char *ws = bx_workspace(j.each * (size_t)nt + 64);
  if (!ws) {
    st = bx_fail(BX_ENOMEM, "%s: cannot allocate %zu bytes of scratch", fn, j.each * (size_t)nt + 64);
    goto done;
  }
  j.scratch = ws + (64 - (uintptr_t)ws % 64) % 64;
  bx_parallel_run(nt, ntasks, bwd_task, &j);
done:
  bx_call_leave(&call);
  return st;
}
