/*
 * bench_moe.c — forward + backward of one GLM-4.5 MoE layer built from
 * bitexact_train.h's kernels, next to the same layer in torch eager
 * (bench/bench_moe_torch.py, --torch) in the same run.
 *
 * The layer (transformers' Glm4MoeMoE): router logits = X·Wrᵀ (fp32),
 * bx_moe_router_forward (sigmoid, e_score_correction_bias for the choice,
 * group-limited top-k, normalisation, routed scaling), the dispatch plan,
 * bx_moe_permute, per expert gate_up = Xe·Wguᵀ, bx_swiglu_forward_fused,
 * Ye = He·Wdᵀ, bx_moe_unpermute with the shared expert's output as
 * `initial`; backward: bx_moe_unpermute_backward, per expert dHe = dYe·Wd,
 * bx_swiglu_backward_fused, dXe = dGUe·Wgu, bx_moe_permute_backward, the
 * router backward and dX += dlogits·Wr, the shared expert's backward. The
 * weight gradients (router, every expert's gate_up and down, the shared
 * expert's three) are token reductions, in one of three modes:
 *   invariant  chunk partials (TN GEMM over each global chunk's rows, via
 *              bx_moe_expert_chunks for an expert) added to a bx_tokred
 *              state on the int64 grid, the bound stated beforehand from
 *              the inputs (bx_wgrad_bound_exp / bx_linear_wgrad_bound), one
 *              bx_tokred_agree, then bx_tokred_finish: the layout-invariant
 *              gradients bitexact train uses;
 *   plain      one fixed-order TN GEMM over all rows (no token reduction:
 *              layout-dependent across micro-batches, the speed baseline);
 * Shapes (defaults, the tiny config): T = 1024 tokens, hidden 256, 8
 * experts top-2 in 2 groups (1 kept), expert intermediate 128, 1 shared
 * expert; --tokens etc. change them. A time is the median of --reps steps
 * after one warm-up; with --torch each rep also runs the torch script (its
 * own median of 3 steps), so both see the same machine load; the ratios
 * printed are medians over reps of the per-rep ratios.
 *
 *   bench_moe [--torch] [--torch-script PATH] [--threads 1,2] [--reps R]
 *             [--tokens T] [--chunk C]
 *
 * It checks that 1 and T threads give the same output and gradient bits
 * (exit status 1 if not).
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_common.h"
#include "bitexact_train.h"
#include "../tests/dl_view.h"
#include "rng.h"

/* ---- configuration ---------------------------------------------------- */

typedef struct cfg {
  int64_t T, H, E, K, G, TG, I, S; /* tokens, hidden, experts, top-k, groups, kept groups, inter, shared */
  int64_t chunk;
  int threads;
} cfg;

/* ---- tensors ---------------------------------------------------------- */

typedef struct ten {
  void *data;
  int64_t shape[3];
  DLTensor t;
} ten;

static void ten_init(ten *x, DLDataTypeCode code, int bits, int ndim, int64_t d0, int64_t d1,
                     int64_t d2) {
  memset(x, 0, sizeof *x);
  x->shape[0] = d0;
  x->shape[1] = d1;
  x->shape[2] = d2;
  int64_t n = d0 * (ndim > 1 ? d1 : 1) * (ndim > 2 ? d2 : 1);
  x->data = calloc((size_t)(n > 0 ? n : 1), (size_t)bits / 8);
  if (!x->data) {
    fprintf(stderr, "bench_moe: out of memory\n");
    exit(2);
  }
  x->t = bxt_view(x->data, code, bits, ndim, x->shape);
}

/* (A ten holds its own shape: it is made in place, never copied.) */
static void f32(ten *x, int ndim, int64_t d0, int64_t d1, int64_t d2) {
  ten_init(x, kDLFloat, 32, ndim, d0, d1, d2);
}

static void i64(ten *x, int ndim, int64_t d0, int64_t d1) { ten_init(x, kDLInt, 64, ndim, d0, d1, 0); }

/* A row view [r0, r0+n) of a 2-D fp32 tensor, or matrix m of a 3-D one. */
typedef struct view {
  int64_t shape[2];
  DLTensor t;
} view;

static DLTensor *rows_of(view *v, const ten *x, int64_t r0, int64_t n) {
  v->t = x->t;
  v->shape[0] = n;
  v->shape[1] = x->shape[1];
  v->t.ndim = 2;
  v->t.shape = v->shape;
  v->t.byte_offset = (uint64_t)(r0 * x->shape[1]) * 4u;
  return &v->t;
}

static DLTensor *mat_of(view *v, const ten *x, int64_t m) {
  v->t = x->t;
  v->shape[0] = x->shape[1];
  v->shape[1] = x->shape[2];
  v->t.ndim = 2;
  v->t.shape = v->shape;
  v->t.byte_offset = (uint64_t)(m * x->shape[1] * x->shape[2]) * 4u;
  return &v->t;
}

static void fill(ten *x, uint64_t seed, float scale) {
  int64_t n = x->shape[0] * (x->t.ndim > 1 ? x->shape[1] : 1) * (x->t.ndim > 2 ? x->shape[2] : 1);
  bx_rng r;
  bx_rng_seed(&r, seed);
  float *p = x->data;
  for (int64_t i = 0; i < n; i++) p[i] = (float)(bx_rng_normal(&r) * scale);
}

static void must(bx_status st, const char *what) {
  if (st != BX_OK) {
    fprintf(stderr, "bench_moe: %s: %s: %s\n", what, bx_status_str(st), bx_last_error());
    exit(2);
  }
}

static float max_abs(const float *p, int64_t n) {
  float m = 0;
  for (int64_t i = 0; i < n; i++) {
    float a = fabsf(p[i]);
    if (a > m && isfinite(a)) m = a;
  }
  return m;
}

/* ---- the layer -------------------------------------------------------- */

enum { W_ROUTER, W_SH_GATE, W_SH_UP, W_SH_DOWN, W_EXPERT0 }; /* + 2e: gate_up, + 2e+1: down */

typedef struct layer {
  cfg c;
  ten x, dout, wr, bias, wgu, wd, sg, su, sd;      /* inputs and weights */
  ten logits, ids, w, offsets, row_map, pos, xp, gu, h, yp, sgu, sh, so, out; /* forward */
  ten dyp, dw, dh, dgu, dxp, dx, dlogits, dsh, dsg, dsu;                       /* backward */
  ten grad[64];                                   /* weight gradients (fp32) */
  size_t ngrad;
} layer;

static void layer_make(layer *L, cfg c) {
  memset(L, 0, sizeof *L);
  L->c = c;
  int64_t T = c.T, H = c.H, E = c.E, I = c.I, SI = c.I * c.S, R = c.T * c.K;
  f32(&L->x, 2, T, H, 0), fill(&L->x, 11, 1.0f);
  f32(&L->dout, 2, T, H, 0), fill(&L->dout, 12, 1.0f);
  f32(&L->wr, 2, E, H, 0), fill(&L->wr, 13, 0.02f);
  f32(&L->bias, 1, E, 0, 0), fill(&L->bias, 14, 0.01f);
  f32(&L->wgu, 3, E, 2 * I, H), fill(&L->wgu, 15, 0.02f);
  f32(&L->wd, 3, E, H, I), fill(&L->wd, 16, 0.02f);
  f32(&L->sg, 2, SI, H, 0), fill(&L->sg, 17, 0.02f);
  f32(&L->su, 2, SI, H, 0), fill(&L->su, 18, 0.02f);
  f32(&L->sd, 2, H, SI, 0), fill(&L->sd, 19, 0.02f);
  f32(&L->logits, 2, T, E, 0);
  i64(&L->ids, 2, T, c.K);
  f32(&L->w, 2, T, c.K, 0);
  i64(&L->offsets, 1, E + 1, 0);
  i64(&L->row_map, 2, R, 2);
  i64(&L->pos, 2, T, c.K);
  f32(&L->xp, 2, R, H, 0);
  f32(&L->gu, 2, R, 2 * I, 0);
  f32(&L->h, 2, R, I, 0);
  f32(&L->yp, 2, R, H, 0);
  f32(&L->sgu, 2, T, SI, 0); /* shared gate output, then up in su_out */
  f32(&L->sh, 2, T, SI, 0);
  f32(&L->so, 2, T, H, 0);
  f32(&L->out, 2, T, H, 0);
  f32(&L->dyp, 2, R, H, 0);
  f32(&L->dw, 2, T, c.K, 0);
  f32(&L->dh, 2, R, I, 0);
  f32(&L->dgu, 2, R, 2 * I, 0);
  f32(&L->dxp, 2, R, H, 0);
  f32(&L->dx, 2, T, H, 0);
  f32(&L->dlogits, 2, T, E, 0);
  f32(&L->dsh, 2, T, SI, 0);
  f32(&L->dsg, 2, T, SI, 0);
  f32(&L->dsu, 2, T, SI, 0);
  f32(&L->grad[W_ROUTER], 2, E, H, 0);
  f32(&L->grad[W_SH_GATE], 2, SI, H, 0);
  f32(&L->grad[W_SH_UP], 2, SI, H, 0);
  f32(&L->grad[W_SH_DOWN], 2, H, SI, 0);
  for (int64_t e = 0; e < E; e++) {
    f32(&L->grad[W_EXPERT0 + 2 * e], 2, 2 * I, H, 0);
    f32(&L->grad[W_EXPERT0 + 2 * e + 1], 2, H, I, 0);
  }
  L->ngrad = (size_t)(W_EXPERT0 + 2 * E);
}

static void layer_free(layer *L) {
  ten *all[] = {&L->x, &L->dout, &L->wr, &L->bias, &L->wgu, &L->wd, &L->sg, &L->su, &L->sd,
                &L->logits, &L->ids, &L->w, &L->offsets, &L->row_map, &L->pos, &L->xp, &L->gu,
                &L->h, &L->yp, &L->sgu, &L->sh, &L->so, &L->out, &L->dyp, &L->dw, &L->dh,
                &L->dgu, &L->dxp, &L->dx, &L->dlogits, &L->dsh, &L->dsg, &L->dsu};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) free(all[i]->data);
  for (size_t i = 0; i < L->ngrad; i++) free(L->grad[i].data);
}

/* The options of every call of a step: c.threads threads, the router's groups. */
typedef struct layer_opts {
  bx_gemm_opts go;
  bx_moe_router_opts ro;
  bx_moe_dispatch_opts dop;
  bx_swiglu_opts so;
} layer_opts;

static layer_opts opts_of(const cfg *c) {
  layer_opts o = {BX_GEMM_OPTS_DEFAULT, BX_MOE_ROUTER_OPTS_DEFAULT, BX_MOE_DISPATCH_OPTS_DEFAULT,
                  BX_SWIGLU_OPTS_DEFAULT};
  o.go.num_threads = o.ro.num_threads = o.dop.num_threads = o.so.num_threads = c->threads;
  o.ro.n_group = c->G;
  o.ro.topk_group = c->TG;
  o.ro.routed_scaling_factor = 2.5;
  return o;
}

/* Shared expert's up projection lands in sh's buffer first (then SwiGLU in
 * place): gate in sgu, up in sh, h = silu(gate) * up written into sh. */
static void forward(layer *L) {
  cfg c = L->c;
  layer_opts O = opts_of(&c);
  must(bx_gemm(&L->x.t, &L->wr.t, BX_GEMM_NT, &L->logits.t, &O.go), "router gemm");
  must(bx_moe_router_forward(&L->logits.t, &L->bias.t, &L->ids.t, &L->w.t, c.T, NULL, &O.ro), "router");
  must(bx_moe_dispatch_plan(&L->ids.t, NULL, &L->offsets.t, &L->row_map.t, &L->pos.t, &O.dop), "plan");
  must(bx_moe_permute(&L->x.t, &L->row_map.t, &L->xp.t, &O.dop), "permute");
  const int64_t *off = L->offsets.data;
  for (int64_t e = 0; e < c.E; e++) {
    int64_t r0 = off[e], n = off[e + 1] - off[e];
    if (n == 0) continue;
    view a, b, g, h, y;
    must(bx_gemm(rows_of(&a, &L->xp, r0, n), mat_of(&b, &L->wgu, e), BX_GEMM_NT,
                 rows_of(&g, &L->gu, r0, n), &O.go), "expert gate_up");
    must(bx_swiglu_forward_fused(rows_of(&g, &L->gu, r0, n), rows_of(&h, &L->h, r0, n), &O.so), "swiglu");
    must(bx_gemm(rows_of(&h, &L->h, r0, n), mat_of(&b, &L->wd, e), BX_GEMM_NT,
                 rows_of(&y, &L->yp, r0, n), &O.go), "expert down");
  }
  must(bx_gemm(&L->x.t, &L->sg.t, BX_GEMM_NT, &L->sgu.t, &O.go), "shared gate");
  must(bx_gemm(&L->x.t, &L->su.t, BX_GEMM_NT, &L->sh.t, &O.go), "shared up");
  must(bx_swiglu_forward(&L->sgu.t, &L->sh.t, &L->dsh.t, &O.so), "shared swiglu"); /* h in dsh's buffer */
  memcpy(L->sh.data, L->dsh.data, (size_t)(c.T * c.I * c.S) * 4u);
  must(bx_gemm(&L->sh.t, &L->sd.t, BX_GEMM_NT, &L->so.t, &O.go), "shared down");
  must(bx_moe_unpermute(&L->yp.t, &L->w.t, &L->row_map.t, &L->pos.t, &L->so.t, &L->out.t, &O.dop),
       "unpermute");
}

/* The weight gradient dW = dYᵀ·X over rows [r0, r0+n) of dy and x, whose
 * global token ids are tok[r0..] (NULL: row r is token r). invariant:
 * through s (tensor index ti); plain: one TN GEMM into grad. */
typedef struct wg {
  int invariant, bounding;
  bx_tokred *s;
  const cfg *c;
} wg;

static void wgrad(wg *g, layer *L, size_t ti, const ten *dy, const ten *x, int64_t r0, int64_t n,
                  const int64_t *tok) {
  bx_gemm_opts go = BX_GEMM_OPTS_DEFAULT;
  go.num_threads = g->c->threads;
  view a, b, out;
  if (!g->invariant) {
    if (g->bounding) return;
    must(bx_gemm(rows_of(&a, dy, r0, n), rows_of(&b, x, r0, n), BX_GEMM_TN, &L->grad[ti].t, &go),
         "wgrad TN");
    return;
  }
  bx_wgrad_opts wo = BX_WGRAD_OPTS_DEFAULT;
  wo.num_threads = g->c->threads;
  if (!tok) { /* rows are the global tokens 0..T-1 */
    if (g->bounding)
      must(bx_linear_wgrad_bound(g->s, ti, BX_WGRAD_NONE, rows_of(&a, dy, r0, n),
                                 rows_of(&b, x, r0, n), r0, &wo), "wgrad bound");
    else
      must(bx_linear_wgrad(g->s, ti, BX_WGRAD_NONE, rows_of(&a, dy, r0, n), rows_of(&b, x, r0, n),
                           r0, &wo), "linear wgrad");
    return;
  }
  /* an expert: its rows of each global chunk are a contiguous range */
  int64_t C = g->c->chunk, nch = (g->c->T + C - 1) / C;
  ten tid, bounds;
  i64(&tid, 1, n, 0);
  i64(&bounds, 1, nch + 1, 0);
  memcpy(tid.data, tok + r0, (size_t)n * 8u);
  must(bx_moe_expert_chunks(&tid.t, C, 0, &bounds.t), "expert chunks");
  const int64_t *bd = bounds.data;
  for (int64_t ch = 0; ch < nch; ch++) {
    int64_t m = bd[ch + 1] - bd[ch];
    if (m == 0) { /* no token of this chunk chose the expert: its partial is 0 */
      if (!g->bounding) {
        memset(L->grad[ti].data, 0, (size_t)(L->grad[ti].shape[0] * L->grad[ti].shape[1]) * 4u);
        must(bx_tokred_add(g->s, ti, ch, &L->grad[ti].t), "tokred add 0");
      }
      continue;
    }
    const float *pa = (const float *)dy->data + (r0 + bd[ch]) * dy->shape[1];
    const float *pb = (const float *)x->data + (r0 + bd[ch]) * x->shape[1];
    if (g->bounding) {
      int ex = bx_wgrad_bound_exp(m, max_abs(pa, m * dy->shape[1]), max_abs(pb, m * x->shape[1]));
      must(bx_tokred_bound_exp(g->s, ti, ex), "bound exp");
      continue;
    }
    must(bx_gemm(rows_of(&a, dy, r0 + bd[ch], m), rows_of(&b, x, r0 + bd[ch], m), BX_GEMM_TN,
                 rows_of(&out, &L->grad[ti], 0, L->grad[ti].shape[0]), &go), "expert TN");
    must(bx_tokred_add(g->s, ti, ch, &L->grad[ti].t), "tokred add");
  }
  free(tid.data);
  free(bounds.data);
}

/* The weight-gradient products of the backward, in one fixed list. */
static void all_wgrads(wg *g, layer *L, const int64_t *tok) {
  cfg c = *g->c;
  wgrad(g, L, W_ROUTER, &L->dlogits, &L->x, 0, c.T, NULL);
  wgrad(g, L, W_SH_DOWN, &L->dout, &L->sh, 0, c.T, NULL);
  wgrad(g, L, W_SH_GATE, &L->dsg, &L->x, 0, c.T, NULL);
  wgrad(g, L, W_SH_UP, &L->dsu, &L->x, 0, c.T, NULL);
  const int64_t *off = L->offsets.data;
  for (int64_t e = 0; e < c.E; e++) {
    int64_t r0 = off[e], n = off[e + 1] - off[e];
    if (n == 0) continue;
    wgrad(g, L, (size_t)(W_EXPERT0 + 2 * e + 1), &L->dyp, &L->h, r0, n, tok);
    wgrad(g, L, (size_t)(W_EXPERT0 + 2 * e), &L->dgu, &L->xp, r0, n, tok);
  }
}

static void backward(layer *L, int invariant) {
  cfg c = L->c;
  layer_opts O = opts_of(&c);
  bx_gemm_opts acc = O.go;
  acc.accumulate = 1;
  must(bx_moe_unpermute_backward(&L->dout.t, &L->yp.t, &L->w.t, &L->row_map.t, &L->pos.t,
                                 &L->dyp.t, &L->dw.t, &O.dop), "unpermute backward");
  const int64_t *off = L->offsets.data;
  for (int64_t e = 0; e < c.E; e++) {
    int64_t r0 = off[e], n = off[e + 1] - off[e];
    if (n == 0) continue;
    view a, b, d, g;
    must(bx_gemm(rows_of(&a, &L->dyp, r0, n), mat_of(&b, &L->wd, e), BX_GEMM_NN,
                 rows_of(&d, &L->dh, r0, n), &O.go), "expert dH");
    must(bx_swiglu_backward_fused(rows_of(&g, &L->gu, r0, n), rows_of(&d, &L->dh, r0, n),
                                  rows_of(&a, &L->dgu, r0, n), &O.so), "swiglu backward");
    must(bx_gemm(rows_of(&a, &L->dgu, r0, n), mat_of(&b, &L->wgu, e), BX_GEMM_NN,
                 rows_of(&d, &L->dxp, r0, n), &O.go), "expert dX");
  }
  must(bx_moe_permute_backward(&L->dxp.t, &L->row_map.t, &L->pos.t, &L->dx.t, &O.dop), "permute bwd");
  must(bx_moe_router_backward(&L->logits.t, &L->ids.t, &L->dw.t, &L->dlogits.t, &O.ro), "router bwd");
  must(bx_gemm(&L->dlogits.t, &L->wr.t, BX_GEMM_NN, &L->dx.t, &acc), "router dX");
  /* shared expert: h in sh, gate in sgu, up recomputed into dsh's neighbour */
  must(bx_gemm(&L->dout.t, &L->sd.t, BX_GEMM_NN, &L->dsh.t, &O.go), "shared dH");
  must(bx_gemm(&L->x.t, &L->su.t, BX_GEMM_NT, &L->dsu.t, &O.go), "shared up again");
  ten up;
  f32(&up, 2, c.T, c.I * c.S, 0);
  memcpy(up.data, L->dsu.data, (size_t)(c.T * c.I * c.S) * 4u);
  must(bx_swiglu_backward(&L->sgu.t, &up.t, &L->dsh.t, &L->dsg.t, &L->dsu.t, &O.so), "shared swiglu bwd");
  free(up.data);
  must(bx_gemm(&L->dsg.t, &L->sg.t, BX_GEMM_NN, &L->dx.t, &acc), "shared gate dX");
  must(bx_gemm(&L->dsu.t, &L->su.t, BX_GEMM_NN, &L->dx.t, &acc), "shared up dX");

  /* the weight gradients: token ids of the permuted rows */
  int64_t R = c.T * c.K;
  int64_t *tok = malloc((size_t)R * 8u);
  const int64_t *rm = L->row_map.data;
  for (int64_t r = 0; r < R; r++) tok[r] = rm[2 * r];
  wg g = {invariant, 0, NULL, &L->c};
  if (invariant) {
    DLTensor gs[64];
    for (size_t i = 0; i < L->ngrad; i++) gs[i] = L->grad[i].t;
    bx_tokred_opts to = BX_TOKRED_OPTS_DEFAULT;
    must(bx_tokred_create(gs, L->ngrad, c.chunk, c.T, &to, &g.s), "tokred create");
    g.bounding = 1;
    all_wgrads(&g, L, tok);
    must(bx_tokred_agree(g.s, NULL), "agree");
    g.bounding = 0;
    all_wgrads(&g, L, tok);
    DLTensor outs[64];
    for (size_t i = 0; i < L->ngrad; i++) outs[i] = L->grad[i].t;
    bx_status st = bx_tokred_finish(g.s, outs, L->ngrad, 1);
    must(st, "tokred finish");
    bx_tokred_destroy(g.s);
  } else {
    all_wgrads(&g, L, tok);
  }
  free(tok);
}

/* ---- timing and the comparison ---------------------------------------- */

static double step_time(layer *L, int invariant) {
  double t0 = now();
  forward(L);
  backward(L, invariant);
  return now() - t0;
}

/* FNV-1a over the bits of the output, dX and every weight gradient. */
static uint64_t result_hash(const layer *L) {
  uint64_t h = 1469598103934665603ull;
  const ten *ts[64 + 2];
  size_t n = 0;
  ts[n++] = &L->out;
  ts[n++] = &L->dx;
  for (size_t i = 0; i < L->ngrad; i++) ts[n++] = &L->grad[i];
  for (size_t i = 0; i < n; i++) {
    int64_t cnt = ts[i]->shape[0] * (ts[i]->t.ndim > 1 ? ts[i]->shape[1] : 1);
    const unsigned char *p = ts[i]->data;
    for (int64_t b = 0; b < cnt * 4; b++) h = (h ^ p[b]) * 1099511628211ull;
  }
  return h;
}

static double torch_time(const char *script, const cfg *c) {
  char cmd[1024];
  snprintf(cmd, sizeof cmd,
           "python3 '%s' --tokens %lld --hidden %lld --experts %lld --topk %lld --groups %lld "
           "--topk-groups %lld --inter %lld --shared %lld --threads %d --iters 3",
           script, (long long)c->T, (long long)c->H, (long long)c->E, (long long)c->K,
           (long long)c->G, (long long)c->TG, (long long)c->I, (long long)c->S, c->threads);
  FILE *f = popen(cmd, "r");
  if (!f) return -1;
  char line[256];
  double t = -1;
  while (fgets(line, sizeof line, f))
    if (sscanf(line, "torch_moe %lf", &t) == 1) break;
  if (pclose(f) != 0) return -1;
  return t;
}

int main(int argc, char **argv) {
  cfg c = {1024, 256, 8, 2, 2, 1, 128, 1, 256, 1};
  int use_torch = 0, reps = 5, nthr = 0, thr[8];
  const char *script = "bench/bench_moe_torch.py", *tlist = "1,2";
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--torch")) use_torch = 1;
    else if (!strcmp(argv[i], "--torch-script") && i + 1 < argc) script = argv[++i], use_torch = 1;
    else if (!strcmp(argv[i], "--threads") && i + 1 < argc) tlist = argv[++i];
    else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--tokens") && i + 1 < argc) c.T = atoll(argv[++i]);
    else if (!strcmp(argv[i], "--chunk") && i + 1 < argc) c.chunk = atoll(argv[++i]);
    else {
      fprintf(stderr, "usage: bench_moe [--torch] [--torch-script PATH] [--threads 1,2] [--reps R] "
                      "[--tokens T] [--chunk C]\n");
      return 2;
    }
  }
  for (const char *p = tlist; *p && nthr < 8;) {
    thr[nthr++] = atoi(p);
    const char *q = strchr(p, ',');
    if (!q) break;
    p = q + 1;
  }
  if (reps < 1 || reps > 99 || c.T < 1 || c.chunk < 1) {
    fprintf(stderr, "bench_moe: bad --reps, --tokens or --chunk\n");
    return 2;
  }
  printf("# bench_moe: one GLM-4.5 MoE layer, forward + backward; T %lld, hidden %lld, %lld experts "
         "top-%lld (%lld groups, %lld kept), expert intermediate %lld, %lld shared; chunk %lld tokens\n",
         (long long)c.T, (long long)c.H, (long long)c.E, (long long)c.K, (long long)c.G,
         (long long)c.TG, (long long)c.I, (long long)c.S, (long long)c.chunk);
  printf("# medians of %d steps (seconds); ratios: medians of per-rep ratios%s\n", reps,
         use_torch ? "; torch: bench_moe_torch.py in the same reps" : "");
  printf("%4s %10s %10s %10s %9s %11s %11s\n", "thr", "invariant", "plain", "torch", "inv/plain",
         "torch/inv", "torch/plain");
  int bad = 0;
  uint64_t ref_inv = 0, ref_plain = 0;
  for (int ti = 0; ti < nthr; ti++) {
    c.threads = thr[ti];
    layer L;
    layer_make(&L, c);
    step_time(&L, 1);
    uint64_t h_inv = result_hash(&L);
    step_time(&L, 0);
    uint64_t h_plain = result_hash(&L);
    if (ti == 0) ref_inv = h_inv, ref_plain = h_plain;
    else if (h_inv != ref_inv || h_plain != ref_plain) {
      fprintf(stderr, "bench_moe: %d threads changed the bits (invariant %016llx vs %016llx)\n",
              c.threads, (unsigned long long)h_inv, (unsigned long long)ref_inv);
      bad = 1;
    }
    double ti_[99], tp[99], tt[99], r_ip[99], r_ti[99], r_tp[99];
    int nt = 0;
    for (int r = 0; r < reps; r++) {
      ti_[r] = step_time(&L, 1);
      tp[r] = step_time(&L, 0);
      r_ip[r] = ti_[r] / tp[r];
      if (use_torch) {
        double t = torch_time(script, &c);
        if (t > 0) {
          tt[nt] = t;
          r_ti[nt] = t / ti_[r];
          r_tp[nt] = t / tp[r];
          nt++;
        }
      }
    }
    double mi = median(ti_, reps), mp = median(tp, reps), rip = median(r_ip, reps);
    if (nt > 0)
      printf("%4d %10.4f %10.4f %10.4f %9.3f %11.2f %11.2f\n", c.threads, mi, mp, median(tt, nt), rip,
             median(r_ti, nt), median(r_tp, nt));
    else
      printf("%4d %10.4f %10.4f %10s %9.3f %11s %11s\n", c.threads, mi, mp, "-", rip, "-", "-");
    fflush(stdout);
    layer_free(&L);
  }
  return bad;
}
