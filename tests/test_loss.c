/*
 * test_loss.c — the embedding and cross-entropy layers (bitexact_train.h,
 * "Layers: embedding, cross-entropy"): bit for bit against scalar
 * re-implementations of the documented orders written here, against
 * long-double references with stated error bounds (and central finite
 * differences of the reference loss), batch, thread and ISA invariance,
 * token-reduction invariance over random micro-batch splits fed through
 * bx_tokred (the ordinary way drifting on some split), and bad input
 * (named errors, nothing written).
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bitexact_train.h"
#include "harness.h"
#include "math_det.h"
#include "pow_det.h"
#include "tests.h"
#include "util.h"

/* ---- small tensors ------------------------------------------------------ */

typedef struct tz {
  DLTensor t;
  int64_t shape[3];
} tz;

static void tz_set(tz *x, void *data, int code, int bits, int ndim, int64_t d0, int64_t d1,
                   int64_t d2) {
  memset(x, 0, sizeof *x);
  x->shape[0] = d0;
  x->shape[1] = d1;
  x->shape[2] = d2;
  x->t.data = data;
  x->t.device.device_type = kDLCPU;
  x->t.ndim = ndim;
  x->t.shape = x->shape;
  x->t.dtype.code = (uint8_t)code;
  x->t.dtype.bits = (uint8_t)bits;
  x->t.dtype.lanes = 1;
}
#define F32 kDLFloat, 32
#define I32 kDLInt, 32
#define I64 kDLInt, 64

static const int THREADS[4] = {1, 2, 3, 8};

static float randf(bxt_rng *r, double scale) { return (float)(bxt_normal(r) * scale); }

/* ---- embedding: the scalar reference of the compact partials ------------- */

typedef struct compact {
  int64_t *ids, *off;
  float *rows;
} compact;

/* chunk by chunk: ids ascending, rows summed over ascending tokens in fp32 */
static void ref_compact(const int64_t *ids, const float *dy, size_t T, size_t H, size_t C,
                        int64_t V, int64_t pad, compact *out) {
  size_t nch = (T + C - 1) / C, k = 0;
  out->off[0] = 0;
  for (size_t j = 0; j < nch; j++) {
    size_t t0 = j * C, t1 = t0 + C < T ? t0 + C : T;
    for (int64_t v = 0; v < V; v++) {
      int seen = 0;
      for (size_t t = t0; t < t1; t++) {
        if (ids[t] != v || v == pad) continue;
        if (!seen) {
          out->ids[k] = v;
          for (size_t h = 0; h < H; h++) out->rows[k * H + h] = 0.0f;
          seen = 1;
        }
        for (size_t h = 0; h < H; h++) {
          volatile float s = out->rows[k * H + h] + dy[t * H + h];
          out->rows[k * H + h] = s;
        }
      }
      k += (size_t)seen;
    }
    out->off[j + 1] = (int64_t)k;
  }
}

static void compact_alloc(compact *c, size_t T, size_t H) {
  c->ids = calloc(T + 1, sizeof *c->ids);
  c->off = calloc(T + 2, sizeof *c->off);
  c->rows = calloc(T * H + 1, sizeof *c->rows);
}
static void compact_free(compact *c) {
  free(c->ids);
  free(c->off);
  free(c->rows);
}

/* bx_embedding_backward into c (tensors over c's buffers) */
static bx_status run_emb_bwd(const void *ids, int idbits, int ndim2, size_t T, const float *dy,
                             size_t H, int64_t V, size_t C, compact *c, int threads, int64_t pad) {
  tz I, D, R, W, F;
  size_t nch = (T + C - 1) / C;
  if (ndim2 && T % 2 == 0) {
    tz_set(&I, (void *)ids, kDLInt, idbits, 2, 2, (int64_t)T / 2, 0);
    tz_set(&D, (void *)dy, F32, 3, 2, (int64_t)T / 2, (int64_t)H);
  } else {
    tz_set(&I, (void *)ids, kDLInt, idbits, 1, (int64_t)T, 0, 0);
    tz_set(&D, (void *)dy, F32, 2, (int64_t)T, (int64_t)H, 0);
  }
  tz_set(&R, c->ids, I64, 1, (int64_t)T, 0, 0);
  tz_set(&W, c->rows, F32, 2, (int64_t)T, (int64_t)H, 0);
  tz_set(&F, c->off, I64, 1, (int64_t)nch + 1, 0, 0);
  bx_embedding_opts o = BX_EMBEDDING_OPTS_DEFAULT;
  o.num_threads = threads;
  o.padding_idx = pad;
  return bx_embedding_backward(&I.t, &D.t, V, (int64_t)C, &R.t, &W.t, &F.t, &o);
}

void test_loss_embedding(void) {
  bxt_rng r;
  bxt_rng_init(&r);
  for (int trial = 0; trial < 40 && !bxt_failures(); trial++) {
    int64_t V = 1 + (int64_t)bxt_below(&r, 40);
    size_t H = 1 + bxt_below(&r, 70), T = bxt_below(&r, 90), C = 1 + bxt_below(&r, 20);
    int64_t pad = bxt_below(&r, 3) == 0 ? (int64_t)bxt_below(&r, (uint64_t)V) : -1;
    float *w = malloc((size_t)V * H * sizeof *w), *dy = malloc((T * H + 1) * sizeof *dy);
    float *y = malloc((T * H + 1) * sizeof *y);
    int64_t *ids = malloc((T + 1) * sizeof *ids);
    int32_t *ids32 = malloc((T + 1) * sizeof *ids32);
    for (size_t i = 0; i < (size_t)V * H; i++) w[i] = randf(&r, 1.0);
    for (size_t i = 0; i < T * H; i++) dy[i] = randf(&r, ldexp(1.0, (int)bxt_below(&r, 8)));
    for (size_t t = 0; t < T; t++) ids32[t] = (int32_t)(ids[t] = (int64_t)bxt_below(&r, (uint64_t)V));
    /* forward: the rows, for both id dtypes and every thread count */
    for (int k = 0; k < 8; k++) {
      tz W, I, Y;
      tz_set(&W, w, F32, 2, V, (int64_t)H, 0);
      tz_set(&I, k & 1 ? (void *)ids32 : (void *)ids, kDLInt, k & 1 ? 32 : 64, 1, (int64_t)T, 0, 0);
      tz_set(&Y, y, F32, 2, (int64_t)T, (int64_t)H, 0);
      bx_embedding_opts o = BX_EMBEDDING_OPTS_DEFAULT;
      o.num_threads = THREADS[k / 2];
      memset(y, 0xff, (T * H + 1) * sizeof *y);
      CHECK_STATUS(bx_embedding_forward(&W.t, &I.t, &Y.t, &o), BX_OK, "forward");
      int same = 1;
      for (size_t t = 0; t < T; t++)
        same &= memcmp(y + t * H, w + (size_t)ids[t] * H, H * sizeof *y) == 0;
      CHECK(same, "forward rows differ from weight rows (trial %d)", trial);
    }
    /* backward: the scalar reference, bit for bit, and an fp64 bound */
    compact ref, got;
    compact_alloc(&ref, T, H);
    ref_compact(ids, dy, T, H, C, V, pad, &ref);
    size_t nch = (T + C - 1) / C;
    for (int isa = -1; isa < bxt_isa_count(); isa++) {
      if (isa >= 0 && !bxt_force(isa)) continue;
      for (int k = 0; k < 8; k++) {
        compact_alloc(&got, T, H);
        CHECK_STATUS(run_emb_bwd(k & 1 ? (void *)ids32 : (void *)ids, k & 1 ? 32 : 64, k & 2, T,
                                 dy, H, V, C, &got, THREADS[k / 2], pad),
                     BX_OK, "backward");
        size_t used = (size_t)ref.off[nch];
        CHECK(memcmp(got.off, ref.off, (nch + 1) * sizeof *ref.off) == 0 &&
                  memcmp(got.ids, ref.ids, used * sizeof *ref.ids) == 0 &&
                  memcmp(got.rows, ref.rows, used * H * sizeof *ref.rows) == 0,
              "compact partials differ from the scalar reference (trial %d, isa %d, k %d)", trial,
              isa, k);
        compact_free(&got);
      }
    }
    bxt_force(-1);
    /* fp64: |fp32 chunk sum - exact| <= (n - 1) 2^-24 sum |dy| (n tokens summed) */
    for (size_t j = 0; j < nch; j++)
      for (int64_t k = ref.off[j]; k < ref.off[j + 1]; k++)
        for (size_t h = 0; h < H; h++) {
          double ex = 0, ab = 0;
          int n = 0;
          for (size_t t = j * C; t < T && t < (j + 1) * C; t++)
            if (ids[t] == ref.ids[k]) {
              ex += dy[t * H + h];
              ab += fabs(dy[t * H + h]);
              n++;
            }
          CHECK(fabs(ref.rows[k * H + h] - ex) <= (n - 1) * ldexp(ab, -24) * 1.0001,
                "chunk sum off its bound");
        }
    compact_free(&ref);
    free(w);
    free(dy);
    free(y);
    free(ids);
    free(ids32);
  }
}

/* The dense gradient through bx_tokred for one layout of the batch: the
 * micro-batches (cut at chunk boundaries) in the order perm. extra: a
 * tensor before the embedding gradient in the state (word offsets).
 * dense_path: the dense partials through bx_tokred_bound / _add instead of
 * the compact helpers. Returns the finished gradient in out [V H]; words
 * (grid mode) copied into *words (malloc'd). */
static bx_status emb_reduce(const int64_t *ids, const float *dy, size_t T, size_t H, int64_t V,
                            size_t C, const size_t *cuts, size_t ncuts, const size_t *perm,
                            bx_tokred_mode mode, int dense_path, float *out, int64_t **words,
                            size_t *nwords) {
  int64_t gshape[2] = {V, (int64_t)H}, eshape[1] = {3};
  DLTensor g[2];
  memset(g, 0, sizeof g);
  for (int i = 0; i < 2; i++) {
    g[i].device.device_type = kDLCPU;
    g[i].dtype.code = kDLFloat;
    g[i].dtype.bits = 32;
    g[i].dtype.lanes = 1;
  }
  g[0].ndim = 1;
  g[0].shape = eshape;
  g[1].ndim = 2;
  g[1].shape = gshape;
  bx_tokred_opts to = BX_TOKRED_OPTS_DEFAULT;
  to.mode = mode;
  bx_tokred *s = NULL;
  bx_status st = bx_tokred_create(g, 2, (int64_t)C, (int64_t)T, &to, &s);
  if (st != BX_OK) return st;
  float extra[3] = {1.0f, 2.0f, 3.0f};
  compact c[16];
  float *dense = calloc((size_t)V * H + 1, sizeof *dense);
  for (int pass = 0; pass < 2 && st == BX_OK; pass++) {
    if (pass == 1) st = bx_tokred_agree(s, NULL);
    for (size_t q = 0; q < ncuts && st == BX_OK; q++) {
      size_t m = perm[q], t0 = cuts[m], t1 = cuts[m + 1], n = t1 - t0;
      size_t nch = (n + C - 1) / C, first = t0 / C;
      if (pass == 0) {
        compact_alloc(&c[m], n, H);
        st = run_emb_bwd(ids + t0, 64, 0, n, dy + t0 * H, H, V, C, &c[m], 2, -1);
      }
      tz R, W, F, E, Dn;
      tz_set(&R, c[m].ids, I64, 1, (int64_t)n, 0, 0);
      tz_set(&W, c[m].rows, F32, 2, (int64_t)n, (int64_t)H, 0);
      tz_set(&F, c[m].off, I64, 1, (int64_t)nch + 1, 0, 0);
      tz_set(&E, extra, F32, 1, 3, 0, 0);
      tz_set(&Dn, dense, F32, 2, V, (int64_t)H, 0);
      for (size_t j = 0; j < nch && st == BX_OK; j++) {
        st = pass ? bx_tokred_add(s, 0, (int64_t)(first + j), &E.t)
                  : bx_tokred_bound(s, 0, (int64_t)(first + j), &E.t);
        if (!dense_path || st != BX_OK) continue;
        memset(dense, 0, (size_t)V * H * sizeof *dense);
        for (int64_t k = c[m].off[j]; k < c[m].off[j + 1]; k++)
          memcpy(dense + c[m].ids[k] * (int64_t)H, c[m].rows + k * (int64_t)H, H * sizeof *dense);
        st = pass ? bx_tokred_add(s, 1, (int64_t)(first + j), &Dn.t)
                  : bx_tokred_bound(s, 1, (int64_t)(first + j), &Dn.t);
      }
      if (!dense_path && st == BX_OK)
        st = pass ? bx_embedding_grad_add(s, g, 2, 1, (int64_t)first, &R.t, &W.t, &F.t)
                  : bx_embedding_grad_bound(s, 1, &W.t, &F.t);
    }
  }
  if (st == BX_OK) {
    float e3[3];
    DLTensor outs[2];
    tz O0, O1;
    tz_set(&O0, e3, F32, 1, 3, 0, 0);
    tz_set(&O1, out, F32, 2, V, (int64_t)H, 0);
    outs[0] = O0.t;
    outs[1] = O1.t;
    st = bx_tokred_finish(s, outs, 2, 1);
  }
  if (st == BX_OK && words) {
    int64_t *w;
    if (bx_tokred_words(s, &w, nwords) == BX_OK) {
      *words = malloc(*nwords * sizeof **words);
      memcpy(*words, w, *nwords * sizeof **words);
    } else {
      *words = NULL;
    }
  }
  for (size_t m = 0; m < ncuts; m++) compact_free(&c[m]);
  free(dense);
  bx_tokred_destroy(s);
  return st;
}

/* random cuts at chunk boundaries (at most 8 micro-batches) and order */
static size_t random_layout(bxt_rng *r, size_t T, size_t C, size_t *cuts, size_t *perm) {
  size_t n = 0, nch = (T + C - 1) / C;
  cuts[n++] = 0;
  for (size_t j = 1; j < nch && n < 8; j++)
    if (bxt_below(r, 3) == 0) cuts[n++] = j * C;
  cuts[n] = T;
  for (size_t i = 0; i < n; i++) perm[i] = i;
  for (size_t i = n; i > 1; i--) {
    size_t k = bxt_below(r, i), tmp = perm[i - 1];
    perm[i - 1] = perm[k];
    perm[k] = tmp;
  }
  return n;
}

void test_loss_embedding_tokred(void) {
  bxt_rng r;
  bxt_rng_init(&r);
  int drift = 0;
  for (int trial = 0; trial < 12 && !bxt_failures(); trial++) {
    int64_t V = 2 + (int64_t)bxt_below(&r, 12);
    size_t H = 1 + bxt_below(&r, 9), C = 1 + bxt_below(&r, 6), T = C * (4 + bxt_below(&r, 10));
    T -= bxt_below(&r, C); /* a short last chunk */
    int64_t *ids = malloc(T * sizeof *ids);
    float *dy = malloc(T * H * sizeof *dy);
    for (size_t t = 0; t < T; t++) ids[t] = (int64_t)bxt_below(&r, (uint64_t)V);
    for (size_t i = 0; i < T * H; i++) dy[i] = randf(&r, ldexp(1.0, (int)bxt_below(&r, 12)));
    size_t cuts[9], perm[9];
    size_t one_cut[2] = {0, T}, one_perm[1] = {0};
    float *want = malloc((size_t)V * H * sizeof *want), *got = malloc((size_t)V * H * sizeof *got);
    float *ord0 = malloc((size_t)V * H * sizeof *got);
    int64_t *w0 = NULL, *w1 = NULL;
    size_t n0 = 0, n1 = 0;
    CHECK_STATUS(emb_reduce(ids, dy, T, H, V, C, one_cut, 1, one_perm, BX_TOKRED_GRID, 1, want,
                            &w0, &n0), BX_OK, "dense path");
    CHECK_STATUS(emb_reduce(ids, dy, T, H, V, C, one_cut, 1, one_perm, BX_TOKRED_GRID, 0, got, &w1,
                            &n1), BX_OK, "compact path");
    CHECK(w0 && w1 && n0 == n1 && memcmp(w0, w1, n0 * sizeof *w0) == 0,
          "the compact add's words differ from the dense add's (trial %d)", trial);
    free(w0);
    free(w1);
    CHECK(memcmp(want, got, (size_t)V * H * sizeof *got) == 0, "compact vs dense gradient");
    CHECK_STATUS(emb_reduce(ids, dy, T, H, V, C, one_cut, 1, one_perm, BX_TOKRED_ORDINARY, 0, ord0,
                            NULL, NULL), BX_OK, "ordinary");
    for (int rep = 0; rep < 6; rep++) {
      size_t n = random_layout(&r, T, C, cuts, perm);
      CHECK_STATUS(emb_reduce(ids, dy, T, H, V, C, cuts, n, perm, BX_TOKRED_GRID, 0, got, NULL,
                              NULL), BX_OK, "grid split");
      CHECK(memcmp(want, got, (size_t)V * H * sizeof *got) == 0,
            "gradient bits depend on the split (trial %d rep %d)", trial, rep);
      float *o2 = malloc((size_t)V * H * sizeof *o2), *o3 = malloc((size_t)V * H * sizeof *o3);
      CHECK_STATUS(emb_reduce(ids, dy, T, H, V, C, cuts, n, perm, BX_TOKRED_ORDINARY, 0, o2, NULL,
                              NULL), BX_OK, "ordinary split");
      CHECK_STATUS(emb_reduce(ids, dy, T, H, V, C, cuts, n, perm, BX_TOKRED_ORDINARY, 1, o3, NULL,
                              NULL), BX_OK, "ordinary split, dense");
      /* dense path adds chunks ascending, the helper descending: the same
       * per chunk but a different fp32 order; both are the control */
      drift |= memcmp(ord0, o2, (size_t)V * H * sizeof *o2) != 0;
      free(o2);
      free(o3);
    }
    free(ids);
    free(dy);
    free(want);
    free(got);
    free(ord0);
  }
  CHECK(drift, "the ordinary mode never depended on the split: the control shows nothing");
}

/* ---- cross-entropy: the scalar re-implementation of the documented order -- */

static double ln_of(double S) {
  const bx_pd_dd ln2 = {0x1.62e42fefa39efp-1, 0x1.abc9e3b39803fp-56};
  return bx_pd_mul(bx_pd_log2(S), ln2).hi;
}

/* loss (and g[V] when g) per the header's formulas; y < 0 ignored */
static float ref_xent(const float *z, size_t V, int64_t y, double c, float *g) {
  if (y < 0) {
    if (g)
      for (size_t v = 0; v < V; v++) g[v] = 0.0f;
    return 0.0f;
  }
  float m = -INFINITY;
  int nan = 0;
  for (size_t v = 0; v < V; v++) {
    if (isnan(z[v])) nan = 1;
    if (z[v] > m) m = z[v];
  }
  if (nan || isinf(m)) {
    if (g)
      for (size_t v = 0; v < V; v++) g[v] = NAN;
    return NAN;
  }
  double S = 0.0;
  float *e = malloc(V * sizeof *e);
  for (size_t v = 0; v < V; v++) {
    volatile float d = z[v] - m;
    e[v] = bx_expf_det(d);
    S += (double)e[v];
  }
  volatile double dm = (double)m - (double)z[y];
  float loss = (float)(dm + ln_of(S));
  if (g)
    for (size_t v = 0; v < V; v++) {
      volatile double p = (double)e[v] / S;
      volatile double q = p - (v == (size_t)y ? 1.0 : 0.0);
      g[v] = (float)(q * c);
    }
  free(e);
  return loss;
}

typedef struct xbatch {
  size_t T, V;
  float *z;
  int64_t *y;
  int32_t *y32;
} xbatch;

static void xbatch_make(bxt_rng *r, xbatch *b, size_t T, size_t V, double scale, int ign) {
  b->T = T;
  b->V = V;
  b->z = malloc((T * V + 1) * sizeof *b->z);
  b->y = malloc((T + 1) * sizeof *b->y);
  b->y32 = malloc((T + 1) * sizeof *b->y32);
  for (size_t i = 0; i < T * V; i++) b->z[i] = randf(r, scale);
  for (size_t t = 0; t < T; t++) {
    b->y[t] = ign && bxt_below(r, 4) == 0 ? -100 : (int64_t)bxt_below(r, V);
    b->y32[t] = (int32_t)b->y[t];
  }
}
static void xbatch_free(xbatch *b) {
  free(b->z);
  free(b->y);
  free(b->y32);
}

/* the fused call on rows [t0, t0 + T) of b (chunk C); NULL outputs skipped */
static bx_status run_xent(const xbatch *b, size_t t0, size_t T, size_t C, int64_t N, int y32,
                          int threads, float *loss, float *part, int64_t *cnt, float *g) {
  tz Z, Y, L, P, K, G;
  size_t nch = (T + C - 1) / C;
  tz_set(&Z, b->z + t0 * b->V, F32, 2, (int64_t)T, (int64_t)b->V, 0);
  if (y32) tz_set(&Y, b->y32 + t0, I32, 1, (int64_t)T, 0, 0);
  else tz_set(&Y, b->y + t0, I64, 1, (int64_t)T, 0, 0);
  tz_set(&L, loss, F32, 1, (int64_t)T, 0, 0);
  tz_set(&P, part, F32, 1, (int64_t)nch, 0, 0);
  tz_set(&K, cnt, I64, 1, (int64_t)nch, 0, 0);
  tz_set(&G, g, F32, 2, (int64_t)T, (int64_t)b->V, 0);
  bx_xent_opts o = BX_XENT_OPTS_DEFAULT;
  o.num_threads = threads;
  if (!g) return bx_xent_forward(&Z.t, &Y.t, (int64_t)C, &L.t, part ? &P.t : NULL,
                                 cnt ? &K.t : NULL, &o);
  if (!loss) return bx_xent_backward(&Z.t, &Y.t, N, &G.t, &o);
  return bx_xent_forward_backward(&Z.t, &Y.t, N, (int64_t)C, &L.t, part ? &P.t : NULL,
                                  cnt ? &K.t : NULL, &G.t, &o);
}

/* long-double reference of one token: loss and dz (p - onehot) / N */
static long double ld_loss(const float *z, size_t V, int64_t y) {
  long double m = -INFINITY, s = 0;
  for (size_t v = 0; v < V; v++) m = z[v] > m ? z[v] : m;
  for (size_t v = 0; v < V; v++) s += expl((long double)z[v] - m);
  return m + logl(s) - (long double)z[y];
}

void test_loss_xent_vs_reference(void) {
  bxt_rng r;
  bxt_rng_init(&r);
  static const size_t Vs[6] = {1, 2, 7, 300, 1000, 20000};
  static const double scales[4] = {0.05, 1.0, 6.0, 40.0};
  for (int trial = 0; trial < 24 && !bxt_failures(); trial++) {
    size_t V = Vs[trial % 6], T = V > 5000 ? 3 : 1 + bxt_below(&r, 12);
    double scale = scales[bxt_below(&r, 4)];
    xbatch b;
    xbatch_make(&r, &b, T, V, scale, 1);
    int64_t N = (int64_t)T + (int64_t)bxt_below(&r, 1000);
    float *loss = malloc(T * sizeof *loss), *g = malloc(T * V * sizeof *g);
    float *rg = malloc(V * sizeof *rg);
    float part[16];
    int64_t cnt[16];
    CHECK_STATUS(run_xent(&b, 0, T, 1, N, trial & 1, 0, loss, part, cnt, g), BX_OK, "fused");
    double c = 1.0 / (double)N;
    for (size_t t = 0; t < T; t++) {
      const float *z = b.z + t * V;
      float rl = ref_xent(z, V, b.y[t] == -100 ? -1 : b.y[t], c, rg);
      CHECK_BITS_F(loss[t], rl, "loss of token %zu (V %zu, trial %d)", t, V, trial);
      CHECK(memcmp(g + t * V, rg, V * sizeof *rg) == 0, "dlogits row %zu (V %zu)", t, V);
      CHECK(cnt[t] == (b.y[t] != -100), "count of chunk %zu", t);
      CHECK_BITS_F(part[t], b.y[t] == -100 ? 0.0f : rl, "partial of a one-token chunk");
      if (b.y[t] == -100) continue;
      /* the bound (docs/train_loss.md): exp args rounded (2^-24 |z - m|),
       * exp rounded (2^-24), the fp64 sum (V 2^-53), ln and the final
       * roundings (2^-24 |l| + 2^-50) */
      float m = -INFINITY, lo = INFINITY;
      for (size_t v = 0; v < V; v++) {
        m = z[v] > m ? z[v] : m;
        lo = z[v] < lo ? z[v] : lo;
      }
      double R = (double)m - lo;
      long double ex = ld_loss(z, V, b.y[t]);
      double bound = ldexp(fabs((double)ex), -24) + ldexp(1.0 + R, -24) * 1.01 +
                     (double)V * ldexp(1.0, -52) + ldexp(1.0 + fabs((double)ex), -48);
      CHECK(fabsl((long double)loss[t] - ex) <= bound, "loss %.9g vs %.12Lg: above the bound %g",
            (double)loss[t], ex, bound);
      /* gradient: p_v rel err <= 2^-24 (2 + |z_v - m| + R) + small, then
       * the final rounding */
      long double s = 0;
      for (size_t v = 0; v < V; v++) s += expl((long double)z[v] - m);
      for (size_t v = 0; v < V; v++) {
        long double p = expl((long double)z[v] - m) / s;
        long double gx = (p - (v == (size_t)b.y[t])) * (long double)c;
        double gb = ldexp(fabs((double)gx), -24) +
                    (double)(p * c) * ldexp(2.0 + ((double)m - z[v]) + R, -24) * 1.01 +
                    c * ldexp(1.0, -50);
        if (!(fabsl((long double)g[t * V + v] - gx) <= gb)) {
          CHECK(0, "dlogits[%zu][%zu] %.9g vs %.12Lg: above the bound %g", t, v,
                (double)g[t * V + v], gx, gb);
          break;
        }
      }
    }
    /* finite differences of the long-double mean loss vs (p - onehot)/N */
    if (V <= 1000 && T > 0 && b.y[0] != -100) {
      float z0[1000];
      memcpy(z0, b.z, V * sizeof *z0);
      for (int k = 0; k < 3; k++) {
        size_t v = bxt_below(&r, V);
        float zp[1000], zm[1000];
        double h = 1e-3 * (scale > 1 ? scale : 1);
        memcpy(zp, z0, V * sizeof *zp);
        memcpy(zm, z0, V * sizeof *zm);
        zp[v] = (float)(z0[v] + h);
        zm[v] = (float)(z0[v] - h);
        double hh = (double)zp[v] - (double)zm[v];
        long double fd = (ld_loss(zp, V, b.y[0]) - ld_loss(zm, V, b.y[0])) / hh / (double)N;
        double tol = 1e-4 * fabs(c) + 1e-3 * fabs((double)fd);
        CHECK(fabs((double)g[v] - (double)fd) <= tol,
              "finite difference at v %zu: %.9g vs dlogits %.9g", v, (double)fd, (double)g[v]);
      }
    }
    xbatch_free(&b);
    free(loss);
    free(g);
    free(rg);
  }
}

void test_loss_xent_special_values(void) {
  float z[6] = {1.0f, -INFINITY, 2.0f, -INFINITY, 0.5f, 3.0f};
  xbatch b = {1, 6, z, NULL, NULL};
  int64_t y[1];
  b.y = y;
  float loss, g[6], rg[6];
  int64_t targets[3] = {0, 1, -100};
  for (int k = 0; k < 3; k++) {
    y[0] = targets[k];
    CHECK_STATUS(run_xent(&b, 0, 1, 1, 1, 0, 1, &loss, NULL, NULL, g), BX_OK, "special");
    float rl = ref_xent(z, 6, y[0] < 0 ? -1 : y[0], 1.0, rg);
    CHECK_BITS_F(loss, rl, "loss with -Inf logits, target %lld", (long long)y[0]);
    CHECK(memcmp(g, rg, sizeof g) == 0, "dlogits with -Inf logits");
  }
  CHECK(isinf(rg[0]) == 0 && loss == 0.0f, "ignored: loss 0");
  y[0] = 1;
  run_xent(&b, 0, 1, 1, 1, 0, 1, &loss, NULL, NULL, g);
  CHECK(loss == INFINITY, "target logit -Inf: loss +Inf, got %g", (double)loss);
  z[3] = NAN;
  y[0] = 0;
  run_xent(&b, 0, 1, 1, 1, 0, 1, &loss, NULL, NULL, g);
  CHECK(bxt_fbits(loss) == 0x7fc00000u && bxt_fbits(g[5]) == 0x7fc00000u, "NaN row: NaN");
  z[3] = INFINITY;
  run_xent(&b, 0, 1, 1, 1, 0, 1, &loss, NULL, NULL, g);
  CHECK(bxt_fbits(loss) == 0x7fc00000u, "+Inf logit: NaN loss");
}

void test_loss_xent_invariance(void) {
  bxt_rng r;
  bxt_rng_init(&r);
  size_t T = 37, V = 613;
  xbatch b;
  xbatch_make(&r, &b, T, V, 4.0, 1);
  int64_t N = 1000;
  float *loss = malloc(T * sizeof *loss), *g = malloc(T * V * sizeof *g);
  float *l2 = malloc(T * sizeof *l2), *g2 = malloc(T * V * sizeof *g2);
  CHECK_STATUS(run_xent(&b, 0, T, 5, N, 0, 1, loss, NULL, NULL, g), BX_OK, "reference run");
  /* threads, ISAs, id dtype */
  for (int isa = -1; isa < bxt_isa_count(); isa++) {
    if (isa >= 0 && !bxt_force(isa)) continue;
    for (int k = 0; k < 4; k++) {
      CHECK_STATUS(run_xent(&b, 0, T, 5, N, k & 1, THREADS[k], l2, NULL, NULL, g2), BX_OK, "run");
      CHECK(memcmp(loss, l2, T * sizeof *l2) == 0 && memcmp(g, g2, T * V * sizeof *g) == 0,
            "bits depend on threads %d / isa %d", THREADS[k], isa);
    }
  }
  bxt_force(-1);
  /* batch invariance: rows [s, s + k) alone */
  for (int rep = 0; rep < 30; rep++) {
    size_t s = bxt_below(&r, T), k = 1 + bxt_below(&r, T - s);
    CHECK_STATUS(run_xent(&b, s, k, 1 + bxt_below(&r, 4), N, 0, 3, l2, NULL, NULL, g2), BX_OK,
                 "sub-batch");
    CHECK(memcmp(loss + s, l2, k * sizeof *l2) == 0 &&
              memcmp(g + s * V, g2, k * V * sizeof *g) == 0,
          "rows [%zu, %zu) alone differ from the batch", s, s + k);
  }
  /* [B, L, V] logits with [B, L] targets and losses: read as [B*L, V] */
  {
    tz Z3, Y3, L3, G3;
    tz_set(&Z3, b.z + V, F32, 3, 4, 9, (int64_t)V);
    tz_set(&Y3, b.y + 1, I64, 2, 4, 9, 0);
    tz_set(&L3, l2, F32, 2, 4, 9, 0);
    tz_set(&G3, g2, F32, 3, 4, 9, (int64_t)V);
    CHECK_STATUS(bx_xent_forward_backward(&Z3.t, &Y3.t, N, 4, &L3.t, NULL, NULL, &G3.t, NULL),
                 BX_OK, "3-D");
    CHECK(memcmp(loss + 1, l2, 36 * sizeof *l2) == 0 &&
              memcmp(g + V, g2, 36 * V * sizeof *g) == 0,
          "[B, L, V] differs from [T, V]");
  }
  /* forward alone, backward alone and in place equal the fused call */
  CHECK_STATUS(run_xent(&b, 0, T, 5, N, 0, 2, l2, NULL, NULL, NULL), BX_OK, "forward");
  CHECK(memcmp(loss, l2, T * sizeof *l2) == 0, "forward alone differs from fused");
  CHECK_STATUS(run_xent(&b, 0, T, 5, N, 0, 2, NULL, NULL, NULL, g2), BX_OK, "backward");
  CHECK(memcmp(g, g2, T * V * sizeof *g) == 0, "backward alone differs from fused");
  float *zc = malloc(T * V * sizeof *zc);
  memcpy(zc, b.z, T * V * sizeof *zc);
  CHECK_STATUS(run_xent(&b, 0, T, 5, N, 0, 2, l2, NULL, NULL, b.z), BX_OK, "in place");
  CHECK(memcmp(loss, l2, T * sizeof *l2) == 0 && memcmp(g, b.z, T * V * sizeof *g) == 0,
        "in place differs");
  memcpy(b.z, zc, T * V * sizeof *zc);
  free(zc);
  xbatch_free(&b);
  free(loss);
  free(g);
  free(l2);
  free(g2);
}

/* The global mean through bx_tokred for one layout; *framework: the
 * ordinary way (fp32 sum per micro-batch, micro-batches in order, / N). */
static float xent_mean(const xbatch *b, size_t C, const size_t *cuts, size_t n,
                       const size_t *perm, float *framework, float *ordinary, int64_t *Nout) {
  size_t T = b->T;
  DLTensor g;
  memset(&g, 0, sizeof g);
  g.device.device_type = kDLCPU;
  g.dtype.code = kDLFloat;
  g.dtype.bits = 32;
  g.dtype.lanes = 1;
  bx_tokred *s = NULL, *so = NULL;
  bx_tokred_opts oo = BX_TOKRED_OPTS_DEFAULT;
  oo.mode = BX_TOKRED_ORDINARY;
  CHECK_STATUS(bx_tokred_create(&g, 1, (int64_t)C, (int64_t)T, NULL, &s), BX_OK, "create");
  CHECK_STATUS(bx_tokred_create(&g, 1, (int64_t)C, (int64_t)T, &oo, &so), BX_OK, "create");
  CHECK_STATUS(bx_tokred_agree(so, NULL), BX_OK, "agree");
  float *loss = malloc(T * sizeof *loss), *part = malloc(T * sizeof *part);
  int64_t *cnt = malloc(T * sizeof *cnt), N = 0;
  float fw = 0.0f;
  for (size_t q = 0; q < n; q++) {
    size_t m = perm[q], t0 = cuts[m], len = cuts[m + 1] - t0, nch = (len + C - 1) / C;
    CHECK_STATUS(run_xent(b, t0, len, C, 0, 0, 2, loss + t0, part + t0 / C, cnt + t0 / C, NULL),
                 BX_OK, "forward");
    float whole;
    CHECK_STATUS(run_xent(b, t0, len, len, 0, 0, 1, loss + t0, &whole, NULL, NULL), BX_OK, "mb");
    fw = fw + whole;
    for (size_t j = 0; j < nch; j++) {
      DLTensor p = g;
      p.data = &part[t0 / C + j];
      CHECK_STATUS(bx_tokred_bound(s, 0, (int64_t)(t0 / C + j), &p), BX_OK, "bound");
      N += cnt[t0 / C + j];
    }
  }
  CHECK_STATUS(bx_tokred_agree(s, NULL), BX_OK, "agree");
  for (size_t q = 0; q < n; q++) {
    size_t m = perm[n - 1 - q], t0 = cuts[m], nch = (cuts[m + 1] - t0 + C - 1) / C;
    for (size_t j = 0; j < nch; j++) {
      DLTensor p = g;
      p.data = &part[t0 / C + j];
      CHECK_STATUS(bx_tokred_add(s, 0, (int64_t)(t0 / C + j), &p), BX_OK, "add");
      CHECK_STATUS(bx_tokred_add(so, 0, (int64_t)(t0 / C + j), &p), BX_OK, "add");
    }
  }
  float mean = NAN;
  DLTensor o = g;
  o.data = &mean;
  CHECK_STATUS(bx_tokred_finish(s, &o, 1, N > 0 ? N : 1), BX_OK, "finish");
  o.data = ordinary;
  CHECK_STATUS(bx_tokred_finish(so, &o, 1, N > 0 ? N : 1), BX_OK, "finish");
  bx_tokred_destroy(so);
  *framework = fw / (float)N;
  *Nout = N;
  bx_tokred_destroy(s);
  free(loss);
  free(part);
  free(cnt);
  return mean;
}

void test_loss_xent_tokred(void) {
  bxt_rng r;
  bxt_rng_init(&r);
  int drift = 0, odrift = 0;
  for (int trial = 0; trial < 8 && !bxt_failures(); trial++) {
    size_t C = 1 + bxt_below(&r, 5), T = C * (6 + bxt_below(&r, 20)) - bxt_below(&r, C);
    xbatch b;
    xbatch_make(&r, &b, T, 50 + bxt_below(&r, 200), 3.0, 1);
    b.y[0] = 1; /* at least one counted token */
    size_t one[2] = {0, T}, id[1] = {0}, cuts[9], perm[9];
    float fw, fw2, ord, ord2;
    int64_t N, N2;
    float want = xent_mean(&b, C, one, 1, id, &fw, &ord, &N);
    /* the exact mean of the per-token losses' chunk partials, rounded once */
    long double exact = 0;
    int64_t cntN = 0;
    float *loss = malloc(T * sizeof *loss);
    run_xent(&b, 0, T, 1, 0, 0, 1, loss, NULL, NULL, NULL);
    for (size_t j = 0; j * C < T; j++) {
      float acc = 0.0f;
      for (size_t t = j * C; t < T && t < (j + 1) * C; t++)
        if (b.y[t] != -100) acc = acc + loss[t], cntN++;
      exact += acc; /* partials within 2^28 of each other: an exact grid */
    }
    free(loss);
    CHECK(cntN == N, "counts sum %lld, want %lld", (long long)N, (long long)cntN);
    CHECK_BITS_F(want, (float)(exact / (long double)N), "mean vs exact sum / N rounded once");
    tz Y, K;
    int64_t *cnt = malloc(T * sizeof *cnt);
    tz_set(&Y, b.y, I64, 1, (int64_t)T, 0, 0);
    tz_set(&K, cnt, I64, 1, (int64_t)((T + C - 1) / C), 0, 0);
    CHECK_STATUS(bx_xent_count(&Y.t, (int64_t)C, &K.t, NULL), BX_OK, "count");
    int64_t sum = 0;
    for (size_t j = 0; j * C < T; j++) sum += cnt[j];
    CHECK(sum == N, "bx_xent_count total %lld vs %lld", (long long)sum, (long long)N);
    free(cnt);
    for (int rep = 0; rep < 10; rep++) {
      size_t n = random_layout(&r, T, C, cuts, perm);
      float got = xent_mean(&b, C, cuts, n, perm, &fw2, &ord2, &N2);
      CHECK_BITS_F(got, want, "loss mean depends on the split (trial %d rep %d)", trial, rep);
      drift |= bxt_fbits(fw2) != bxt_fbits(fw);
      odrift |= bxt_fbits(ord2) != bxt_fbits(ord);
    }
    xbatch_free(&b);
  }
  CHECK(drift, "the framework's fp32 sum never depended on the split");
  CHECK(odrift, "the ordinary mode never depended on the split");
}

/* ---- bad input: named errors, nothing written ----------------------------- */

static int mentions(const char *word) { return strstr(bx_last_error(), word) != NULL; }

void test_loss_bad_input(void) {
  enum { V = 5, H = 3, T = 4 };
  float w[V * H], dy[T * H], y[T * H], y0[T * H];
  int64_t ids[T] = {0, 4, 2, 4};
  for (int i = 0; i < V * H; i++) w[i] = (float)i;
  for (int i = 0; i < T * H; i++) dy[i] = (float)i * 0.5f;
  memset(y, 0x5a, sizeof y);
  memcpy(y0, y, sizeof y);
  tz W, I, Y;
  tz_set(&W, w, F32, 2, V, H, 0);
  tz_set(&I, ids, I64, 1, T, 0, 0);
  tz_set(&Y, y, F32, 2, T, H, 0);
  /* embedding forward */
  ids[3] = 5;
  CHECK_STATUS(bx_embedding_forward(&W.t, &I.t, &Y.t, NULL), BX_EINVAL, "id out of range");
  CHECK(mentions("token 3") && mentions("id 5") && mentions("bx_embedding_forward"), "%s",
        bx_last_error());
  ids[3] = -1;
  CHECK_STATUS(bx_embedding_forward(&W.t, &I.t, &Y.t, NULL), BX_EINVAL, "negative id");
  ids[3] = 4;
  I.t.dtype.code = kDLFloat;
  CHECK_STATUS(bx_embedding_forward(&W.t, &I.t, &Y.t, NULL), BX_EDTYPE, "float ids");
  CHECK(mentions("tensor 1 (ids)"), "%s", bx_last_error());
  I.t.dtype.code = kDLInt;
  W.t.dtype.code = kDLInt;
  CHECK_STATUS(bx_embedding_forward(&W.t, &I.t, &Y.t, NULL), BX_EDTYPE, "int weight");
  W.t.dtype.code = kDLFloat;
  Y.shape[1] = H + 1;
  CHECK_STATUS(bx_embedding_forward(&W.t, &I.t, &Y.t, NULL), BX_EINVAL, "row size");
  Y.shape[1] = H;
  Y.shape[0] = T - 1;
  CHECK_STATUS(bx_embedding_forward(&W.t, &I.t, &Y.t, NULL), BX_EINVAL, "token count");
  Y.shape[0] = T;
  tz Yw;
  tz_set(&Yw, w + 1, F32, 2, T, H, 0);
  CHECK_STATUS(bx_embedding_forward(&W.t, &I.t, &Yw.t, NULL), BX_ELAYOUT, "y overlaps weight");
  CHECK(mentions("overlaps"), "%s", bx_last_error());
  CHECK_STATUS(bx_embedding_forward(NULL, &I.t, &Y.t, NULL), BX_EINVAL, "NULL weight");
  Y.t.device.device_type = kDLCUDA;
  CHECK_STATUS(bx_embedding_forward(&W.t, &I.t, &Y.t, NULL), BX_EDEVICE, "device");
  Y.t.device.device_type = kDLCPU;
  int64_t bad_strides[2] = {1, T};
  Y.t.strides = bad_strides;
  CHECK_STATUS(bx_embedding_forward(&W.t, &I.t, &Y.t, NULL), BX_ELAYOUT, "strides");
  Y.t.strides = NULL;
  bx_embedding_opts eo = BX_EMBEDDING_OPTS_DEFAULT;
  eo.struct_size = 3;
  CHECK_STATUS(bx_embedding_forward(&W.t, &I.t, &Y.t, &eo), BX_EINVAL, "struct_size");
  CHECK(mentions("struct_size"), "%s", bx_last_error());
  eo.struct_size = sizeof eo;
  eo.num_threads = -1;
  CHECK_STATUS(bx_embedding_forward(&W.t, &I.t, &Y.t, &eo), BX_EINVAL, "threads");
  CHECK(memcmp(y, y0, sizeof y) == 0, "a failing forward wrote y");

  /* embedding backward */
  int64_t rid[T], off[T + 1], rid0[T], off0[T + 1];
  float rows[T * H], rows0[T * H];
  memset(rid, 0x11, sizeof rid);
  memset(off, 0x22, sizeof off);
  memset(rows, 0x33, sizeof rows);
  memcpy(rid0, rid, sizeof rid);
  memcpy(off0, off, sizeof off);
  memcpy(rows0, rows, sizeof rows);
  tz D, R, Rw, F;
  tz_set(&D, dy, F32, 2, T, H, 0);
  tz_set(&R, rid, I64, 1, T, 0, 0);
  tz_set(&Rw, rows, F32, 2, T, H, 0);
  tz_set(&F, off, I64, 1, 3, 0, 0); /* chunk_tokens 2: 2 chunks */
  ids[1] = 7;
  CHECK_STATUS(bx_embedding_backward(&I.t, &D.t, V, 2, &R.t, &Rw.t, &F.t, NULL), BX_EINVAL, "id");
  CHECK(mentions("token 1") && mentions("id 7"), "%s", bx_last_error());
  ids[1] = 4;
  CHECK_STATUS(bx_embedding_backward(&I.t, &D.t, V, 0, &R.t, &Rw.t, &F.t, NULL), BX_EINVAL, "C");
  CHECK_STATUS(bx_embedding_backward(&I.t, &D.t, V, 1, &R.t, &Rw.t, &F.t, NULL), BX_EINVAL,
               "offsets shape");
  CHECK(mentions("tensor 4 (offsets)"), "%s", bx_last_error());
  R.t.dtype.bits = 32;
  CHECK_STATUS(bx_embedding_backward(&I.t, &D.t, V, 2, &R.t, &Rw.t, &F.t, NULL), BX_EDTYPE,
               "int32 row_ids");
  R.t.dtype.bits = 64;
  tz Ra;
  tz_set(&Ra, dy, F32, 2, T, H, 0);
  CHECK_STATUS(bx_embedding_backward(&I.t, &D.t, V, 2, &R.t, &Ra.t, &F.t, NULL), BX_ELAYOUT,
               "rows over dy");
  eo.num_threads = 0;
  eo.padding_idx = V;
  CHECK_STATUS(bx_embedding_backward(&I.t, &D.t, V, 2, &R.t, &Rw.t, &F.t, &eo), BX_EINVAL, "pad");
  CHECK(memcmp(rid, rid0, sizeof rid) == 0 && memcmp(off, off0, sizeof off) == 0 &&
            memcmp(rows, rows0, sizeof rows) == 0,
        "a failing backward wrote its outputs");
  CHECK_STATUS(bx_embedding_backward(&I.t, &D.t, V, 2, &R.t, &Rw.t, &F.t, NULL), BX_OK, "good");

  /* the tokred helpers */
  int64_t gshape[2] = {V, H};
  DLTensor g;
  memset(&g, 0, sizeof g);
  g.device.device_type = kDLCPU;
  g.dtype.code = kDLFloat;
  g.dtype.bits = 32;
  g.dtype.lanes = 1;
  g.ndim = 2;
  g.shape = gshape;
  bx_tokred *s = NULL;
  CHECK_STATUS(bx_tokred_create(&g, 1, 2, T, NULL, &s), BX_OK, "create");
  CHECK_STATUS(bx_embedding_grad_add(s, &g, 1, 0, 0, &R.t, &Rw.t, &F.t), BX_EINVAL, "not agreed");
  CHECK_STATUS(bx_embedding_grad_bound(s, 0, &Rw.t, &F.t), BX_OK, "bound");
  CHECK_STATUS(bx_embedding_grad_bound(s, 1, &Rw.t, &F.t), BX_EINVAL, "bound: tensor 1");
  CHECK_STATUS(bx_tokred_agree(s, NULL), BX_OK, "agree");
  int64_t *words;
  size_t nw;
  bx_tokred_words(s, &words, &nw);
  int64_t *words0 = malloc(nw * sizeof *words0);
  memcpy(words0, words, nw * sizeof *words0);
  CHECK_STATUS(bx_embedding_grad_add(s, &g, 1, 0, 1, &R.t, &Rw.t, &F.t), BX_EINVAL,
               "chunks past the state");
  int64_t keep = rid[1];
  rid[1] = rid[0];
  CHECK_STATUS(bx_embedding_grad_add(s, &g, 1, 0, 0, &R.t, &Rw.t, &F.t), BX_EINVAL,
               "ids not ascending");
  CHECK(mentions("ascending"), "%s", bx_last_error());
  rid[1] = keep;
  float kr = rows[0];
  rows[0] = 1e30f;
  CHECK_STATUS(bx_embedding_grad_add(s, &g, 1, 0, 0, &R.t, &Rw.t, &F.t), BX_EINVAL, "bound");
  CHECK(mentions("bound"), "%s", bx_last_error());
  rows[0] = kr;
  gshape[1] = H + 1;
  CHECK_STATUS(bx_embedding_grad_add(s, &g, 1, 0, 0, &R.t, &Rw.t, &F.t), BX_EINVAL, "H");
  gshape[1] = H;
  DLTensor g2[2] = {g, g};
  CHECK_STATUS(bx_embedding_grad_add(s, g2, 2, 0, 0, &R.t, &Rw.t, &F.t), BX_EINVAL,
               "grads not the state's");
  CHECK(mentions("does not describe"), "%s", bx_last_error());
  CHECK(memcmp(words, words0, nw * sizeof *words0) == 0, "a failing add changed the state");
  CHECK_STATUS(bx_embedding_grad_add(s, &g, 1, 0, 0, &R.t, &Rw.t, &F.t), BX_OK, "add");
  free(words0);
  bx_tokred_destroy(s);

  /* cross-entropy */
  float z[T * V], loss[T], part[2], gz[T * V], loss0[T], gz0[T * V];
  int64_t tg[T] = {1, -100, 4, 0}, cnt[2] = {7, 7};
  for (int i = 0; i < T * V; i++) z[i] = (float)(i % 7) * 0.25f;
  memset(loss, 0x44, sizeof loss);
  memset(gz, 0x55, sizeof gz);
  memcpy(loss0, loss, sizeof loss);
  memcpy(gz0, gz, sizeof gz);
  tz Z, Tg, L, P, K, G;
  tz_set(&Z, z, F32, 2, T, V, 0);
  tz_set(&Tg, tg, I64, 1, T, 0, 0);
  tz_set(&L, loss, F32, 1, T, 0, 0);
  tz_set(&P, part, F32, 1, 2, 0, 0);
  tz_set(&K, cnt, I64, 1, 2, 0, 0);
  tz_set(&G, gz, F32, 2, T, V, 0);
  tg[2] = 5;
  CHECK_STATUS(bx_xent_forward_backward(&Z.t, &Tg.t, 3, 2, &L.t, &P.t, &K.t, &G.t, NULL),
               BX_EINVAL, "target out of range");
  CHECK(mentions("token 2") && mentions("target 5") && mentions("tensor 1 (targets)"), "%s",
        bx_last_error());
  tg[2] = 4;
  CHECK_STATUS(bx_xent_forward_backward(&Z.t, &Tg.t, 2, 2, &L.t, &P.t, &K.t, &G.t, NULL),
               BX_EINVAL, "n_global below the local count");
  CHECK_STATUS(bx_xent_backward(&Z.t, &Tg.t, 0, &G.t, NULL), BX_EINVAL, "n_global 0");
  CHECK_STATUS(bx_xent_forward(&Z.t, &Tg.t, 1, &L.t, &P.t, &K.t, NULL), BX_EINVAL,
               "partials shape");
  CHECK(mentions("tensor 3 (loss_partials)"), "%s", bx_last_error());
  K.t.dtype.bits = 32;
  CHECK_STATUS(bx_xent_forward(&Z.t, &Tg.t, 2, &L.t, &P.t, &K.t, NULL), BX_EDTYPE, "int32 counts");
  K.t.dtype.bits = 64;
  tz Gs;
  tz_set(&Gs, z + 1, F32, 2, T, V - 1, 0);
  tz Zs;
  tz_set(&Zs, z, F32, 2, T, V - 1, 0);
  CHECK_STATUS(bx_xent_backward(&Zs.t, &Tg.t, 3, &Gs.t, NULL), BX_ELAYOUT, "shifted in place");
  CHECK(mentions("in place"), "%s", bx_last_error());
  tz Lz;
  tz_set(&Lz, z, F32, 1, T, 0, 0);
  CHECK_STATUS(bx_xent_forward(&Z.t, &Tg.t, 2, &Lz.t, NULL, NULL, NULL), BX_ELAYOUT,
               "losses over logits");
  bx_xent_opts xo = BX_XENT_OPTS_DEFAULT;
  xo.struct_size = 1;
  CHECK_STATUS(bx_xent_forward(&Z.t, &Tg.t, 2, &L.t, NULL, NULL, &xo), BX_EINVAL, "struct_size");
  xo.struct_size = sizeof xo;
  xo.grad_scale = INFINITY;
  CHECK_STATUS(bx_xent_backward(&Z.t, &Tg.t, 3, &G.t, &xo), BX_EINVAL, "grad_scale");
  Z.t.dtype.bits = 64;
  CHECK_STATUS(bx_xent_forward(&Z.t, &Tg.t, 2, &L.t, NULL, NULL, NULL), BX_EDTYPE, "fp64 logits");
  Z.t.dtype.bits = 32;
  CHECK_STATUS(bx_xent_forward(&Z.t, NULL, 2, &L.t, NULL, NULL, NULL), BX_EINVAL, "NULL targets");
  CHECK_STATUS(bx_xent_forward(&Z.t, &Tg.t, 0, &L.t, NULL, NULL, NULL), BX_EINVAL, "C = 0");
  CHECK(memcmp(loss, loss0, sizeof loss) == 0 && memcmp(gz, gz0, sizeof gz) == 0 &&
            cnt[0] == 7 && cnt[1] == 7,
        "a failing cross-entropy call wrote its outputs");
  tg[0] = -3;
  CHECK_STATUS(bx_xent_count(&Tg.t, 2, &K.t, NULL), BX_EINVAL, "count: negative target");
  CHECK(cnt[0] == 7, "a failing count wrote");
  tg[0] = 1;
  CHECK_STATUS(bx_xent_forward_backward(&Z.t, &Tg.t, 3, 2, &L.t, &P.t, &K.t, &G.t, NULL), BX_OK,
               "good");
  CHECK(cnt[0] == 1 && cnt[1] == 2, "counts %lld %lld", (long long)cnt[0], (long long)cnt[1]);
}
