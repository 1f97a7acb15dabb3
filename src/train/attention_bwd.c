/*
 * attention_bwd.c — bx_attention_backward (bitexact_train.h, "Layers:
 * causal GQA attention"). One piece of work is (sequence, kv head): it
 * owns the dk and dv rows of that kv head in that sequence (zeroed first,
 * then each element one fmaf chain over the group's query heads h
 * ascending and positions i ascending) and the dq rows of the group's
 * query heads. Nothing crosses a piece, so neither the batch nor the
 * thread count can change a bit.
 */
#include <stdint.h>
#include <string.h>

#include "abi.h"
#include "attention_internal.h"
#include "call.h"
#include "error.h"
#include "math_det.h"
#include "pool.h"
#include "workspace.h"

typedef struct bwd_job {
  bx_attn_geom g;
  const float *dout, *q, *k, *v, *stats;
  float *dq, *dk, *dv;
  float *scratch; /* per worker: 3 * L floats */
} bwd_job;

/* Row i of query head h (kv head kvh) of sequence b: its probabilities and
 * score gradients, dq_i, and its terms of the running dk and dv chains. */
static void bwd_row(const bwd_job *j, size_t b, size_t h, size_t kvh, size_t i, float *p,
                    float *dp, float *gs) {
  const bx_attn_geom *g = &j->g;
  size_t D = g->D, t0 = b * g->L;
  const float *qi = j->q + (t0 + i) * g->ldq + h * D;
  const float *doi = j->dout + (t0 + i) * g->ldq + h * D;
  const float *kb = j->k + t0 * g->ldk + kvh * D, *vb = j->v + t0 * g->ldk + kvh * D;
  const float *st = j->stats + ((t0 + i) * g->Hq + h) * 2;
  float m = st[0], l = st[1];
  double delta = 0.0;
  for (size_t c = 0; c <= i; c++) {
    float s = bx_attn_score(qi, kb + c * g->ldk, D, g->scale);
    p[c] = bx_expf_det(s - m) / l;
    const float *vc = vb + c * g->ldk;
    float acc = 0.0f;
    for (size_t d = 0; d < D; d++) acc = fmaf(doi[d], vc[d], acc);
    dp[c] = acc;
    delta += (double)p[c] * (double)dp[c]; /* the product is exact in fp64 */
  }
  float dl = (float)delta;
  for (size_t c = 0; c <= i; c++) gs[c] = (p[c] * (dp[c] - dl)) * g->scale;
  float *dqi = j->dq + (t0 + i) * g->ldq + h * D;
  for (size_t d = 0; d < D; d++) dqi[d] = 0.0f;
  for (size_t c = 0; c <= i; c++) {
    const float *kc = kb + c * g->ldk;
    float gc = gs[c];
    for (size_t d = 0; d < D; d++) dqi[d] = fmaf(gc, kc[d], dqi[d]);
  }
  float *dkb = j->dk + t0 * g->ldk + kvh * D, *dvb = j->dv + t0 * g->ldk + kvh * D;
  for (size_t c = 0; c <= i; c++) {
    float *dkc = dkb + c * g->ldk, *dvc = dvb + c * g->ldk;
    float gc = gs[c], pc = p[c];
    for (size_t d = 0; d < D; d++) dkc[d] = fmaf(gc, qi[d], dkc[d]);
    for (size_t d = 0; d < D; d++) dvc[d] = fmaf(pc, doi[d], dvc[d]);
  }
}

static void bwd_task(void *ctx, size_t task, int worker) {
  const bwd_job *j = ctx;
  const bx_attn_geom *g = &j->g;
  size_t b = task / g->Hkv, kvh = task % g->Hkv, t0 = b * g->L;
  float *p = j->scratch + (size_t)worker * 3 * g->L, *dp = p + g->L, *gs = dp + g->L;
  for (size_t i = 0; i < g->L; i++) {
    memset(j->dk + (t0 + i) * g->ldk + kvh * g->D, 0, g->D * sizeof(float));
    memset(j->dv + (t0 + i) * g->ldk + kvh * g->D, 0, g->D * sizeof(float));
  }
  for (size_t h = kvh * g->R; h < (kvh + 1) * g->R; h++)
    for (size_t i = 0; i < g->L; i++) bwd_row(j, b, h, kvh, i, p, dp, gs);
}

bx_status bx_attention_backward(const DLTensor *dout, const DLTensor *q, const DLTensor *k,
                                const DLTensor *v, const DLTensor *stats, int64_t seq_len,
                                int64_t num_heads, int64_t num_kv_heads, int64_t head_dim,
                                DLTensor *dq, DLTensor *dk, DLTensor *dv,
                                const bx_attention_opts *opts) {
  static const char *fn = "bx_attention_backward";
  if (opts) {
    bx_status st = bx_check_struct_size(fn, "opts->struct_size", opts->struct_size, sizeof *opts,
                                        "bx_attention_opts", "BX_ATTENTION_OPTS_DEFAULT");
    if (st != BX_OK) return st;
  }
  bx_call call;
  bx_status st = bx_call_enter(&call, fn);
  if (st != BX_OK) return st;
  const bx_attn_arg args[8] = {
      {dout, "dout", BX_ATTN_Q, 0}, {q, "q", BX_ATTN_Q, 0},   {k, "k", BX_ATTN_KV, 0},
      {v, "v", BX_ATTN_KV, 0},      {stats, "stats", BX_ATTN_STATS, 0},
      {dq, "dq", BX_ATTN_Q, 1},     {dk, "dk", BX_ATTN_KV, 1}, {dv, "dv", BX_ATTN_KV, 1}};
  float *data[8];
  bwd_job j;
  st = bx_attn_check(fn, opts, seq_len, num_heads, num_kv_heads, head_dim, args, 8, data, &j.g);
  if (st != BX_OK || j.g.T == 0) goto done;
  j.dout = data[0];
  j.q = data[1];
  j.k = data[2];
  j.v = data[3];
  j.stats = data[4];
  j.dq = data[5];
  j.dk = data[6];
  j.dv = data[7];
  size_t ntasks = j.g.B * j.g.Hkv;
  int nt = j.g.nthreads;
  if ((size_t)nt > ntasks) nt = (int)ntasks;
  j.scratch = bx_workspace((size_t)nt * 3 * j.g.L * sizeof(float));
  if (!j.scratch) {
    st = bx_fail(BX_ENOMEM, "%s: cannot allocate %zu bytes of scratch", fn,
                 (size_t)nt * 3 * j.g.L * sizeof(float));
    goto done;
  }
  bx_parallel_run(nt, ntasks, bwd_task, &j);
done:
  bx_call_leave(&call);
  return st;
}
