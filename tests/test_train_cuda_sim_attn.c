/*
 * test_train_cuda_sim_attn.c — attention's CUDA decomposition, run on the
 * CPU (issue 30, S2).
 *
 * src/cuda/train/grid_attention.h holds the thread bodies of attention.cu
 * (forward: one thread per (token, query head); backward: delta per
 * (token, query head) parked in dq, dK/dV per (key token, kv head), dQ
 * per (token, query head)), over attention_hd.h's arithmetic. Here each
 * kernel runs on a simulated grid (blocks and threads shuffled, kernels
 * in the launcher's order) and the result must equal bx_attention_forward
 * / _backward's on the same bytes, bit for bit, over random shapes
 * (L = 1, GQA ratios, odd head dims, several sequences) and values (+-0,
 * subnormals, chains that round to -0 or +0 and tie at the max, +-Inf,
 * NaN with payloads, small integers for tied maxima).
 */
#include <stdlib.h>
#include <string.h>

#include "bitexact_train.h"
#include "dl_view.h"
#include "grid_attention.h"
#include "harness.h"
#include "tests.h"
#include "train_cuda_sim.h"

static void body_attn_fwd(const void *c, uint64_t i) { bx_tg_attn_fwd_row(c, i); }
static void body_attn_delta(const void *c, uint64_t i) { bx_tg_attn_delta_row(c, i); }
static void body_attn_dkdv(const void *c, uint64_t i) { bx_tg_attn_dkdv_row(c, i); }
static void body_attn_dq(const void *c, uint64_t i) { bx_tg_attn_dq_row(c, i); }

/* One random attention problem: shapes and the operands' values. */
typedef struct attn_case {
  size_t B, L, Hq, Hkv, D, T, nq, nk; /* nq = T Hq D, nk = T Hkv D */
  int mode;                           /* the values: see attn_values */
  float *q, *k, *v, *dout;
} attn_case;

/* A value of mode 0 plain, 1 every special, 2 small integers and signed
 * zeros (tied scores, tied maxima), 3 tiny (dot chains that round to -0
 * or +0, so that maxima tie between -0 and +0; subnormal scores), 4 plain
 * with a few specials planted. */
static float attn_value(bxt_rng *r, int mode) {
  switch (mode) {
  case 1:
    return sim_value(r);
  case 2: {
    static const float v[] = {-2.0f, -1.0f, -0.0f, 0.0f, 0.0f, 1.0f, 1.0f, 2.0f};
    return v[bxt_below(r, 8)];
  }
  case 3: /* products below 2^-150 mostly: chains of signed zeros, ties of -0 and +0 */
    return (float)bxt_normal(r) * (bxt_below(r, 4) ? 0x1p-76f : 0x1p-68f);
  case 4:
    return bxt_below(r, 40) ? (float)bxt_normal(r) : sim_value(r);
  default:
    return (float)bxt_normal(r);
  }
}

static float *attn_fill(bxt_rng *r, size_t n, int mode) {
  float *x = malloc((n ? n : 1) * sizeof *x);
  for (size_t i = 0; i < n; i++) x[i] = attn_value(r, mode);
  return x;
}

/* Garbage in an output before the simulated kernels (every element must
 * be written). */
static float *attn_garbage(size_t n) {
  float *x = malloc((n ? n : 1) * sizeof *x);
  for (size_t i = 0; i < n; i++) x[i] = bx_f32_from_bits(0x7FBADBADu);
  return x;
}

static void attn_case_make(bxt_rng *r, attn_case *c) {
  static const size_t ratios[] = {1, 1, 2, 3, 4, 8};
  c->B = 1 + bxt_below(r, 3);
  c->L = bxt_below(r, 5) == 0 ? 1 : 1 + bxt_below(r, 37);
  c->Hkv = 1 + bxt_below(r, 3);
  c->Hq = c->Hkv * ratios[bxt_below(r, 6)];
  c->D = bxt_below(r, 6) == 0 ? 1 + bxt_below(r, 70) : 1 + bxt_below(r, 12);
  c->T = c->B * c->L;
  c->nq = c->T * c->Hq * c->D;
  c->nk = c->T * c->Hkv * c->D;
  c->mode = (int)bxt_below(r, 5);
  c->q = attn_fill(r, c->nq, c->mode);
  c->k = attn_fill(r, c->nk, c->mode);
  c->v = attn_fill(r, c->nk, c->mode == 3 ? 0 : c->mode);
  c->dout = attn_fill(r, c->nq, c->mode == 3 ? 0 : c->mode);
}

static void attn_case_free(attn_case *c) { free(c->q), free(c->k), free(c->v), free(c->dout); }

/* The CPU's forward (o, stats) of c; BX_OK expected. */
static void attn_cpu_fwd(bxt_rng *r, const attn_case *c, float *o, float *stats) {
  int64_t sq[2] = {(int64_t)c->T, (int64_t)(c->Hq * c->D)},
          sk[2] = {(int64_t)c->T, (int64_t)(c->Hkv * c->D)},
          ss[3] = {(int64_t)c->T, (int64_t)c->Hq, 2};
  DLTensor tq = bxt_f32_view(c->q, 2, sq), tk = bxt_f32_view(c->k, 2, sk),
           tv = bxt_f32_view(c->v, 2, sk), to = bxt_f32_view(o, 2, sq),
           ts = bxt_f32_view(stats, 3, ss);
  bx_attention_opts opts = BX_ATTENTION_OPTS_DEFAULT;
  opts.num_threads = 1 + (int)bxt_below(r, 4);
  CHECK_STATUS(bx_attention_forward(&tq, &tk, &tv, (int64_t)c->L, (int64_t)c->Hq,
                                    (int64_t)c->Hkv, (int64_t)c->D, &to, &ts, &opts),
               BX_OK, "attention forward");
}

static bx_tg_attn attn_args(const attn_case *c) {
  bx_tg_attn a;
  memset(&a, 0, sizeof a);
  a.q = c->q, a.k = c->k, a.v = c->v, a.dout = c->dout;
  a.T = c->T, a.L = c->L, a.Hq = c->Hq, a.Hkv = c->Hkv, a.D = c->D;
  a.scale = bx_rsqrtf_det((float)c->D); /* the CPU's scale (attention.c bx_attn_check) */
  return a;
}

void test_train_cuda_sim_attention_fwd(void) {
  bxt_rng r;
  bxt_rng_init(&r);
  for (int it = 0; it < 150 && !bxt_failures(); it++) {
    attn_case c;
    attn_case_make(&r, &c);
    size_t ns = c.T * c.Hq * 2;
    float *o_cpu = attn_garbage(c.nq), *st_cpu = attn_garbage(ns);
    float *o_sim = attn_garbage(c.nq), *st_sim = attn_garbage(ns);
    attn_cpu_fwd(&r, &c, o_cpu, st_cpu);
    bx_tg_attn a = attn_args(&c);
    a.o = o_sim, a.stats = st_sim;
    sim_grid(&r, c.T * c.Hq, body_attn_fwd, &a);
    CHECK_SAME(o_sim, o_cpu, c.nq, "attention forward o B %zu L %zu Hq %zu Hkv %zu D %zu mode %d",
               c.B, c.L, c.Hq, c.Hkv, c.D, c.mode);
    CHECK_SAME(st_sim, st_cpu, ns, "attention forward stats B %zu L %zu Hq %zu Hkv %zu D %zu "
               "mode %d", c.B, c.L, c.Hq, c.Hkv, c.D, c.mode);
    free(o_cpu), free(st_cpu), free(o_sim), free(st_sim);
    attn_case_free(&c);
  }
}

void test_train_cuda_sim_attention_bwd(void) {
  bxt_rng r;
  bxt_rng_init(&r);
  for (int it = 0; it < 150 && !bxt_failures(); it++) {
    attn_case c;
    attn_case_make(&r, &c);
    size_t ns = c.T * c.Hq * 2;
    float *o = attn_garbage(c.nq), *stats = attn_garbage(ns);
    attn_cpu_fwd(&r, &c, o, stats);
    /* now and then stats not from the forward: any (m, l) is an input */
    if (bxt_below(&r, 6) == 0)
      for (size_t i = 0; i < ns; i++) stats[i] = bxt_below(&r, 2) ? sim_value(&r) : stats[i];
    float *dq_cpu = attn_garbage(c.nq), *dk_cpu = attn_garbage(c.nk), *dv_cpu = attn_garbage(c.nk);
    float *dq_sim = attn_garbage(c.nq), *dk_sim = attn_garbage(c.nk), *dv_sim = attn_garbage(c.nk);
    int64_t sq[2] = {(int64_t)c.T, (int64_t)(c.Hq * c.D)},
            sk[2] = {(int64_t)c.T, (int64_t)(c.Hkv * c.D)},
            ss[3] = {(int64_t)c.T, (int64_t)c.Hq, 2};
    DLTensor tdo = bxt_f32_view(c.dout, 2, sq), tq = bxt_f32_view(c.q, 2, sq),
             tk = bxt_f32_view(c.k, 2, sk), tv = bxt_f32_view(c.v, 2, sk),
             ts = bxt_f32_view(stats, 3, ss), tdq = bxt_f32_view(dq_cpu, 2, sq),
             tdk = bxt_f32_view(dk_cpu, 2, sk), tdv = bxt_f32_view(dv_cpu, 2, sk);
    bx_attention_opts opts = BX_ATTENTION_OPTS_DEFAULT;
    opts.num_threads = 1 + (int)bxt_below(&r, 4);
    CHECK_STATUS(bx_attention_backward(&tdo, &tq, &tk, &tv, &ts, (int64_t)c.L, (int64_t)c.Hq,
                                       (int64_t)c.Hkv, (int64_t)c.D, &tdq, &tdk, &tdv, &opts),
                 BX_OK, "attention backward");
    bx_tg_attn a = attn_args(&c);
    a.stats_in = stats, a.dq = dq_sim, a.dk = dk_sim, a.dv = dv_sim;
    sim_grid(&r, c.T * c.Hq, body_attn_delta, &a); /* the launcher's order of kernels */
    sim_grid(&r, c.T * c.Hkv, body_attn_dkdv, &a);
    sim_grid(&r, c.T * c.Hq, body_attn_dq, &a);
    CHECK_SAME(dq_sim, dq_cpu, c.nq, "attention backward dq B %zu L %zu Hq %zu Hkv %zu D %zu "
               "mode %d", c.B, c.L, c.Hq, c.Hkv, c.D, c.mode);
    CHECK_SAME(dk_sim, dk_cpu, c.nk, "attention backward dk B %zu L %zu Hq %zu Hkv %zu D %zu "
               "mode %d", c.B, c.L, c.Hq, c.Hkv, c.D, c.mode);
    CHECK_SAME(dv_sim, dv_cpu, c.nk, "attention backward dv B %zu L %zu Hq %zu Hkv %zu D %zu "
               "mode %d", c.B, c.L, c.Hq, c.Hkv, c.D, c.mode);
    free(o), free(stats), free(dq_cpu), free(dk_cpu), free(dv_cpu), free(dq_sim), free(dk_sim),
        free(dv_sim);
    attn_case_free(&c);
  }
}

/* Every tensor kDLCUDA: attention's device path (no GPU here: BX_EDEVICE
 * from the launch, or "no CUDA backend" without one), nothing written. */
void test_train_cuda_sim_attention_dispatch(void) {
  if (bx_cuda_available() == BX_OK) {
    bxt_skip("a GPU is present: fake device tensors would be dereferenced (tests/cuda runs there)");
    return;
  }
  float q[8] = {1, 2, 3, 4, 5, 6, 7, 8}, o[8] = {7, 7, 7, 7, 7, 7, 7, 7},
        st[8] = {7, 7, 7, 7, 7, 7, 7, 7};
  int64_t sh[2] = {4, 2}, ss[3] = {4, 1, 2};
  DLTensor tq = bxt_f32_view(q, 2, sh), tk = tq, tv = tq, to = bxt_f32_view(o, 2, sh),
           ts = bxt_f32_view(st, 3, ss);
  tq.device.device_type = tk.device.device_type = tv.device.device_type = kDLCUDA;
  to.device.device_type = ts.device.device_type = kDLCUDA;
  CHECK_STATUS(bx_attention_forward(&tq, &tk, &tv, 2, 1, 1, 2, &to, &ts, NULL), BX_EDEVICE,
               "all-CUDA attention forward");
  const char *m = bx_last_error();
  CHECK(strstr(m, "bx_attention_forward") && (strstr(m, "no CUDA backend") || strstr(m, "kernel")),
        "the device path's error names the call: %s", m);
  CHECK(o[0] == 7.0f && o[7] == 7.0f && st[0] == 7.0f, "nothing written");
  float dq[8] = {7, 7, 7, 7, 7, 7, 7, 7};
  DLTensor tdq = bxt_f32_view(dq, 2, sh), tdk = tdq, tdv = tdq;
  tdq.device.device_type = tdk.device.device_type = tdv.device.device_type = kDLCUDA;
  /* dq, dk, dv the same bytes: the overlap check comes first, as on the host */
  CHECK_STATUS(bx_attention_backward(&tq, &tq, &tk, &tv, &ts, 2, 1, 1, 2, &tdq, &tdk, &tdv, NULL),
               BX_ELAYOUT, "all-CUDA attention backward, overlapping outputs");
  float dk[8] = {0}, dv[8] = {0};
  tdk.data = dk, tdv.data = dv;
  CHECK_STATUS(bx_attention_backward(&tq, &tq, &tk, &tv, &ts, 2, 1, 1, 2, &tdq, &tdk, &tdv, NULL),
               BX_EDEVICE, "all-CUDA attention backward");
  CHECK(strstr(bx_last_error(), "bx_attention_backward"), "names the call: %s", bx_last_error());
  CHECK(dq[0] == 7.0f && dq[7] == 7.0f, "nothing written");
  tk.device.device_type = kDLCPU; /* mixed: the host path's message */
  CHECK_STATUS(bx_attention_forward(&tq, &tk, &tv, 2, 1, 1, 2, &to, &ts, NULL), BX_EDEVICE,
               "mixed attention forward");
  CHECK(strstr(bx_last_error(), "tensor 0 (q) is on device"), "names tensor 0: %s",
        bx_last_error());
}
