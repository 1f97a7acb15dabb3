/*
 * test_train_cuda_sim_moe.c — the CUDA decomposition of the MoE router, the
 * token dispatch's permute/unpermute, the embedding and the cross-entropy,
 * run on the CPU (issue 30, S2; the harness is train_cuda_sim.h).
 *
 * src/cuda/train/grid_moe.h holds the thread bodies of router.cu,
 * permute.cu, embedding.cu and xent.cu (which thread computes which
 * output) over the CPU kernels' own arithmetic (router_hd.h, permute_hd.h,
 * embedding_hd.h, xent_hd.h). Here a simulated grid runs those bodies in
 * the launchers' order of launches (the router's counts and the
 * cross-entropy's chunk partials after the tokens), blocks and threads
 * shuffled, and every output must equal the public CPU entry's on the
 * same bytes, bit for bit: random shapes (empty ones included) and values
 * (+-0, subnormals, +-Inf, NaN payloads where the entry takes them, small
 * integers for the router's ties), int32 and int64 ids, in place where the
 * API allows it (dlogits = logits). Embedding backward's row ids and
 * offsets are the host's decision on the device path too (embedding.c
 * sorts a host copy of the ids): the simulation takes the CPU call's.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "bitexact_train.h"
#include "dl_view.h"
#include "grid_moe.h"
#include "harness.h"
#include "tests.h"
#include "train_cuda_sim.h"

/* ---- small helpers ---------------------------------------------------------------------- */

/* n ids, int32 (i64 = 0) or int64, from v. */
static void *ids_make(const int64_t *v, size_t n, int i64) {
  void *p = malloc((n ? n : 1) * (i64 ? 8 : 4));
  for (size_t i = 0; i < n; i++) {
    if (i64)
      ((int64_t *)p)[i] = v[i];
    else
      ((int32_t *)p)[i] = (int32_t)v[i];
  }
  return p;
}

/* A view of an id tensor of int32 (i64 = 0) or int64 elements. */
static DLTensor ids_view(void *p, int i64, int ndim, int64_t *shape) {
  return bxt_view(p, kDLInt, i64 ? 64 : 32, ndim, shape);
}

/* A view of an int64 tensor. */
static DLTensor i64_view(int64_t *p, int ndim, int64_t *shape) {
  return bxt_view(p, kDLInt, 64, ndim, shape);
}

/* The first differing element of two int64 arrays, or -1. */
static long diff_i64(const int64_t *a, const int64_t *b, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (a[i] != b[i]) return (long)i;
  return -1;
}

/* A router logit or bias: mostly small integers and halves (ties of the
 * choice and group scores), ordinary values, and the specials the router
 * takes (no NaN in logits: refused; bias finite). */
static float router_value(bxt_rng *r, int finite) {
  uint64_t k = bxt_below(r, 8);
  if (k < 3) return ((float)(int)bxt_below(r, 9) - 4.0f) * 0.5f;
  float v = sim_value(r);
  if (v != v || (finite && isinf(v))) return (float)(int)bxt_below(r, 5) - 2.0f;
  return v;
}

/* ---- MoE router --------------------------------------------------------------------- */

/* The launchers' kernels' bodies, as sim_grid calls them. */
static void body_router_fwd(const void *c, uint64_t i) { bx_tg_router_fwd_token(c, i); }
static void body_router_count(const void *c, uint64_t i) { bx_tg_router_count(c, i); }
static void body_router_bwd(const void *c, uint64_t i) { bx_tg_router_bwd_token(c, i); }

void test_train_cuda_sim_router(void) {
  bxt_rng r;
  bxt_rng_init(&r);
  for (int it = 0; it < 60 && !bxt_failures(); it++) {
    int64_t G = 1 + (int64_t)bxt_below(&r, 4), S = 2 + (int64_t)bxt_below(&r, 7);
    if (it % 10 == 9) { /* the device's largest: E = 256, k = 32 */
      G = 4;
      S = 64;
    }
    int64_t E = G * S, kg = 1 + (int64_t)bxt_below(&r, (uint64_t)G);
    int64_t kmax = kg * S < BX_ROUTER_DEVICE_MAX_K ? kg * S : BX_ROUTER_DEVICE_MAX_K;
    int64_t k = it % 10 == 9 ? kmax : 1 + (int64_t)bxt_below(&r, (uint64_t)kmax);
    int64_t T = (int64_t)bxt_below(&r, 40), C = 1 + (int64_t)bxt_below(&r, 12);
    int64_t nch = T / C + (T % C != 0);
    int i64 = (int)bxt_below(&r, 2), norm = (int)bxt_below(&r, 2);
    bx_moe_router_opts o = BX_MOE_ROUTER_OPTS_DEFAULT;
    o.n_group = G;
    o.topk_group = kg;
    o.norm_topk_prob = norm;
    o.routed_scaling_factor = bxt_below(&r, 2) ? 1.0 : 0.5 + bxt_normal(&r) * 0.25;
    size_t n = (size_t)(T * E), nk = (size_t)(T * k);
    float *lg = malloc((n ? n : 1) * sizeof *lg), *bias = malloc((size_t)E * sizeof *bias);
    for (size_t i = 0; i < n; i++) lg[i] = router_value(&r, 0);
    for (int64_t e = 0; e < E; e++) bias[e] = bxt_below(&r, 3) ? 0.0f : router_value(&r, 1);
    /* CPU */
    int64_t *zeros = calloc(nk + 1, sizeof *zeros);
    void *ids_cpu = ids_make(zeros, nk, i64), *ids_sim = ids_make(zeros, nk, i64);
    float *w_cpu = calloc(nk + 1, sizeof(float)), *w_sim = calloc(nk + 1, sizeof(float));
    int64_t *cn_cpu = calloc((size_t)(nch * E) + 1, 8), *cn_sim = calloc((size_t)(nch * E) + 1, 8);
    int64_t sl[2] = {T, E}, sb[1] = {E}, sk[2] = {T, k}, sc[2] = {nch, E};
    DLTensor tl = bxt_f32_view(lg, 2, sl), tb = bxt_f32_view(bias, 1, sb);
    DLTensor ti = ids_view(ids_cpu, i64, 2, sk), tw = bxt_f32_view(w_cpu, 2, sk);
    DLTensor tc = i64_view(cn_cpu, 2, sc);
    CHECK_STATUS(bx_moe_router_forward(&tl, &tb, &ti, &tw, C, &tc, &o), BX_OK, "router forward");
    /* the simulated launches: tokens, then the counts */
    bx_router_cfg q = {E, G, S, kg, k, norm, (float)o.routed_scaling_factor};
    bx_tg_router a = {lg, bias, NULL, ids_sim, i64, w_sim, NULL, cn_sim, (uint64_t)T,
                      (uint64_t)C, (uint64_t)nch, q, 0.0};
    sim_grid(&r, (uint64_t)T, body_router_fwd, &a);
    sim_grid(&r, (uint64_t)(nch * E), body_router_count, &a);
    CHECK_SAME(w_sim, w_cpu, nk, "router weights T %lld E %lld G %lld kg %lld k %lld norm %d",
               (long long)T, (long long)E, (long long)G, (long long)kg, (long long)k, norm);
    CHECK(memcmp(ids_sim, ids_cpu, nk * (i64 ? 8 : 4)) == 0, "router ids T %lld E %lld k %lld",
          (long long)T, (long long)E, (long long)k);
    long d = diff_i64(cn_sim, cn_cpu, (size_t)(nch * E));
    CHECK(d < 0, "router counts: element %ld differs", d);
    /* backward: dweights with every special, logits too (no check there) */
    float *dw = sim_fill(&r, nk, 1);
    for (size_t i = 0; i < n; i++)
      if (!bxt_below(&r, 16)) lg[i] = sim_value(&r);
    float *dl_cpu = malloc((n ? n : 1) * sizeof(float));
    float *dl_sim = malloc((n ? n : 1) * sizeof(float));
    memset(dl_cpu, 0x5a, (n ? n : 1) * sizeof(float));
    memset(dl_sim, 0xa5, (n ? n : 1) * sizeof(float));
    DLTensor tdw = bxt_f32_view(dw, 2, sk), tdl = bxt_f32_view(dl_cpu, 2, sl);
    CHECK_STATUS(bx_moe_router_backward(&tl, &ti, &tdw, &tdl, &o), BX_OK, "router backward");
    bx_tg_router b = {lg, NULL, dw, ids_cpu, i64, NULL, dl_sim, NULL, (uint64_t)T, 0, 0,
                      q, (double)(float)o.routed_scaling_factor};
    sim_grid(&r, (uint64_t)T, body_router_bwd, &b);
    CHECK_SAME(dl_sim, dl_cpu, n, "router backward T %lld E %lld k %lld norm %d", (long long)T,
               (long long)E, (long long)k, norm);
    free(lg), free(bias), free(zeros), free(ids_cpu), free(ids_sim), free(w_cpu), free(w_sim);
    free(cn_cpu), free(cn_sim), free(dw), free(dl_cpu), free(dl_sim);
  }
}

/* ---- token dispatch ------------------------------------------------------------------ */

static void body_permute(const void *c, uint64_t i) { bx_tg_permute_elem(c, i); }
static void body_permute_bwd(const void *c, uint64_t i) { bx_tg_permute_bwd_elem(c, i); }
static void body_unpermute(const void *c, uint64_t i) { bx_tg_unpermute_elem(c, i); }
static void body_unpermute_dy(const void *c, uint64_t i) { bx_tg_unpermute_dy_elem(c, i); }
static void body_unpermute_dw(const void *c, uint64_t i) { bx_tg_unpermute_dw_slot(c, i); }

void test_train_cuda_sim_permute(void) {
  bxt_rng r;
  bxt_rng_init(&r);
  for (int it = 0; it < 60 && !bxt_failures(); it++) {
    int64_t T = (int64_t)bxt_below(&r, 24), E = 1 + (int64_t)bxt_below(&r, 8);
    int64_t k = 1 + (int64_t)bxt_below(&r, (uint64_t)E < 4 ? (uint64_t)E : 4);
    int64_t H = (int64_t)bxt_below(&r, 40), R = T * k;
    /* a plan from random distinct experts per token */
    int64_t *tid = malloc((size_t)(R + 1) * 8);
    for (int64_t t = 0; t < T; t++)
      for (int64_t j = 0; j < k; j++) {
        int64_t e;
        int dup;
        do {
          e = (int64_t)bxt_below(&r, (uint64_t)E);
          dup = 0;
          for (int64_t q = 0; q < j; q++) dup |= tid[t * k + q] == e;
        } while (dup);
        tid[t * k + j] = e;
      }
    int64_t *off = malloc((size_t)(E + 1) * 8), *rm = malloc((size_t)(2 * R + 1) * 8),
            *pos = malloc((size_t)(R + 1) * 8);
    int64_t sk[2] = {T, k}, so[1] = {E + 1}, sr[2] = {R, 2};
    DLTensor tk = i64_view(tid, 2, sk), to = i64_view(off, 1, so), tr = i64_view(rm, 2, sr),
             tp = i64_view(pos, 2, sk);
    CHECK_STATUS(bx_moe_dispatch_plan(&tk, NULL, &to, &tr, &tp, NULL), BX_OK, "plan");
    size_t nth = (size_t)(T * H), nrh = (size_t)(R * H);
    int64_t sth[2] = {T, H}, srh[2] = {R, H};
    float *x = sim_fill(&r, nth, 1), *xr = sim_fill(&r, nrh, 1), *w = sim_fill(&r, (size_t)R, 1);
    float *init = sim_fill(&r, nth, 1), *dout = sim_fill(&r, nth, 1);
    size_t nmax = nrh > nth ? nrh : nth; /* the output buffers serve every call */
    float *a_cpu = sim_fill(&r, nmax, 0), *a_sim = sim_fill(&r, nmax, 0);
    DLTensor tx = bxt_f32_view(x, 2, sth), txr = bxt_f32_view(xr, 2, srh),
             tw = bxt_f32_view(w, 2, sk), ti = bxt_f32_view(init, 2, sth),
             td = bxt_f32_view(dout, 2, sth);
    bx_tg_permute g = {NULL, w, NULL, dout, rm, pos, a_sim, NULL, (uint64_t)T, (uint64_t)k,
                       (uint64_t)H, (uint64_t)R};
    /* permute: x_perm = x's rows (bits kept, NaN payloads included) */
    DLTensor ty = bxt_f32_view(a_cpu, 2, srh);
    CHECK_STATUS(bx_moe_permute(&tx, &tr, &ty, NULL), BX_OK, "permute");
    g.x = x;
    sim_grid(&r, nrh, body_permute, &g);
    CHECK_SAME(a_sim, a_cpu, nrh, "permute T %lld k %lld H %lld", (long long)T, (long long)k,
               (long long)H);
    /* permute backward: the gather sum */
    DLTensor tdx = bxt_f32_view(a_cpu, 2, sth);
    CHECK_STATUS(bx_moe_permute_backward(&txr, &tr, &tp, &tdx, NULL), BX_OK, "permute backward");
    g.x = xr;
    sim_grid(&r, nth, body_permute_bwd, &g);
    CHECK_SAME(a_sim, a_cpu, nth, "permute backward T %lld k %lld H %lld", (long long)T,
               (long long)k, (long long)H);
    /* unpermute, with and without initial */
    int have_i = (int)bxt_below(&r, 2);
    DLTensor tout = bxt_f32_view(a_cpu, 2, sth);
    CHECK_STATUS(bx_moe_unpermute(&txr, &tw, &tr, &tp, have_i ? &ti : NULL, &tout, NULL), BX_OK,
                 "unpermute");
    g.init = have_i ? init : NULL;
    sim_grid(&r, nth, body_unpermute, &g);
    CHECK_SAME(a_sim, a_cpu, nth, "unpermute T %lld k %lld H %lld initial %d", (long long)T,
               (long long)k, (long long)H, have_i);
    /* unpermute backward: dy_perm, dweights, or both */
    int which = 1 + (int)bxt_below(&r, 3); /* 1 dy, 2 dw, 3 both */
    float *dw_cpu = sim_fill(&r, (size_t)R, 0), *dw_sim = sim_fill(&r, (size_t)R, 0);
    DLTensor tdy = bxt_f32_view(a_cpu, 2, srh), tdw = bxt_f32_view(dw_cpu, 2, sk);
    CHECK_STATUS(bx_moe_unpermute_backward(&td, &txr, &tw, &tr, &tp, (which & 1) ? &tdy : NULL,
                                           (which & 2) ? &tdw : NULL, NULL),
                 BX_OK, "unpermute backward");
    g.y = a_sim;
    g.dw = dw_sim;
    if (which & 1) {
      sim_grid(&r, nrh, body_unpermute_dy, &g);
      CHECK_SAME(a_sim, a_cpu, nrh, "unpermute backward dy_perm T %lld k %lld H %lld",
                 (long long)T, (long long)k, (long long)H);
    }
    if (which & 2) {
      sim_grid(&r, (uint64_t)R, body_unpermute_dw, &g);
      CHECK_SAME(dw_sim, dw_cpu, (size_t)R, "unpermute backward dweights T %lld k %lld H %lld",
                 (long long)T, (long long)k, (long long)H);
    }
    free(tid), free(off), free(rm), free(pos), free(x), free(xr), free(w), free(init), free(dout);
    free(a_cpu), free(a_sim), free(dw_cpu), free(dw_sim);
  }
}

/* ---- embedding ------------------------------------------------------------------------ */

static void body_emb_fwd(const void *c, uint64_t i) { bx_tg_embedding_fwd_elem(c, i); }
static void body_emb_bwd(const void *c, uint64_t i) { bx_tg_embedding_bwd_elem(c, i); }

void test_train_cuda_sim_embedding(void) {
  bxt_rng r;
  bxt_rng_init(&r);
  for (int it = 0; it < 60 && !bxt_failures(); it++) {
    int64_t V = 1 + (int64_t)bxt_below(&r, 12), H = (int64_t)bxt_below(&r, 30);
    int64_t T = (int64_t)bxt_below(&r, 60), C = 1 + (int64_t)bxt_below(&r, 20);
    int64_t nch = T / C + (T % C != 0);
    int i64 = (int)bxt_below(&r, 2);
    int64_t *idv = malloc((size_t)(T + 1) * 8);
    for (int64_t t = 0; t < T; t++) idv[t] = (int64_t)bxt_below(&r, (uint64_t)V); /* repeats */
    void *ids = ids_make(idv, (size_t)T, i64);
    size_t nw = (size_t)(V * H), ny = (size_t)(T * H);
    float *w = sim_fill(&r, nw, 1), *dy = sim_fill(&r, ny, 1);
    float *y_cpu = sim_fill(&r, ny, 0), *y_sim = sim_fill(&r, ny, 0);
    int64_t sw[2] = {V, H}, si[1] = {T}, sy[2] = {T, H};
    DLTensor tw = bxt_f32_view(w, 2, sw), ti = ids_view(ids, i64, 1, si),
             ty = bxt_f32_view(y_cpu, 2, sy);
    /* forward: a lookup, the bits kept */
    CHECK_STATUS(bx_embedding_forward(&tw, &ti, &ty, NULL), BX_OK, "embedding forward");
    bx_tg_embedding a = {w, dy, ids, i64, y_sim, NULL, NULL, (uint64_t)T, (uint64_t)H,
                         (uint64_t)C, (uint64_t)nch};
    sim_grid(&r, ny, body_emb_fwd, &a);
    CHECK_SAME(y_sim, y_cpu, ny, "embedding forward V %lld H %lld T %lld", (long long)V,
               (long long)H, (long long)T);
    /* backward: the compact chunk partials (padding_idx sometimes) */
    bx_embedding_opts o = BX_EMBEDDING_OPTS_DEFAULT;
    o.padding_idx = bxt_below(&r, 3) ? -1 : (int64_t)bxt_below(&r, (uint64_t)V);
    int64_t *rid = calloc((size_t)T + 1, 8), *offs = calloc((size_t)nch + 2, 8);
    float *rows_cpu = sim_fill(&r, ny, 0), *rows_sim = sim_fill(&r, ny, 0);
    int64_t so[1] = {nch + 1}, sr[1] = {T};
    DLTensor tdy = bxt_f32_view(dy, 2, sy), tr = i64_view(rid, 1, sr),
             trows = bxt_f32_view(rows_cpu, 2, sy), toff = i64_view(offs, 1, so);
    CHECK_STATUS(bx_embedding_backward(&ti, &tdy, V, C, &tr, &trows, &toff, &o), BX_OK,
                 "embedding backward");
    size_t total = (size_t)offs[nch];
    a.y = rows_sim;
    a.row_ids = rid; /* the host's decision, as on the device path */
    a.offsets = offs;
    sim_grid(&r, total * (size_t)H, body_emb_bwd, &a);
    CHECK_SAME(rows_sim, rows_cpu, total * (size_t)H,
               "embedding backward V %lld H %lld T %lld C %lld pad %lld", (long long)V,
               (long long)H, (long long)T, (long long)C, (long long)o.padding_idx);
    free(idv), free(ids), free(w), free(dy), free(y_cpu), free(y_sim), free(rid), free(offs);
    free(rows_cpu), free(rows_sim);
  }
}

/* ---- cross-entropy ------------------------------------------------------------------------ */

static void body_xent_row(const void *c, uint64_t i) { bx_tg_xent_row(c, i); }
static void body_xent_chunk(const void *c, uint64_t i) { bx_tg_xent_chunk(c, i); }

void test_train_cuda_sim_xent(void) {
  bxt_rng r;
  bxt_rng_init(&r);
  for (int it = 0; it < 60 && !bxt_failures(); it++) {
    int64_t T = (int64_t)bxt_below(&r, 20), V = 1 + (int64_t)bxt_below(&r, 400);
    int64_t C = 1 + (int64_t)bxt_below(&r, 8), nch = T / C + (T % C != 0);
    int i64 = (int)bxt_below(&r, 2), what = 1 + (int)bxt_below(&r, 3); /* 1 fwd 2 bwd 3 both */
    int inplace = (what & 2) && bxt_below(&r, 2);
    int specials = (int)bxt_below(&r, 2); /* half the calls: rows with NaN/Inf logits */
    bx_xent_opts o = BX_XENT_OPTS_DEFAULT;
    o.grad_scale = bxt_below(&r, 2) ? 1.0 : 0.25 + bxt_normal(&r) * 0.1;
    int64_t *yv = malloc((size_t)(T + 1) * 8), local = 0;
    for (int64_t t = 0; t < T; t++) {
      yv[t] = bxt_below(&r, 5) ? (int64_t)bxt_below(&r, (uint64_t)V) : o.ignore_index;
      local += yv[t] != o.ignore_index;
    }
    int64_t n_global = local + (int64_t)bxt_below(&r, 3) + (local == 0);
    void *tg = ids_make(yv, (size_t)T, i64);
    size_t n = (size_t)(T * V);
    float *z = sim_fill(&r, n, specials);
    if (!specials)
      for (size_t i = 0; i < n; i++)
        if (!bxt_below(&r, 8)) z[i] = (float)(int)bxt_below(&r, 3); /* ties of the max */
    float *z_cpu = sim_copy(z, n), *z_sim = sim_copy(z, n);
    float *g_cpu = inplace ? z_cpu : sim_fill(&r, n, 0);
    float *g_sim = inplace ? z_sim : sim_fill(&r, n, 0);
    float *l_cpu = sim_fill(&r, (size_t)T, 0), *l_sim = sim_fill(&r, (size_t)T, 0);
    float *p_cpu = sim_fill(&r, (size_t)nch, 0), *p_sim = sim_fill(&r, (size_t)nch, 0);
    int64_t *c_cpu = calloc((size_t)nch + 1, 8), *c_sim = calloc((size_t)nch + 1, 8);
    int64_t sz[2] = {T, V}, st[1] = {T}, sc[1] = {nch};
    DLTensor tz = bxt_f32_view(z_cpu, 2, sz), ty = ids_view(tg, i64, 1, st),
             tg_ = bxt_f32_view(g_cpu, 2, sz), tl = bxt_f32_view(l_cpu, 1, st),
             tp = bxt_f32_view(p_cpu, 1, sc), tc = i64_view(c_cpu, 1, sc);
    bx_status s;
    if (what == 1)
      s = bx_xent_forward(&tz, &ty, C, &tl, &tp, &tc, &o);
    else if (what == 2)
      s = bx_xent_backward(&tz, &ty, n_global, &tg_, &o);
    else
      s = bx_xent_forward_backward(&tz, &ty, n_global, C, &tl, &tp, &tc, &tg_, &o);
    CHECK_STATUS(s, BX_OK, "xent %d", what);
    bx_tg_xent a = {z_sim, tg, i64, o.ignore_index, (what & 2) ? g_sim : NULL,
                    (what & 1) ? l_sim : NULL, (what & 1) ? p_sim : NULL,
                    (what & 1) ? c_sim : NULL, (uint64_t)T, (uint64_t)V, (uint64_t)C,
                    (uint64_t)nch, (what & 2) ? o.grad_scale / (double)n_global : 0.0};
    sim_grid(&r, (uint64_t)T, body_xent_row, &a);
    if (what & 1) sim_grid(&r, (uint64_t)nch, body_xent_chunk, &a);
    if (what & 1) {
      CHECK_SAME(l_sim, l_cpu, (size_t)T, "xent losses T %lld V %lld what %d", (long long)T,
                 (long long)V, what);
      CHECK_SAME(p_sim, p_cpu, (size_t)nch, "xent partials T %lld C %lld", (long long)T,
                 (long long)C);
      long d = diff_i64(c_sim, c_cpu, (size_t)nch);
      CHECK(d < 0, "xent counts: chunk %ld differs", d);
    }
    if (what & 2)
      CHECK_SAME(g_sim, g_cpu, n, "xent dlogits T %lld V %lld what %d in place %d", (long long)T,
                 (long long)V, what, inplace);
    free(yv), free(tg), free(z), free(z_cpu), free(z_sim), free(l_cpu), free(l_sim);
    free(p_cpu), free(p_sim), free(c_cpu), free(c_sim);
    if (!inplace) free(g_cpu), free(g_sim);
  }
}

/* ---- the dispatch ------------------------------------------------------------------------ */

/* Every tensor kDLCUDA: the device path of each entry (no GPU here: the
 * host copy of the ids / logits / targets fails with BX_EDEVICE from the
 * backend, or "no CUDA backend" without one), the call named, nothing
 * written; a mixed call names its first device tensor, as before. */
void test_train_cuda_dispatch_moe(void) {
  if (bx_cuda_available() == BX_OK) {
    bxt_skip("a GPU is present: fake device tensors would be dereferenced (tests/cuda runs there)");
    return;
  }
  float lg[8] = {1, 2, 3, 4, 5, 6, 7, 8}, bias[4] = {0}, w[4] = {9, 9, 9, 9};
  int64_t ids[4] = {0, 1, 2, 3}, sl[2] = {2, 4}, sb[1] = {4}, sk[2] = {2, 2};
  DLTensor tl = bxt_f32_view(lg, 2, sl), tb = bxt_f32_view(bias, 1, sb),
           ti = i64_view(ids, 2, sk), tw = bxt_f32_view(w, 2, sk);
  DLTensor *all[4] = {&tl, &tb, &ti, &tw};
  for (int i = 0; i < 4; i++) all[i]->device.device_type = kDLCUDA;
  CHECK_STATUS(bx_moe_router_forward(&tl, &tb, &ti, &tw, 1, NULL, NULL), BX_EDEVICE,
               "all-CUDA router forward");
  CHECK(strstr(bx_last_error(), "bx_moe_router_forward") != NULL, "names the call: %s",
        bx_last_error());
  CHECK(w[0] == 9.0f && ids[3] == 3, "nothing written");
  float dl[8] = {7, 7, 7, 7, 7, 7, 7, 7};
  int64_t sd[2] = {2, 4};
  DLTensor tdl = bxt_f32_view(dl, 2, sd);
  tdl.device.device_type = kDLCUDA;
  CHECK_STATUS(bx_moe_router_backward(&tl, &ti, &tw, &tdl, NULL), BX_EDEVICE,
               "all-CUDA router backward");
  CHECK(dl[0] == 7.0f, "nothing written");
  /* cross-entropy: targets copied first */
  int64_t y[2] = {0, 1}, sy[1] = {2};
  float loss[2] = {5, 5};
  DLTensor ty = i64_view(y, 1, sy), tlo = bxt_f32_view(loss, 1, sy);
  ty.device.device_type = tlo.device.device_type = kDLCUDA;
  CHECK_STATUS(bx_xent_forward(&tl, &ty, 1, &tlo, NULL, NULL, NULL), BX_EDEVICE, "all-CUDA xent");
  CHECK(strstr(bx_last_error(), "bx_xent_forward") != NULL, "names the call: %s",
        bx_last_error());
  CHECK(loss[0] == 5.0f, "nothing written");
  /* embedding: the ids copied first */
  DLTensor tyy = bxt_f32_view(dl, 2, sd);
  tyy.device.device_type = kDLCUDA;
  CHECK_STATUS(bx_embedding_forward(&tl, &ty, &tyy, NULL), BX_EDEVICE, "all-CUDA embedding");
  CHECK(dl[0] == 7.0f, "nothing written");
  /* mixed: the host path's message names the first device tensor */
  tb.device.device_type = kDLCPU;
  CHECK_STATUS(bx_moe_router_forward(&tl, &tb, &ti, &tw, 1, NULL, NULL), BX_EDEVICE,
               "mixed router forward");
  CHECK(strstr(bx_last_error(), "tensor 0 (logits) is on device"), "names tensor 0: %s",
        bx_last_error());
}
