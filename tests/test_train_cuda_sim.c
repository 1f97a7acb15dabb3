/*
 * test_train_cuda_sim.c — the training kernels' CUDA decomposition, run on
 * the CPU (issue 30, S2).
 *
 * src/cuda/train/train_grid.h holds the thread bodies of the CUDA launchers
 * (which thread computes which output; the GEMM's tiles, edge tiles and
 * shared-memory phases), over the CPU kernels' own arithmetic
 * (the src/common _hd.h headers). Here a simulated grid runs those bodies
 * (the launcher's grid, or a random other one; blocks and threads in a
 * shuffled order, so an output that depended on another thread's write
 * would show) and the result must equal the public CPU entry's on the same
 * bytes, bit for bit, over random shapes and special values (+-0,
 * subnormals, +-Inf, NaN with payloads: the stores are canonical on both
 * sides, ties, bf16 operands). The device run itself waits for a GPU
 * (docs/cuda.md).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "bitexact_train.h"
#include "dl_view.h"
#include "harness.h"
#include "tests.h"
#include "train_cuda_sim.h"

/* ---- SwiGLU ------------------------------------------------------------------------- */

static void body_swiglu_fwd(const void *c, uint64_t i) { bx_tg_swiglu_fwd(c, i); }
static void body_swiglu_bwd(const void *c, uint64_t i) { bx_tg_swiglu_bwd(c, i); }

void test_train_cuda_sim_swiglu(void) {
  bxt_rng r;
  bxt_rng_init(&r);
  for (int it = 0; it < 40 && !bxt_failures(); it++) {
    size_t rows = 1 + bxt_below(&r, 9), f = 1 + bxt_below(&r, 300), n = rows * f;
    int fused = (int)bxt_below(&r, 2);
    float *gu = sim_fill(&r, 2 * n, 1), *dh = sim_fill(&r, n, 1);
    float *g = gu, *u = fused ? gu + f : gu + n; /* fused rows: gate then up */
    size_t ld = fused ? 2 * f : f;
    int64_t s2[2] = {(int64_t)rows, (int64_t)f}, s2f[2] = {(int64_t)rows, (int64_t)(2 * f)};
    /* forward */
    float *h_cpu = malloc(n * sizeof(float)), *h_sim = malloc(n * sizeof(float));
    DLTensor th = bxt_f32_view(h_cpu, 2, s2);
    bx_status st;
    if (fused) {
      DLTensor tgu = bxt_f32_view(gu, 2, s2f);
      st = bx_swiglu_forward_fused(&tgu, &th, NULL);
    } else {
      DLTensor tg = bxt_f32_view(g, 2, s2), tu = bxt_f32_view(u, 2, s2);
      st = bx_swiglu_forward(&tg, &tu, &th, NULL);
    }
    CHECK_STATUS(st, BX_OK, "swiglu forward");
    bx_tg_swiglu a = {g, u, NULL, h_sim, NULL, NULL, rows, f, ld, ld, f, 0, 0};
    sim_grid(&r, n, body_swiglu_fwd, &a);
    CHECK_SAME(h_sim, h_cpu, n, "swiglu forward rows %zu f %zu fused %d", rows, f, fused);
    /* backward, in place on the CPU side's copy when fused (dgate_up = gate_up) */
    float *gu_cpu = sim_copy(gu, 2 * n), *gu_sim = sim_copy(gu, 2 * n);
    float *d_cpu = malloc(2 * n * sizeof(float)), *d_sim = malloc(2 * n * sizeof(float));
    DLTensor tdh = bxt_f32_view(dh, 2, s2);
    if (fused) {
      DLTensor tgu = bxt_f32_view(gu_cpu, 2, s2f);
      st = bx_swiglu_backward_fused(&tgu, &tdh, &tgu, NULL);
      bx_tg_swiglu b = {gu_sim, gu_sim + f, dh, NULL, gu_sim, gu_sim + f, rows, f, ld, ld, f, ld, ld};
      sim_grid(&r, n, body_swiglu_bwd, &b);
      CHECK_SAME(gu_sim, gu_cpu, 2 * n, "swiglu backward fused in place rows %zu f %zu", rows, f);
    } else {
      DLTensor tg = bxt_f32_view(g, 2, s2), tu = bxt_f32_view(u, 2, s2);
      DLTensor tdg = bxt_f32_view(d_cpu, 2, s2), tdu = bxt_f32_view(d_cpu + n, 2, s2);
      st = bx_swiglu_backward(&tg, &tu, &tdh, &tdg, &tdu, NULL);
      bx_tg_swiglu b = {g, u, dh, NULL, d_sim, d_sim + n, rows, f, f, f, f, f, f};
      sim_grid(&r, n, body_swiglu_bwd, &b);
      CHECK_SAME(d_sim, d_cpu, 2 * n, "swiglu backward rows %zu f %zu", rows, f);
    }
    CHECK_STATUS(st, BX_OK, "swiglu backward");
    free(gu), free(dh), free(h_cpu), free(h_sim), free(gu_cpu), free(gu_sim), free(d_cpu),
        free(d_sim);
  }
}

/* ---- AdamW ------------------------------------------------------------------------------ */

static void body_adamw(const void *c, uint64_t i) { bx_tg_adamw_elem(c, i); }

void test_train_cuda_sim_adamw(void) {
  bxt_rng r;
  bxt_rng_init(&r);
  for (int it = 0; it < 30 && !bxt_failures(); it++) {
    size_t n = 1 + bxt_below(&r, 5000);
    bx_adamw_opts o = BX_ADAMW_OPTS_DEFAULT;
    o.lr = bxt_below(&r, 2) ? 1e-3 : 0.5;
    o.beta1 = bxt_below(&r, 4) ? 0.9 : 0.3; /* both lerp forms */
    o.beta2 = bxt_below(&r, 2) ? 0.999 : 0.95;
    o.weight_decay = bxt_below(&r, 2) ? 0.0 : 0.1;
    o.eps = bxt_below(&r, 2) ? 1e-8 : 0.0;
    int64_t step = 1 + (int64_t)bxt_below(&r, 1000);
    float *p = sim_fill(&r, n, 1), *g = sim_fill(&r, n, 1), *m = sim_fill(&r, n, 1);
    float *v = sim_fill(&r, n, 0);
    for (size_t i = 0; i < n; i++) v[i] = fabsf(v[i]) * 1e-3f;
    if (n > 3) v[n / 2] = bx_f32_from_bits(0x7FA00001u); /* a NaN payload in the state */
    float *pc = sim_copy(p, n), *mc = sim_copy(m, n), *vc = sim_copy(v, n);
    int64_t sh[1] = {(int64_t)n};
    DLTensor tp = bxt_f32_view(pc, 1, sh), tg = bxt_f32_view(g, 1, sh), tm = bxt_f32_view(mc, 1, sh),
             tv = bxt_f32_view(vc, 1, sh);
    CHECK_STATUS(bx_adamw_step(&tp, &tg, &tm, &tv, step, &o), BX_OK, "adamw");
    bx_tg_adamw a;
    memset(&a, 0, sizeof a);
    a.p = p, a.m = m, a.v = v, a.g = g, a.n = n;
    bx_adamw_form_scalars(&o, step, &a.s);
    sim_grid(&r, n, body_adamw, &a);
    CHECK_SAME(p, pc, n, "adamw param n %zu step %lld", n, (long long)step);
    CHECK_SAME(m, mc, n, "adamw exp_avg n %zu step %lld", n, (long long)step);
    CHECK_SAME(v, vc, n, "adamw exp_avg_sq n %zu step %lld", n, (long long)step);
    free(p), free(g), free(m), free(v), free(pc), free(mc), free(vc);
  }
}

/* ---- RMSNorm -------------------------------------------------------------------------------- */

static void body_rms_fwd(const void *c, uint64_t i) { bx_tg_rmsnorm_fwd_row(c, i); }
static void body_rms_part(const void *c, uint64_t i) { bx_tg_rmsnorm_part(c, i); }
static void body_rms_dx(const void *c, uint64_t i) { bx_tg_rmsnorm_dx_row(c, i); }

void test_train_cuda_sim_rmsnorm(void) {
  bxt_rng r;
  bxt_rng_init(&r);
  for (int it = 0; it < 30 && !bxt_failures(); it++) {
    size_t rows = 1 + bxt_below(&r, 40), h = 1 + bxt_below(&r, 200), n = rows * h;
    int specials = (int)bxt_below(&r, 3) == 0;
    float *x = sim_fill(&r, n, specials), *w = sim_fill(&r, h, specials),
          *dy = sim_fill(&r, n, specials);
    if (!specials && rows > 2) memset(x + h, 0, h * sizeof(float)); /* a zero row: rstd = 1/sqrt(eps) */
    float eps = 1e-6f;
    int64_t s2[2] = {(int64_t)rows, (int64_t)h}, s1[1] = {(int64_t)h}, sr[1] = {(int64_t)rows};
    float *y_cpu = malloc(n * 4), *y_sim = malloc(n * 4), *rs_cpu = malloc(rows * 4),
          *rs_sim = malloc(rows * 4);
    DLTensor tx = bxt_f32_view(x, 2, s2), tw = bxt_f32_view(w, 1, s1), ty = bxt_f32_view(y_cpu, 2, s2),
             trs = bxt_f32_view(rs_cpu, 1, sr);
    CHECK_STATUS(bx_rmsnorm_forward(&tx, &tw, eps, &ty, &trs, NULL), BX_OK, "rmsnorm forward");
    bx_tg_rmsnorm a = {x, w, NULL, NULL, y_sim, rs_sim, NULL, NULL, rows, h, 0, 0, eps};
    sim_grid(&r, rows, body_rms_fwd, &a);
    CHECK_SAME(y_sim, y_cpu, n, "rmsnorm y rows %zu h %zu", rows, h);
    CHECK_SAME(rs_sim, rs_cpu, rows, "rmsnorm rstd rows %zu h %zu", rows, h);
    /* backward: partials over chunks, dx (in place of dy half the time) */
    size_t chunk = 1 + bxt_below(&r, rows + 2), eff = chunk < rows ? chunk : rows;
    size_t nch = (rows + eff - 1) / eff;
    int inplace = (int)bxt_below(&r, 2);
    float *dy_cpu = sim_copy(dy, n), *dy_sim = sim_copy(dy, n);
    float *dx_cpu = inplace ? dy_cpu : malloc(n * 4), *dx_sim = inplace ? dy_sim : malloc(n * 4);
    float *p_cpu = malloc(nch * h * 4), *p_sim = malloc(nch * h * 4);
    int64_t sp[2] = {(int64_t)nch, (int64_t)h};
    DLTensor tdy = bxt_f32_view(dy_cpu, 2, s2), tdx = bxt_f32_view(dx_cpu, 2, s2),
             tp = bxt_f32_view(p_cpu, 2, sp);
    CHECK_STATUS(bx_rmsnorm_backward(&tx, &tw, &tdy, &trs, (int64_t)chunk, &tdx, &tp, NULL), BX_OK,
                 "rmsnorm backward");
    bx_tg_rmsnorm b = {x, w, dy_sim, rs_cpu, NULL, NULL, dx_sim, p_sim, rows, h, eff, nch, 0.0f};
    sim_grid(&r, nch * h, body_rms_part, &b); /* the launcher's order: partials, then dx */
    sim_grid(&r, rows, body_rms_dx, &b);
    CHECK_SAME(p_sim, p_cpu, nch * h, "rmsnorm partials rows %zu h %zu chunk %zu", rows, h, chunk);
    CHECK_SAME(dx_sim, dx_cpu, n, "rmsnorm dx rows %zu h %zu in place %d", rows, h, inplace);
    free(x), free(w), free(dy), free(y_cpu), free(y_sim), free(rs_cpu), free(rs_sim), free(dy_cpu),
        free(dy_sim), free(p_cpu), free(p_sim);
    if (!inplace) free(dx_cpu), free(dx_sim);
  }
}

/* ---- RoPE ------------------------------------------------------------------------------------- */

static void body_rope(const void *c, uint64_t i) { bx_tg_rope_slot(c, i); }

void test_train_cuda_sim_rope(void) {
  bxt_rng r;
  bxt_rng_init(&r);
  for (int it = 0; it < 30 && !bxt_failures(); it++) {
    size_t tokens = 1 + bxt_below(&r, 12), heads = 1 + bxt_below(&r, 4);
    size_t head_dim = 2 * (1 + bxt_below(&r, 20));
    size_t rotary = 2 * (1 + bxt_below(&r, head_dim / 2)), width = heads * head_dim, n = tokens * width;
    double theta = bxt_below(&r, 2) ? 10000.0 : 1e6;
    int backward = (int)bxt_below(&r, 2), inplace = (int)bxt_below(&r, 2);
    float *x = sim_fill(&r, n, 1);
    int64_t *pos = malloc(tokens * sizeof *pos);
    for (size_t t = 0; t < tokens; t++)
      pos[t] = bxt_below(&r, 4) ? (int64_t)bxt_below(&r, 5000) : (int64_t)1 << 24; /* the largest too */
    float *x_cpu = sim_copy(x, n), *x_sim = sim_copy(x, n);
    float *y_cpu = inplace ? x_cpu : malloc(n * 4), *y_sim = inplace ? x_sim : malloc(n * 4);
    int64_t s2[2] = {(int64_t)tokens, (int64_t)width}, sp[1] = {(int64_t)tokens};
    DLTensor tx = bxt_f32_view(x_cpu, 2, s2), ty = bxt_f32_view(y_cpu, 2, s2),
             tpos = bxt_view(pos, kDLInt, 64, 1, sp);
    bx_status st = backward ? bx_rope_backward(&tx, &tpos, (int64_t)head_dim, (int64_t)rotary, theta, &ty, NULL)
                            : bx_rope_forward(&tx, &tpos, (int64_t)head_dim, (int64_t)rotary, theta, &ty, NULL);
    CHECK_STATUS(st, BX_OK, "rope");
    bx_tg_rope a = {x_sim, y_sim, pos, tokens, width, head_dim, heads, rotary / 2, rotary,
                    (float)theta, backward ? -1.0f : 1.0f};
    sim_grid(&r, tokens * bx_tg_rope_slots(&a), body_rope, &a);
    CHECK_SAME(y_sim, y_cpu, n, "rope tokens %zu heads %zu head_dim %zu rotary %zu bwd %d in place %d",
               tokens, heads, head_dim, rotary, backward, inplace);
    free(x), free(pos), free(x_cpu), free(x_sim);
    if (!inplace) free(y_cpu), free(y_sim);
  }
}

/* ---- GEMM ---------------------------------------------------------------------------------------- */

/* The kernel's grid: blocks (row tile, column tile) in random order; in each
 * block the phases between __syncthreads(), every thread in random order. */
static void sim_gemm(bxt_rng *r, const bx_tg_gemm *g) {
  uint32_t gx = (uint32_t)((g->m + BX_TG_GEMM_BM - 1) / BX_TG_GEMM_BM);
  uint32_t gy = (uint32_t)((g->n + BX_TG_GEMM_BN - 1) / BX_TG_GEMM_BN);
  uint32_t nb = gx * gy, *bo = malloc(nb * sizeof *bo), to[BX_TG_GEMM_THREADS];
  float(*acc)[BX_TG_GEMM_TM * BX_TG_GEMM_TN] = malloc(sizeof(*acc) * BX_TG_GEMM_THREADS);
  float As[BX_TG_GEMM_BK * BX_TG_GEMM_BM], Bs[BX_TG_GEMM_BK * BX_TG_GEMM_BN];
  shuffle_u32(r, bo, nb);
  for (uint32_t b = 0; b < nb; b++) {
    uint64_t bm = bo[b] % gx, bn = bo[b] / gx;
    shuffle_u32(r, to, BX_TG_GEMM_THREADS);
    for (uint32_t t = 0; t < BX_TG_GEMM_THREADS; t++) bx_tg_gemm_init(g, bm, bn, to[t], acc[to[t]]);
    for (uint64_t k0 = 0; k0 < g->k; k0 += BX_TG_GEMM_BK) {
      /* shared memory is not cleared between tiles: stale values must not matter */
      shuffle_u32(r, to, BX_TG_GEMM_THREADS);
      for (uint32_t t = 0; t < BX_TG_GEMM_THREADS; t++) bx_tg_gemm_load(g, bm, bn, k0, to[t], As, Bs);
      shuffle_u32(r, to, BX_TG_GEMM_THREADS);
      for (uint32_t t = 0; t < BX_TG_GEMM_THREADS; t++)
        bx_tg_gemm_compute(g, k0, to[t], As, Bs, acc[to[t]]);
    }
    shuffle_u32(r, to, BX_TG_GEMM_THREADS);
    for (uint32_t t = 0; t < BX_TG_GEMM_THREADS; t++) bx_tg_gemm_store(g, bm, bn, to[t], acc[to[t]]);
  }
  free(bo), free(acc);
}

static void *gemm_operand(bxt_rng *r, size_t n, int bf16) {
  if (!bf16) return sim_fill(r, n, bxt_below(r, 2));
  uint16_t *h = malloc((n ? n : 1) * 2);
  for (size_t i = 0; i < n; i++) h[i] = (uint16_t)(bx_f32_bits(sim_value(r)) >> 16);
  return h;
}

void test_train_cuda_sim_gemm(void) {
  bxt_rng r;
  bxt_rng_init(&r);
  static const char *names[3] = {"NT", "NN", "TN"};
  for (int it = 0; it < 60 && !bxt_failures(); it++) {
    int layout = (int)bxt_below(&r, 3), abf = (int)bxt_below(&r, 2), bbf = (int)bxt_below(&r, 2);
    int accumulate = (int)bxt_below(&r, 2);
    size_t m = 1 + bxt_below(&r, it < 10 ? 200 : 90), n = 1 + bxt_below(&r, 150);
    size_t k = bxt_below(&r, 8) ? 1 + bxt_below(&r, 70) : (it % 2 ? 0 : 16 * (1 + bxt_below(&r, 3)));
    void *a = gemm_operand(&r, m * k, abf), *b = gemm_operand(&r, n * k, bbf);
    float *c0 = sim_fill(&r, m * n, 1);
    float *c_cpu = sim_copy(c0, m * n), *c_sim = sim_copy(c0, m * n);
    /* NT: a [M,K], b [N,K]; NN: a [M,K], b [K,N]; TN: a [K,M], b [K,N] (c [M,N]) */
    int64_t sa[2], sb[2], sc[2] = {(int64_t)m, (int64_t)n};
    if (layout == 2) { sa[0] = (int64_t)k; sa[1] = (int64_t)m; }
    else { sa[0] = (int64_t)m; sa[1] = (int64_t)k; }
    if (layout == 0) { sb[0] = (int64_t)n; sb[1] = (int64_t)k; }
    else { sb[0] = (int64_t)k; sb[1] = (int64_t)n; }
    DLTensor ta = abf ? bxt_view(a, kDLBfloat, 16, 2, sa) : bxt_f32_view(a, 2, sa);
    DLTensor tb = bbf ? bxt_view(b, kDLBfloat, 16, 2, sb) : bxt_f32_view(b, 2, sb);
    DLTensor tc = bxt_f32_view(c_cpu, 2, sc);
    bx_gemm_opts o = BX_GEMM_OPTS_DEFAULT;
    o.accumulate = accumulate;
    CHECK_STATUS(bx_gemm(&ta, &tb, (bx_gemm_layout)layout, &tc, &o), BX_OK, "gemm");
    bx_tg_gemm g = {a, b, abf, bbf, layout, c_sim, m, n, k, accumulate};
    if (!(k == 0 && accumulate)) sim_gemm(&r, &g); /* the launcher's rule for K = 0 */
    CHECK_SAME(c_sim, c_cpu, m * n, "gemm %s m %zu n %zu k %zu a bf16 %d b bf16 %d accumulate %d",
               names[layout], m, n, k, abf, bbf, accumulate);
    /* and the scalar reference of gemm_hd.h on a few outputs */
    for (int s = 0; s < 4 && k; s++) {
      size_t i = bxt_below(&r, m), j = bxt_below(&r, n);
      const char *ab = a, *bb = b;
      size_t es_a = abf ? 2 : 4, es_b = bbf ? 2 : 4;
      const void *ap = layout == 2 ? (const void *)(ab + i * es_a) : (const void *)(ab + i * k * es_a);
      const void *bp = layout == 0 ? (const void *)(bb + j * k * es_b) : (const void *)(bb + j * es_b);
      float want = bx_gemm_store_f32(bx_gemm_chain(bx_gemm_start_f32(accumulate, c0[i * n + j]), ap,
                                                   abf, layout == 2 ? m : 1, bp, bbf,
                                                   layout == 0 ? 1 : n, k));
      CHECK_BITS_F(c_cpu[i * n + j], want, "gemm %s scalar chain at (%zu, %zu)", names[layout], i, j);
    }
    free(a), free(b), free(c0), free(c_cpu), free(c_sim);
  }
}

/* ---- the dispatch ------------------------------------------------------------------------ */

/* Every tensor kDLCUDA: the device path (no GPU here: BX_EDEVICE from the
 * backend, or "no CUDA backend" without one), nothing written; a mixed
 * call names its first device tensor, as before the device path. */
void test_train_cuda_dispatch(void) {
  if (bx_cuda_available() == BX_OK) {
    bxt_skip("a GPU is present: fake device tensors would be dereferenced (tests/cuda runs there)");
    return;
  }
  float g[6] = {1, 2, 3, 4, 5, 6}, u[6] = {1, 1, 1, 1, 1, 1}, h[6] = {7, 7, 7, 7, 7, 7};
  int64_t sh[2] = {2, 3};
  DLTensor tg = bxt_f32_view(g, 2, sh), tu = bxt_f32_view(u, 2, sh), th = bxt_f32_view(h, 2, sh);
  tg.device.device_type = tu.device.device_type = th.device.device_type = kDLCUDA;
  CHECK_STATUS(bx_swiglu_forward(&tg, &tu, &th, NULL), BX_EDEVICE, "all-CUDA swiglu");
  const char *m = bx_last_error();
  CHECK(strstr(m, "bx_swiglu_forward") && (strstr(m, "no CUDA backend") || strstr(m, "kernel")),
        "the device path's error names the call: %s", m);
  CHECK(h[0] == 7.0f && h[5] == 7.0f, "nothing written");
  CHECK_STATUS(bx_gemm(&tg, &tu, BX_GEMM_NT, &th, NULL), BX_EINVAL, "all-CUDA gemm, K mismatch");
  int64_t sc[2] = {2, 2};
  float c[4] = {7, 7, 7, 7};
  DLTensor tc = bxt_f32_view(c, 2, sc);
  tc.device.device_type = kDLCUDA;
  CHECK_STATUS(bx_gemm(&tg, &tu, BX_GEMM_NT, &tc, NULL), BX_EDEVICE, "all-CUDA gemm");
  CHECK(c[0] == 7.0f, "nothing written");
  tu.device.device_type = kDLCPU; /* mixed: the host path's message */
  CHECK_STATUS(bx_swiglu_forward(&tg, &tu, &th, NULL), BX_EDEVICE, "mixed swiglu");
  CHECK(strstr(bx_last_error(), "tensor 0 (gate) is on device"), "names tensor 0: %s",
        bx_last_error());
  tu.device.device_type = kDLCUDA;
  tu.device.device_id = 1; /* two devices */
  CHECK_STATUS(bx_swiglu_forward(&tg, &tu, &th, NULL), BX_EDEVICE, "two devices");
  CHECK(strstr(bx_last_error(), "tensor 1 (up)"), "names tensor 1: %s", bx_last_error());
}
