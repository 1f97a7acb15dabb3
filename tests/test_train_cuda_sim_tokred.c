/*
 * test_train_cuda_sim_tokred.c — the token reduction's CUDA decomposition
 * (src/cuda/train/tokred.cu, grid_tokred.h's thread bodies), run on the
 * CPU (issue 30, S2).
 *
 * A simulated grid runs the bodies with blocks and threads in a shuffled
 * order (the weight kernel phase by phase between its __syncthreads(),
 * shared memory never cleared, a random number of chunk groups), and every
 * atomic (atomicAdd of the q words, atomicMax of the largest |bits|,
 * atomicAdd of the non-finite counts, atomicMin of the first breaking
 * element or chunk) is logged and applied in a shuffled order. The
 * launcher's host side (tokred.c's add_cuda, wgrad.c's bound_cuda and
 * wgrad_cuda: the words added to the state's, the exponents from the
 * maxima) is replayed here, and the result must equal the public CPU
 * entries' on the same bytes, bit for bit: the state's words (grid words
 * and non-finite counts), the grid exponent and observed exponent, the
 * finished sums, and on a breaking element the CPU's error (its chunk and
 * element) with the state unchanged. Shapes are random (edge tiles, chunks
 * shorter than a tile and longer than a k tile, a short last chunk), the
 * values ordinary or with every special (+-0, subnormals, +-Inf, NaN),
 * fp32 and bf16 operands.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bitexact_train.h"
#include "dl_view.h"
#include "grid_tokred.h"
#include "harness.h"
#include "tests.h"
#include "tokred_grid.h"
#include "train_cuda_sim.h"

/* ---- the atomics, logged and applied in a shuffled order ------------------------------- */

enum { OP_ADD64, OP_MAX32, OP_MIN64 };

typedef struct sim_op {
  int kind;
  void *p;
  uint64_t v;
} sim_op;

typedef struct sim_ops {
  sim_op *v;
  size_t n, cap;
} sim_ops;

static void ops_push(sim_ops *o, int kind, void *p, uint64_t v) {
  if (o->n == o->cap) {
    o->cap = o->cap ? 2 * o->cap : 256;
    o->v = realloc(o->v, o->cap * sizeof *o->v);
  }
  o->v[o->n++] = (sim_op){kind, p, v};
}

static void ops_apply(bxt_rng *r, sim_ops *o) {
  for (size_t i = o->n; i > 1; i--) { /* shuffled */
    size_t j = (size_t)bxt_below(r, i);
    sim_op t = o->v[i - 1];
    o->v[i - 1] = o->v[j];
    o->v[j] = t;
  }
  for (size_t i = 0; i < o->n; i++) {
    sim_op *p = &o->v[i];
    if (p->kind == OP_ADD64) *(uint64_t *)p->p += p->v; /* modulo 2^64 */
    else if (p->kind == OP_MAX32) {
      uint32_t *m = p->p;
      if ((uint32_t)p->v > *m) *m = (uint32_t)p->v;
    } else {
      uint64_t *m = p->p;
      if (p->v < *m) *m = p->v;
    }
  }
  o->n = 0;
}

/* The device's result words (tokred.cu's tk_res): maxima and counts 0,
 * firsts all ones before a launch. */
typedef struct sim_res {
  uint32_t mx_w, mx_b;
  uint64_t nf_w, nf_b, bad_w, bad_b;
} sim_res;

static void res_clear(sim_res *r) {
  memset(r, 0, sizeof *r);
  r->bad_w = r->bad_b = UINT64_MAX;
}

/* A thread's end: its max, count and first as atomics (as the kernels). */
static void push_acc(sim_ops *o, const bx_tgt_acc *s, uint32_t *mx, uint64_t *nf, uint64_t *bad) {
  if (s->mx) ops_push(o, OP_MAX32, mx, s->mx);
  if (s->nf) ops_push(o, OP_ADD64, nf, (uint64_t)s->nf);
  if (s->bad != UINT64_MAX) ops_push(o, OP_MIN64, bad, s->bad);
}

/* ---- the kernels on the simulated grid ------------------------------------------------------ */

/* bx_cut_tokred_maxabs_kernel: grid (gx, gy) (random: any gives the same
 * maxima), blocks and threads shuffled; mx[0..nchunks) zeroed here. */
static void sim_maxabs(bxt_rng *r, const bx_tgt_maxabs *m, sim_ops *ops) {
  memset(m->mx, 0, m->nchunks * sizeof *m->mx);
  uint32_t gx = 1 + (uint32_t)bxt_below(r, m->nchunks < 6 ? m->nchunks : 6);
  uint32_t gy = 1 + (uint32_t)bxt_below(r, 3), nb = gx * gy, bo[18], to[BX_TG_BLOCK];
  shuffle_u32(r, bo, nb);
  for (uint32_t b = 0; b < nb; b++) {
    uint32_t bx = bo[b] % gx, by = bo[b] / gx;
    shuffle_u32(r, to, BX_TG_BLOCK);
    for (uint32_t t = 0; t < BX_TG_BLOCK; t++)
      for (uint64_t c = bx; c < m->nchunks; c += gx) {
        uint32_t mx = bx_tgt_maxabs_thread(m, c, by * BX_TG_BLOCK + to[t], gy * BX_TG_BLOCK);
        if (mx) ops_push(ops, OP_MAX32, &m->mx[c], mx);
      }
  }
  ops_apply(r, ops);
}

/* bx_cut_tokred_grid_kernel: a grid-stride kernel (sim_grid's grid), each
 * thread's q stores and its atomics. */
static void sim_grid_add(bxt_rng *r, const bx_tgt_grid *g, sim_res *res, sim_ops *ops) {
  res_clear(res);
  uint32_t blocks = bx_tg_blocks(g->n);
  if (bxt_below(r, 2)) blocks = 1 + (uint32_t)bxt_below(r, blocks);
  uint32_t *bo = malloc(blocks * sizeof *bo), to[BX_TG_BLOCK];
  shuffle_u32(r, bo, blocks);
  uint64_t stride = (uint64_t)blocks * BX_TG_BLOCK;
  for (uint32_t b = 0; b < blocks; b++) {
    shuffle_u32(r, to, BX_TG_BLOCK);
    for (uint32_t t = 0; t < BX_TG_BLOCK; t++) {
      bx_tgt_acc s;
      bx_tgt_acc_init(&s);
      bx_tgt_grid_thread(g, (uint64_t)bo[b] * BX_TG_BLOCK + to[t], stride, &s);
      push_acc(ops, &s, &res->mx_w, &res->nf_w, &res->bad_w);
    }
  }
  free(bo);
  ops_apply(r, ops);
}

/* bx_cut_tokred_wgrad_kernel: blocks (row tile, column tile, chunk group)
 * shuffled; in each block, per chunk, the GEMM's phases with the threads
 * shuffled, the epilogue; then every thread's atomics. qw zeroed here. */
static void sim_wgrad_weight(bxt_rng *r, const bx_tgt_wgrad *w, sim_res *res, sim_ops *ops) {
  memset(w->qw, 0, w->n * w->k * sizeof *w->qw);
  uint32_t gx = (uint32_t)((w->n + BX_TG_GEMM_BM - 1) / BX_TG_GEMM_BM);
  uint32_t gy = (uint32_t)((w->k + BX_TG_GEMM_BN - 1) / BX_TG_GEMM_BN);
  uint32_t nb = gx * gy * (uint32_t)w->zgroups, *bo = malloc(nb * sizeof *bo), to[BX_TG_GEMM_THREADS];
  float(*acc)[BX_TG_GEMM_TM * BX_TG_GEMM_TN] = malloc(sizeof(*acc) * BX_TG_GEMM_THREADS);
  bx_tgt_acc *st = malloc(BX_TG_GEMM_THREADS * sizeof *st);
  float As[BX_TG_GEMM_BK * BX_TG_GEMM_BM], Bs[BX_TG_GEMM_BK * BX_TG_GEMM_BN];
  for (size_t i = 0; i < sizeof As / sizeof As[0]; i++) As[i] = Bs[i] = 12345.0f; /* stale */
  shuffle_u32(r, bo, nb);
  for (uint32_t b = 0; b < nb; b++) {
    uint64_t bm = bo[b] % gx, bn = bo[b] / gx % gy, z = bo[b] / gx / gy;
    for (uint32_t t = 0; t < BX_TG_GEMM_THREADS; t++) bx_tgt_acc_init(&st[t]);
    for (uint64_t c = z; c < w->nchunks; c += w->zgroups) {
      bx_tg_gemm g = bx_tgt_wgrad_gemm(w, c);
      shuffle_u32(r, to, BX_TG_GEMM_THREADS);
      for (uint32_t t = 0; t < BX_TG_GEMM_THREADS; t++) bx_tg_gemm_init(&g, bm, bn, to[t], acc[to[t]]);
      for (uint64_t k0 = 0; k0 < g.k; k0 += BX_TG_GEMM_BK) {
        shuffle_u32(r, to, BX_TG_GEMM_THREADS);
        for (uint32_t t = 0; t < BX_TG_GEMM_THREADS; t++) bx_tg_gemm_load(&g, bm, bn, k0, to[t], As, Bs);
        shuffle_u32(r, to, BX_TG_GEMM_THREADS);
        for (uint32_t t = 0; t < BX_TG_GEMM_THREADS; t++)
          bx_tg_gemm_compute(&g, k0, to[t], As, Bs, acc[to[t]]);
      }
      shuffle_u32(r, to, BX_TG_GEMM_THREADS);
      for (uint32_t t = 0; t < BX_TG_GEMM_THREADS; t++)
        bx_tgt_wgrad_epi(w, &g, c, bm, bn, to[t], acc[to[t]], &st[to[t]]);
    }
    shuffle_u32(r, to, BX_TG_GEMM_THREADS);
    for (uint32_t t = 0; t < BX_TG_GEMM_THREADS; t++) {
      const bx_tgt_acc *s = &st[to[t]];
      for (uint32_t o = 0; o < BX_TG_GEMM_TM * BX_TG_GEMM_TN; o++) {
        uint64_t at = bx_tgt_wgrad_out(w, bm, bn, to[t], o);
        if (at != UINT64_MAX && s->q[o] != 0) ops_push(ops, OP_ADD64, &w->qw[at], (uint64_t)s->q[o]);
      }
      push_acc(ops, s, &res->mx_w, &res->nf_w, &res->bad_w);
    }
  }
  free(bo), free(acc), free(st);
  ops_apply(r, ops);
}

/* bx_cut_tokred_bias_kernel: a grid-stride kernel over zgroups * n items,
 * each thread's words and atomics. qb zeroed here. */
static void sim_wgrad_bias(bxt_rng *r, const bx_tgt_wgrad *w, sim_res *res, sim_ops *ops) {
  memset(w->qb, 0, w->n * sizeof *w->qb);
  uint64_t items = w->zgroups * w->n;
  uint32_t blocks = bx_tg_blocks(items);
  if (bxt_below(r, 2)) blocks = 1 + (uint32_t)bxt_below(r, blocks);
  uint32_t *bo = malloc(blocks * sizeof *bo), to[BX_TG_BLOCK];
  shuffle_u32(r, bo, blocks);
  uint64_t stride = (uint64_t)blocks * BX_TG_BLOCK;
  for (uint32_t b = 0; b < blocks; b++) {
    shuffle_u32(r, to, BX_TG_BLOCK);
    for (uint32_t t = 0; t < BX_TG_BLOCK; t++) {
      bx_tgt_acc s;
      bx_tgt_acc_init(&s);
      for (uint64_t i = (uint64_t)bo[b] * BX_TG_BLOCK + to[t]; i < items; i += stride) {
        int64_t q;
        bx_tgt_bias_item(w, i, &q, &s);
        if (q != 0) ops_push(ops, OP_ADD64, &w->qb[i % w->n], (uint64_t)q);
      }
      push_acc(ops, &s, &res->mx_b, &res->nf_b, &res->bad_b);
    }
  }
  free(bo);
  ops_apply(r, ops);
}

/* ---- helpers ------------------------------------------------------------------------------- */

/* Finishes words (a state's, coverage forced to 1) with the grid of bound
 * E[t] per tensor through a fresh state: the public finish of those words.
 * Returns the status; out[t] filled on success. */
static bx_status finish_words(const DLTensor *shapes, size_t nt, int64_t C, int64_t total,
                              const int *E, const int64_t *words, size_t nwords,
                              int64_t divisor, DLTensor *out) {
  bx_tokred *f = NULL;
  bx_status st = bx_tokred_create(shapes, nt, C, total, NULL, &f);
  for (size_t t = 0; st == BX_OK && t < nt; t++) st = bx_tokred_bound_exp(f, t, E[t]);
  if (st == BX_OK) st = bx_tokred_agree(f, NULL);
  int64_t *w = NULL;
  size_t n = 0;
  if (st == BX_OK) st = bx_tokred_words(f, &w, &n);
  if (st == BX_OK && n != nwords) st = BX_EINVAL;
  if (st == BX_OK) {
    memcpy(w, words, n * sizeof *w);
    size_t cover = 0;
    for (size_t t = 0; t < nt; t++) {
      size_t e = 1;
      for (int d = 0; d < shapes[t].ndim; d++) e *= (size_t)shapes[t].shape[d];
      cover += e + 1;
    }
    for (size_t i = cover; i < n; i++) w[i] = 1; /* every chunk once */
    st = bx_tokred_finish(f, out, nt, divisor);
  }
  bx_tokred_destroy(f);
  return st;
}

static int agreed_bound(const bx_tokred *s, size_t t, int64_t nchunks) {
  int e = 0;
  bx_tokred_grid_exp(s, t, &e);
  return e + bx_tokred_precision(nchunks);
}

/* ---- the dispatch ------------------------------------------------------------------------------ */

/* Without a GPU (the CI host): a CUDA partial or CUDA operands take the
 * device path, which fails with BX_EDEVICE naming the call (the backend's
 * CUDA error, or "no CUDA backend" in a build without one) and leaves the
 * state unchanged; a mixed wgrad call names its first device tensor. */
static int dispatch_skip(void) {
  if (bx_cuda_available() == BX_OK) {
    bxt_skip("a GPU is present: fake device tensors would be dereferenced (tests/cuda runs there)");
    return 1;
  }
  return 0;
}

static int words_zero(bx_tokred *s) {
  int64_t *w;
  size_t n;
  if (bx_tokred_words(s, &w, &n) != BX_OK) return 0;
  for (size_t i = 0; i < n; i++)
    if (w[i]) return 0;
  return 1;
}

static void tokred_dispatch(void) {
  if (dispatch_skip()) return;
  float p[6] = {1, 2, 3, 4, 5, 6};
  int64_t sh[2] = {2, 3};
  DLTensor g = bxt_f32_view(NULL, 2, sh), tp = bxt_f32_view(p, 2, sh);
  bx_tokred *s = NULL;
  CHECK_STATUS(bx_tokred_create(&g, 1, 1, 2, NULL, &s), BX_OK, "create");
  tp.device.device_type = kDLCUDA;
  CHECK_STATUS(bx_tokred_bound(s, 0, 0, &tp), BX_EDEVICE, "bound of a CUDA partial, no GPU");
  CHECK(strstr(bx_last_error(), "bx_tokred_bound"), "names the call: %s", bx_last_error());
  CHECK_STATUS(bx_tokred_agree(s, NULL), BX_OK, "agree");
  CHECK_STATUS(bx_tokred_add(s, 0, 0, &tp), BX_EDEVICE, "add of a CUDA partial, no GPU");
  CHECK(strstr(bx_last_error(), "bx_tokred_add"), "names the call: %s", bx_last_error());
  CHECK(words_zero(s), "the refused add left the state unchanged");
  tp.device.device_type = kDLOpenCL; /* still refused as before */
  CHECK_STATUS(bx_tokred_add(s, 0, 0, &tp), BX_EDEVICE, "add of an OpenCL partial");
  bx_tokred_destroy(s);
}

static void wgrad_dispatch(void) {
  if (dispatch_skip()) return;
  float dy[6] = {1, 2, 3, 4, 5, 6}, x[4] = {1, 2, 3, 4};
  int64_t sdy[2] = {2, 3}, sx[2] = {2, 2}, sw[2] = {3, 2}, sb[1] = {3};
  DLTensor tdy = bxt_f32_view(dy, 2, sdy), tx = bxt_f32_view(x, 2, sx);
  DLTensor grads[2] = {bxt_f32_view(NULL, 2, sw), bxt_f32_view(NULL, 1, sb)};
  bx_tokred *s = NULL;
  CHECK_STATUS(bx_tokred_create(grads, 2, 1, 2, NULL, &s), BX_OK, "create");
  tdy.device.device_type = tx.device.device_type = kDLCUDA;
  CHECK_STATUS(bx_linear_wgrad_bound(s, 0, 1, &tdy, &tx, 0, NULL), BX_EDEVICE,
               "wgrad_bound on CUDA operands, no GPU");
  CHECK(strstr(bx_last_error(), "bx_linear_wgrad_bound"), "names the call: %s", bx_last_error());
  tx.device.device_type = kDLCPU; /* mixed: the host path names dy */
  CHECK_STATUS(bx_linear_wgrad_bound(s, 0, 1, &tdy, &tx, 0, NULL), BX_EDEVICE, "mixed operands");
  CHECK(strstr(bx_last_error(), "dy"), "names dy: %s", bx_last_error());
  CHECK_STATUS(bx_tokred_agree(s, NULL), BX_OK, "agree");
  tx.device.device_type = kDLCUDA;
  CHECK_STATUS(bx_linear_wgrad(s, 0, 1, &tdy, &tx, 0, NULL), BX_EDEVICE,
               "wgrad on CUDA operands, no GPU");
  CHECK(strstr(bx_last_error(), "bx_linear_wgrad"), "names the call: %s", bx_last_error());
  CHECK(words_zero(s), "the refused wgrad left the state unchanged");
  tx.device.device_id = 1; /* two devices */
  CHECK_STATUS(bx_linear_wgrad(s, 0, 1, &tdy, &tx, 0, NULL), BX_EDEVICE, "two devices");
  CHECK(strstr(bx_last_error(), "x"), "names x: %s", bx_last_error());
  bx_tokred_destroy(s);
}

/* ---- bx_tokred_bound / bx_tokred_add on a CUDA partial ------------------------------------------ */

void test_train_cuda_sim_tokred(void) {
  bxt_rng r;
  bxt_rng_init(&r);
  sim_ops ops = {0};
  for (int it = 0; it < 60 && !bxt_failures(); it++) {
    int64_t rows = 1 + (int64_t)bxt_below(&r, 12), cols = 1 + (int64_t)bxt_below(&r, it < 10 ? 700 : 90);
    size_t n = (size_t)(rows * cols);
    int64_t C = 1 + (int64_t)bxt_below(&r, 4), nch = 1 + (int64_t)bxt_below(&r, 6);
    int64_t total = (nch - 1) * C + 1 + (int64_t)bxt_below(&r, (uint64_t)C);
    int specials = (int)bxt_below(&r, 2);
    int64_t shape[2] = {rows, cols};
    DLTensor g = bxt_f32_view(NULL, 2, shape);
    float **part = malloc((size_t)nch * sizeof *part);
    for (int64_t c = 0; c < nch; c++) {
      part[c] = sim_fill(&r, n, specials);
      if (bxt_below(&r, 4) == 0) /* a wide range: exponents far apart, subnormal steps */
        for (size_t i = 0; i < n; i++) part[c][i] = ldexpf(part[c][i], (int)bxt_below(&r, 120) - 60);
    }
    /* the CPU */
    bx_tokred *s = NULL;
    CHECK_STATUS(bx_tokred_create(&g, 1, C, total, NULL, &s), BX_OK, "create");
    for (int64_t c = 0; c < nch; c++) {
      DLTensor tp = bxt_f32_view(part[c], 2, shape);
      CHECK_STATUS(bx_tokred_bound(s, 0, c, &tp), BX_OK, "bound");
    }
    CHECK_STATUS(bx_tokred_agree(s, NULL), BX_OK, "agree");
    for (int64_t c = 0; c < nch; c++) {
      DLTensor tp = bxt_f32_view(part[c], 2, shape);
      CHECK_STATUS(bx_tokred_add(s, 0, c, &tp), BX_OK, "add");
    }
    int64_t *cw = NULL;
    size_t nw = 0;
    CHECK_STATUS(bx_tokred_words(s, &cw, &nw), BX_OK, "words");
    /* the device, simulated: the bound (one chunk of one row per partial) */
    int E = BX_TOKRED_EMIN;
    uint32_t mx1;
    for (int64_t c = 0; c < nch; c++) {
      bx_tgt_maxabs m = {part[c], 0, 1, n, 1, 1, &mx1};
      sim_maxabs(&r, &m, &ops);
      int e = bx_tokred_exp_of_abs(mx1);
      E = e > E ? e : E;
    }
    CHECK(E == agreed_bound(s, 0, nch), "tokred bound: sim 2^%d, CPU 2^%d (%lld x %lld)", E,
          agreed_bound(s, 0, nch), (long long)rows, (long long)cols);
    /* the adds: q words back to the host, added there */
    int64_t *w = calloc(nw, sizeof *w), *q = malloc(n * sizeof *q);
    int ge = bx_tokred_grid_exponent(E, nch);
    uint32_t mx_all = 0;
    for (int64_t c = 0; c < nch; c++) {
      bx_tgt_grid gg = {part[c], n, bx_tokred_pow2(-ge), bx_tokred_abs_limit(E), q};
      sim_res res;
      sim_grid_add(&r, &gg, &res, &ops);
      CHECK(res.bad_w == UINT64_MAX, "tokred add: chunk %lld breaks its own bound at %llu",
            (long long)c, (unsigned long long)res.bad_w);
      for (size_t i = 0; i < n; i++) w[i] = (int64_t)((uint64_t)w[i] + (uint64_t)q[i]);
      w[n] += (int64_t)res.nf_w;
      w[n + 1 + (size_t)c] += 1;
      mx_all = res.mx_w > mx_all ? res.mx_w : mx_all;
    }
    size_t d = 0;
    while (d < nw && w[d] == cw[d]) d++;
    CHECK(d == nw, "tokred words %lld x %lld, %lld chunks: word %zu: sim %lld, CPU %lld",
          (long long)rows, (long long)cols, (long long)nch, d, (long long)(d < nw ? w[d] : 0),
          (long long)(d < nw ? cw[d] : 0));
    int obs = 0;
    bx_tokred_observed(s, 0, &obs, NULL);
    CHECK(obs == bx_tokred_exp_of_abs(mx_all), "tokred observed: sim 2^%d, CPU 2^%d",
          bx_tokred_exp_of_abs(mx_all), obs);
    /* finished: the CPU state's and the sim's words through the same finish */
    float *o1 = malloc(n * sizeof *o1), *o2 = malloc(n * sizeof *o2);
    DLTensor to1 = bxt_f32_view(o1, 2, shape), to2 = bxt_f32_view(o2, 2, shape);
    int64_t div = bxt_below(&r, 2) ? 1 : 1 + (int64_t)bxt_below(&r, 1000);
    bx_status st1 = finish_words(&g, 1, C, total, &E, cw, nw, div, &to1);
    bx_status st2 = finish_words(&g, 1, C, total, &E, w, nw, div, &to2);
    CHECK(st1 == st2, "tokred finish: sim %s, CPU %s", bx_status_str(st2), bx_status_str(st1));
    if (st1 == BX_OK) CHECK_SAME(o2, o1, n, "tokred finish %lld x %lld divisor %lld", (long long)rows,
                                 (long long)cols, (long long)div);
    /* a stated bound one below a partial's largest element: the CPU refuses
     * naming the first breaking element, the state unchanged; the device's
     * first (atomicMin) must be that element */
    for (int64_t c = 0; c < nch && mx_all; c++) {
      bx_tokred *s2 = NULL;
      CHECK_STATUS(bx_tokred_create(&g, 1, C, total, NULL, &s2), BX_OK, "create");
      int Eb = bx_tokred_exp_of_abs(mx_all) - 1 - (int)bxt_below(&r, 8); /* many elements break */
      if (Eb < BX_TOKRED_EMIN) Eb = BX_TOKRED_EMIN;
      CHECK_STATUS(bx_tokred_bound_exp(s2, 0, Eb), BX_OK, "bound_exp");
      CHECK_STATUS(bx_tokred_agree(s2, NULL), BX_OK, "agree");
      DLTensor tp = bxt_f32_view(part[c], 2, shape);
      bx_status st = bx_tokred_add(s2, 0, c, &tp);
      bx_tgt_grid gg = {part[c], n, bx_tokred_pow2(-bx_tokred_grid_exponent(Eb, nch)),
                        bx_tokred_abs_limit(Eb), q};
      sim_res res;
      sim_grid_add(&r, &gg, &res, &ops);
      int breaks = res.mx_w >= bx_tokred_abs_limit(Eb);
      CHECK(st == (breaks ? BX_EINVAL : BX_OK), "tokred stated bound: CPU %s, sim breaks %d",
            bx_status_str(st), breaks);
      if (breaks) {
        char want[96];
        snprintf(want, sizeof want, "tensor 0, chunk %lld, element %llu:", (long long)c,
                 (unsigned long long)res.bad_w);
        CHECK(strstr(bx_last_error(), want), "tokred stated bound: the CPU names %s; sim: %s",
              bx_last_error(), want);
        int64_t *w2;
        size_t n2;
        bx_tokred_words(s2, &w2, &n2);
        size_t nz = 0;
        while (nz < n2 && w2[nz] == 0) nz++;
        CHECK(nz == n2, "tokred stated bound: the refused add left word %zu", nz);
      }
      bx_tokred_destroy(s2);
    }
    for (int64_t c = 0; c < nch; c++) free(part[c]);
    free(part), free(w), free(q), free(o1), free(o2);
    bx_tokred_destroy(s);
  }
  free(ops.v);
  tokred_dispatch();
}

/* ---- bx_linear_wgrad(_bound) on CUDA operands -------------------------------------------------- */

static void *operand(bxt_rng *r, size_t n, int bf16, int specials) {
  if (!bf16) return sim_fill(r, n, specials);
  uint16_t *h = malloc((n ? n : 1) * 2);
  for (size_t i = 0; i < n; i++)
    h[i] = (uint16_t)(bx_f32_bits(specials ? sim_value(r) : sim_plain(r)) >> 16);
  return h;
}

void test_train_cuda_sim_wgrad(void) {
  bxt_rng r;
  bxt_rng_init(&r);
  sim_ops ops = {0};
  for (int it = 0; it < 40 && !bxt_failures(); it++) {
    size_t T = 1 + bxt_below(&r, it < 6 ? 90 : 30), N = 1 + bxt_below(&r, it % 5 ? 40 : 140);
    size_t K = 1 + bxt_below(&r, it % 7 ? 40 : 100), C = 1 + bxt_below(&r, it % 3 ? 7 : 40);
    int dbf = (int)bxt_below(&r, 2), xbf = (int)bxt_below(&r, 2), specials = bxt_below(&r, 3) == 0;
    int with_w = bxt_below(&r, 5) != 0, with_b = !with_w || bxt_below(&r, 3) != 0;
    int64_t tb = (int64_t)(C * bxt_below(&r, 3));
    int64_t total = tb + (int64_t)T + (T % C ? 0 : (int64_t)(C * bxt_below(&r, 2)));
    int64_t nchunks = (total + (int64_t)C - 1) / (int64_t)C, cb = tb / (int64_t)C;
    size_t nch = (T + C - 1) / C, nk = N * K;
    void *dy = operand(&r, T * N, dbf, specials), *x = operand(&r, T * K, xbf, specials);
    int64_t sdy[2] = {(int64_t)T, (int64_t)N}, sx[2] = {(int64_t)T, (int64_t)K};
    int64_t sw[2] = {(int64_t)N, (int64_t)K}, sb[1] = {(int64_t)N};
    DLTensor tdy = dbf ? bxt_view(dy, kDLBfloat, 16, 2, sdy) : bxt_f32_view(dy, 2, sdy);
    DLTensor tx = xbf ? bxt_view(x, kDLBfloat, 16, 2, sx) : bxt_f32_view(x, 2, sx);
    DLTensor grads[2] = {bxt_f32_view(NULL, 2, sw), bxt_f32_view(NULL, 1, sb)};
    size_t wt = with_w ? 0 : BX_WGRAD_NONE, bt = with_b ? 1 : BX_WGRAD_NONE;
    /* the CPU */
    bx_tokred *s = NULL;
    CHECK_STATUS(bx_tokred_create(grads, 2, (int64_t)C, total, NULL, &s), BX_OK, "create");
    CHECK_STATUS(bx_linear_wgrad_bound(s, wt, bt, &tdy, with_w ? &tx : NULL, tb, NULL), BX_OK,
                 "wgrad_bound");
    CHECK_STATUS(bx_tokred_agree(s, NULL), BX_OK, "agree");
    CHECK_STATUS(bx_linear_wgrad(s, wt, bt, &tdy, with_w ? &tx : NULL, tb, NULL), BX_OK, "wgrad");
    int64_t *cw = NULL;
    size_t nw = 0;
    CHECK_STATUS(bx_tokred_words(s, &cw, &nw), BX_OK, "words");
    /* the device, simulated: the bound from the chunks' maxima (bound_cuda) */
    uint32_t *mdy = calloc(nch, 4), *mxx = calloc(nch, 4);
    bx_tgt_maxabs m1 = {dy, dbf, T, N, C, nch, mdy}, m2 = {x, xbf, T, K, C, nch, mxx};
    sim_maxabs(&r, &m1, &ops);
    if (with_w) sim_maxabs(&r, &m2, &ops);
    int E[2] = {BX_TOKRED_EMIN, BX_TOKRED_EMIN};
    for (size_t c = 0; c < nch; c++) {
      int64_t rows = (int64_t)(T - c * C < C ? T - c * C : C);
      float ma = bx_f32_from_bits(mdy[c]), mb = bx_f32_from_bits(mxx[c]);
      int e = with_w ? bx_wgrad_bound_exp(rows, ma, mb) : BX_TOKRED_EMIN;
      E[0] = e > E[0] ? e : E[0];
      e = with_b ? bx_wgrad_bound_exp(rows, ma, 1.0f) : BX_TOKRED_EMIN;
      E[1] = e > E[1] ? e : E[1];
    }
    for (int t = 0; t < 2; t++)
      CHECK(E[t] == agreed_bound(s, (size_t)t, nchunks), "wgrad bound of tensor %d: sim 2^%d, CPU 2^%d",
            t, E[t], agreed_bound(s, (size_t)t, nchunks));
    /* the partials (wgrad_cuda): the weight and bias kernels, the words added on the host */
    int64_t *qw = malloc((nk ? nk : 1) * 8), *qb = malloc(N * 8);
    bx_tgt_wgrad w = {dy, x, dbf, xbf, T, N, K, C, nch, 1, 0, 0, 0, 0, qw, qb};
    w.inv_w = bx_tokred_pow2(-bx_tokred_grid_exponent(E[0], nchunks));
    w.inv_b = bx_tokred_pow2(-bx_tokred_grid_exponent(E[1], nchunks));
    w.lim_w = bx_tokred_abs_limit(E[0]);
    w.lim_b = bx_tokred_abs_limit(E[1]);
    sim_res res;
    res_clear(&res);
    w.zgroups = 1 + bxt_below(&r, nch);
    if (with_w) sim_wgrad_weight(&r, &w, &res, &ops);
    w.zgroups = 1 + bxt_below(&r, nch);
    if (with_b) sim_wgrad_bias(&r, &w, &res, &ops);
    CHECK(res.bad_w == UINT64_MAX && res.bad_b == UINT64_MAX, "wgrad: a chunk breaks its own "
          "bound (weight %llu, bias %llu)", (unsigned long long)res.bad_w,
          (unsigned long long)res.bad_b);
    int64_t *ww = calloc(nw, sizeof *ww);
    if (with_w) {
      memcpy(ww, qw, nk * 8);
      ww[nk] = (int64_t)res.nf_w;
    }
    if (with_b) {
      memcpy(ww + nk + 1, qb, N * 8);
      ww[nk + 1 + N] = (int64_t)res.nf_b;
    }
    size_t cov = nk + N + 2;
    for (int t = 0; t < 2; t++)
      if (t ? with_b : with_w)
        for (size_t c = 0; c < nch; c++) ww[cov + (size_t)t * (size_t)nchunks + (size_t)cb + c] = 1;
    size_t d = 0;
    while (d < nw && ww[d] == cw[d]) d++;
    CHECK(d == nw, "wgrad words T %zu N %zu K %zu C %zu bf16 %d/%d w %d b %d: word %zu: sim %lld, "
          "CPU %lld", T, N, K, C, dbf, xbf, with_w, with_b, d, (long long)(d < nw ? ww[d] : 0),
          (long long)(d < nw ? cw[d] : 0));
    for (int t = 0; t < 2; t++) {
      int obs = 0;
      bx_tokred_observed(s, (size_t)t, &obs, NULL);
      uint32_t mx = t ? res.mx_b : res.mx_w;
      CHECK(obs == bx_tokred_exp_of_abs(mx), "wgrad observed of tensor %d: sim 2^%d, CPU 2^%d", t,
            bx_tokred_exp_of_abs(mx), obs);
    }
    /* finished */
    float *o1 = malloc((nk + N) * 4), *o2 = malloc((nk + N) * 4);
    DLTensor out1[2] = {bxt_f32_view(o1, 2, sw), bxt_f32_view(o1 + nk, 1, sb)};
    DLTensor out2[2] = {bxt_f32_view(o2, 2, sw), bxt_f32_view(o2 + nk, 1, sb)};
    int64_t div = bxt_below(&r, 2) ? 1 : (int64_t)T;
    bx_status st1 = finish_words(grads, 2, (int64_t)C, total, E, cw, nw, div, out1);
    bx_status st2 = finish_words(grads, 2, (int64_t)C, total, E, ww, nw, div, out2);
    CHECK(st1 == st2, "wgrad finish: sim %s, CPU %s", bx_status_str(st2), bx_status_str(st1));
    if (st1 == BX_OK) CHECK_SAME(o2, o1, nk + N, "wgrad finish T %zu N %zu K %zu", T, N, K);
    /* a stated bound one below the largest partial element of one tensor:
     * the CPU refuses naming the first breaking chunk, the state unchanged;
     * the device's atomicMin must be that chunk */
    for (int t = 0; t < 2; t++) {
      uint32_t mx = t ? res.mx_b : res.mx_w;
      if (!(t ? with_b : with_w) || !mx) continue;
      int Eb[2] = {BX_TOKRED_EMAX, BX_TOKRED_EMAX};
      Eb[t] = bx_tokred_exp_of_abs(mx) - 1 - (int)bxt_below(&r, 8); /* many chunks break */
      if (Eb[t] < BX_TOKRED_EMIN) Eb[t] = BX_TOKRED_EMIN;
      bx_tokred *s2 = NULL;
      CHECK_STATUS(bx_tokred_create(grads, 2, (int64_t)C, total, NULL, &s2), BX_OK, "create");
      for (int u = 0; u < 2; u++) CHECK_STATUS(bx_tokred_bound_exp(s2, (size_t)u, Eb[u]), BX_OK, "bound_exp");
      CHECK_STATUS(bx_tokred_agree(s2, NULL), BX_OK, "agree");
      bx_status st = bx_linear_wgrad(s2, wt, bt, &tdy, with_w ? &tx : NULL, tb, NULL);
      CHECK_STATUS(st, BX_EINVAL, "wgrad with a stated bound too small for tensor %d", t);
      bx_tgt_wgrad w2 = w;
      w2.inv_w = bx_tokred_pow2(-bx_tokred_grid_exponent(Eb[0], nchunks));
      w2.inv_b = bx_tokred_pow2(-bx_tokred_grid_exponent(Eb[1], nchunks));
      w2.lim_w = bx_tokred_abs_limit(Eb[0]);
      w2.lim_b = bx_tokred_abs_limit(Eb[1]);
      sim_res r2;
      res_clear(&r2);
      w2.zgroups = 1 + bxt_below(&r, nch);
      if (with_w) sim_wgrad_weight(&r, &w2, &r2, &ops);
      w2.zgroups = 1 + bxt_below(&r, nch);
      if (with_b) sim_wgrad_bias(&r, &w2, &r2, &ops);
      uint64_t bad = t ? r2.bad_b : r2.bad_w;
      char want[80];
      snprintf(want, sizeof want, "tensor %d, chunk %lld,", t, (long long)(cb + (int64_t)bad));
      CHECK(bad != UINT64_MAX && strstr(bx_last_error(), want),
            "wgrad stated bound: the CPU names %s; sim: %s", bx_last_error(), want);
      int64_t *w2w;
      size_t n2;
      bx_tokred_words(s2, &w2w, &n2);
      size_t nz = 0;
      while (nz < n2 && w2w[nz] == 0) nz++;
      CHECK(nz == n2, "wgrad stated bound: the refused call left word %zu", nz);
      bx_tokred_destroy(s2);
    }
    free(dy), free(x), free(mdy), free(mxx), free(qw), free(qb), free(ww), free(o1), free(o2);
    bx_tokred_destroy(s);
  }
  free(ops.v);
  wgrad_dispatch();
}
