/*
 * test_train_cuda_sim_math.c — the last training entries' CUDA
 * decomposition, run on the CPU (issue 30, S2): src/cuda/train/grid_math.h
 * holds math.cu's thread bodies (the elementwise math and bx_round_bf16:
 * one thread per element; bx_rope_cos_sin: one per (token, slot);
 * bx_bias_grad_partials: one per (chunk, column)). Each runs on a
 * simulated grid (blocks and threads shuffled, tests/train_cuda_sim.h) and
 * must equal the public CPU entry's output on the same bytes, bit for bit,
 * over random shapes and values with every kind of special (a NaN bias
 * partial is the canonical NaN on both sides).
 */
#include <stdlib.h>
#include <string.h>

#include "bitexact_train.h"
#include "dl_view.h"
#include "grid_math.h"
#include "harness.h"
#include "tests.h"
#include "train_cuda_sim.h"

static void body_math(const void *c, uint64_t i) { bx_tgm_math_elem(c, i); }
static void body_rope_table(const void *c, uint64_t i) { bx_tgm_rope_table_item(c, i); }

typedef struct bias_ctx {
  bx_tgt_wgrad w;
  float *out;
} bias_ctx;

static void body_bias(const void *c, uint64_t i) {
  const bias_ctx *b = c;
  bx_tgm_bias_item(&b->w, b->out, i);
}

typedef bx_status (*math_entry)(const DLTensor *, DLTensor *, const bx_math_opts *);

/* Every op of the math member against its public entry: random lengths
 * (one element to several blocks), every special value, in place half the
 * time (fp32 ops); bx_round_bf16 into bf16. */
void test_train_cuda_sim_math(void) {
  static const math_entry entries[7] = {bx_exp, bx_log, bx_sigmoid, bx_silu,
                                        bx_rsqrt, bx_sin, bx_cos};
  static const int ops[7] = {BX_TDEV_EXP, BX_TDEV_LOG, BX_TDEV_SIGMOID, BX_TDEV_SILU,
                             BX_TDEV_RSQRT, BX_TDEV_SIN, BX_TDEV_COS};
  bxt_rng r;
  bxt_rng_init(&r);
  for (int it = 0; it < 64 && !bxt_failures(); it++) {
    int k = it % 8; /* 7: bx_round_bf16 */
    size_t n = bxt_below(&r, 4) ? 1 + bxt_below(&r, 600) : 1 + bxt_below(&r, 40000);
    float *x = sim_fill(&r, n, 1);
    if (it % 16 == 3) /* large arguments: the trig domain's edge, overflow, underflow */
      for (size_t i = 0; i < n; i++)
        x[i] = bx_f32_from_bits((uint32_t)bxt_below(&r, 1ull << 32));
    int64_t shape[1] = {(int64_t)n};
    bx_math_opts o = BX_MATH_OPTS_DEFAULT;
    o.num_threads = (int)bxt_below(&r, 4);
    if (k == 7) {
      uint16_t *y_cpu = malloc(n * 2), *y_sim = malloc(n * 2);
      memset(y_sim, 0xA5, n * 2);
      DLTensor tx = bxt_f32_view(x, 1, shape), ty = bxt_view(y_cpu, kDLBfloat, 16, 1, shape);
      CHECK_STATUS(bx_round_bf16(&tx, &ty, &o), BX_OK, "bx_round_bf16 n %zu", n);
      bx_tgm_math a = {x, y_sim, n, BX_TDEV_ROUND_BF16};
      sim_grid(&r, n, body_math, &a);
      size_t d = 0;
      while (d < n && y_cpu[d] == y_sim[d]) d++;
      CHECK(d == n, "round_bf16 n %zu: element %zu (x 0x%08x): sim 0x%04x, CPU 0x%04x", n, d,
            d < n ? bx_f32_bits(x[d]) : 0u, d < n ? y_sim[d] : 0u, d < n ? y_cpu[d] : 0u);
      free(y_cpu), free(y_sim);
    } else {
      int inplace = (int)bxt_below(&r, 2);
      float *x_cpu = sim_copy(x, n), *x_sim = sim_copy(x, n);
      float *y_cpu = inplace ? x_cpu : malloc(n * 4), *y_sim = inplace ? x_sim : malloc(n * 4);
      if (!inplace) memset(y_sim, 0xA5, n * 4);
      DLTensor tx = bxt_f32_view(x_cpu, 1, shape), ty = bxt_f32_view(y_cpu, 1, shape);
      CHECK_STATUS(entries[k](&tx, &ty, &o), BX_OK, "math op %d n %zu", k, n);
      bx_tgm_math a = {x_sim, y_sim, n, ops[k]};
      sim_grid(&r, n, body_math, &a);
      CHECK_SAME(y_sim, y_cpu, n, "math op %d n %zu in place %d", k, n, inplace);
      free(x_cpu), free(x_sim);
      if (!inplace) free(y_cpu), free(y_sim);
    }
    free(x);
  }
}

/* bx_rope_cos_sin's table against the grid: random token counts, rotary
 * dims, bases, positions up to 2^24. */
void test_train_cuda_sim_rope_table(void) {
  bxt_rng r;
  bxt_rng_init(&r);
  for (int it = 0; it < 30 && !bxt_failures(); it++) {
    size_t tokens = 1 + bxt_below(&r, 40), half = 1 + bxt_below(&r, 70), n = tokens * half;
    double theta = it % 3 == 0 ? 10000.0 : it % 3 == 1 ? 1e6 : 1.0 + (double)bxt_below(&r, 500000);
    int64_t *pos = malloc(tokens * sizeof *pos);
    for (size_t t = 0; t < tokens; t++)
      pos[t] = bxt_below(&r, 4) ? (int64_t)bxt_below(&r, 5000) : (int64_t)1 << 24;
    float *c_cpu = malloc(n * 4), *s_cpu = malloc(n * 4), *c_sim = malloc(n * 4),
          *s_sim = malloc(n * 4);
    memset(c_sim, 0xA5, n * 4);
    memset(s_sim, 0xA5, n * 4);
    int64_t sp[1] = {(int64_t)tokens}, s2[2] = {(int64_t)tokens, (int64_t)half};
    DLTensor tp = bxt_view(pos, kDLInt, 64, 1, sp), tc = bxt_f32_view(c_cpu, 2, s2),
             ts = bxt_f32_view(s_cpu, 2, s2);
    CHECK_STATUS(bx_rope_cos_sin(&tp, (int64_t)(2 * half), theta, &tc, &ts, NULL), BX_OK,
                 "bx_rope_cos_sin");
    bx_tgm_rope_table a = {pos, c_sim, s_sim, tokens, half, 2 * (uint64_t)half, (float)theta};
    sim_grid(&r, n, body_rope_table, &a);
    CHECK_SAME(c_sim, c_cpu, n, "rope cos tokens %zu half %zu theta %g", tokens, half, theta);
    CHECK_SAME(s_sim, s_cpu, n, "rope sin tokens %zu half %zu theta %g", tokens, half, theta);
    free(pos), free(c_cpu), free(s_cpu), free(c_sim), free(s_sim);
  }
}

/* bx_bias_grad_partials against the grid: fp32 and bf16 dy, random rows,
 * columns and chunk sizes (one chunk, a short last chunk, chunks of 1). */
void test_train_cuda_sim_bias_partials(void) {
  bxt_rng r;
  bxt_rng_init(&r);
  for (int it = 0; it < 40 && !bxt_failures(); it++) {
    size_t t = 1 + bxt_below(&r, 90), n = 1 + bxt_below(&r, 1500), C = 1 + bxt_below(&r, 40);
    if (it % 7 == 1) C = 1;
    if (it % 7 == 2) C = t + bxt_below(&r, 5);
    size_t nch = (t + C - 1) / C;
    int bf16 = (int)bxt_below(&r, 2), specials = it % 3 == 0;
    float *v = sim_fill(&r, t * n, specials);
    void *dy = v;
    uint16_t *h = NULL;
    if (bf16) {
      h = malloc(t * n * 2);
      for (size_t i = 0; i < t * n; i++) h[i] = (uint16_t)(bx_f32_bits(v[i]) >> 16);
      dy = h;
    }
    float *p_cpu = malloc(nch * n * 4), *p_sim = malloc(nch * n * 4);
    memset(p_sim, 0xA5, nch * n * 4);
    int64_t sd[2] = {(int64_t)t, (int64_t)n}, sp[2] = {(int64_t)nch, (int64_t)n};
    DLTensor tdy = bf16 ? bxt_view(dy, kDLBfloat, 16, 2, sd) : bxt_f32_view(dy, 2, sd),
             tp = bxt_f32_view(p_cpu, 2, sp);
    bx_wgrad_opts o = BX_WGRAD_OPTS_DEFAULT;
    o.num_threads = (int)bxt_below(&r, 4);
    CHECK_STATUS(bx_bias_grad_partials(&tdy, (int64_t)C, &tp, &o), BX_OK, "bias partials");
    bias_ctx b;
    memset(&b, 0, sizeof b);
    b.w.dy = dy;
    b.w.dy_bf16 = bf16;
    b.w.t = t;
    b.w.n = n;
    b.w.chunk = C;
    b.w.nchunks = nch;
    b.out = p_sim;
    sim_grid(&r, nch * n, body_bias, &b);
    CHECK_SAME(p_sim, p_cpu, nch * n, "bias partials t %zu n %zu chunk %zu bf16 %d", t, n, C,
               bf16);
    free(v), free(h), free(p_cpu), free(p_sim);
  }
}
