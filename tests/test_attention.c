/*
 * test_attention.c — bx_attention_forward / bx_attention_backward
 * (bitexact_train.h, "Layers: causal GQA attention"): bit for bit against
 * the documented order written as whole matrices (attention_ref.h), within
 * a stated first-order error bound of an fp64 reference (whose gradient is
 * itself checked by central finite differences), and for invariance: a
 * sequence alone or anywhere in a batch of others, thread counts 1/2/3/8,
 * every ISA this CPU has. Special values, and bad input (named errors,
 * nothing written). The tiling's edges: test_attention_tiles.c.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attention_prob.h"
#include "tests.h"

void test_attention_vs_reference(void) {
  bxt_rng r;
  bxt_rng_init(&r);
  static const size_t Ds[] = {1, 3, 8, 17, 33, 64};
  static const size_t Rs[] = {1, 2, 4};
  for (int rep = 0; rep < 24 && !bxt_failures(); rep++) {
    size_t R = Rs[rep % 3], Hkv = 1 + bxt_below(&r, 2), D = Ds[bxt_below(&r, 6)];
    size_t L = rep % 6 == 0 ? 1 : 1 + bxt_below(&r, 33), B = 1 + bxt_below(&r, 3);
    if (rep % 8 == 5) L = 70 + bxt_below(&r, 60); /* several row blocks per head */
    double sq = rep % 4 == 3 ? 8.0 : 1.0; /* peaked softmax too */
    aprob a;
    ap_make(&a, B, L, Hkv * R, Hkv, D);
    ap_fill(&r, &a, sq);
    int isa = rep % bxt_isa_count(); /* each ISA in turn */
    if (!bxt_force(isa)) isa = -1;
    char what[160];
    snprintf(what, sizeof what, "seed %llu rep %d isa %s B %zu L %zu Hq %zu Hkv %zu D %zu",
             (unsigned long long)bxt_seed(), rep, isa < 0 ? "auto" : bxt_isa(isa), B, L, Hkv * R,
             Hkv, D);
    CHECK_STATUS(ap_fwd(&a, 2), BX_OK, "%s forward", what);
    CHECK_STATUS(ap_bwd(&a, 2), BX_OK, "%s backward", what);
    check_problem(&a, what);
    ap_free(&a);
  }
  bxt_force(-1);
  CHECK_BITS_F(achain_scale(128), bx_rsqrt_f32(128.0f), "scale for D = 128");
  for (size_t D = 1; D <= 4096; D++)
    if (!CHECK_BITS_F(achain_scale(D), bx_rsqrt_f32((float)D), "scale for D = %zu", D)) break;
}

/* The fp64 reference's gradient against central differences of its forward
 * (loss = sum dout * o), in fp64: step h = 1e-5 (|x| ~ 1), truncation error
 * O(h^2 f''') ~ 1e-10, cancellation ~ 1e-16 / h ~ 1e-11: tolerance 1e-7. */
void test_attention_reference_gradient(void) {
  bxt_rng r;
  bxt_rng_init(&r);
  ashape s = {2, 5, 4, 2, 3};
  size_t T = s.B * s.L, nq = T * s.Hq * s.D, nk = T * s.Hkv * s.D;
  double *x = malloc((2 * nq + 2 * nk) * sizeof(double)), *q = x, *k = q + nq, *v = k + nk,
         *d = v + nk;
  for (size_t i = 0; i < 2 * nq + 2 * nk; i++) x[i] = bxt_normal(&r);
  double *buf = malloc((2 * nq + 2 * nk) * sizeof(double));
  aref_out g = {buf, buf + nq, buf + 2 * nq, buf + 2 * nq + nk, NULL, NULL, NULL, NULL};
  aref_run(&s, q, k, v, d, &g);
  double *grad = malloc((nq + 2 * nk) * sizeof(double));
  memcpy(grad, g.dq, (nq + 2 * nk) * sizeof(double)); /* dq, dk, dv are contiguous in buf */
  double *obuf = malloc((2 * nq + 2 * nk) * sizeof(double));
  aref_out f = {obuf, obuf + nq, obuf + 2 * nq, obuf + 2 * nq + nk, NULL, NULL, NULL, NULL};
  for (size_t e = 0; e < nq + 2 * nk; e++) { /* q, k, v are contiguous in x */
    double keep = x[e], h = 1e-5, lp = 0, lm = 0;
    x[e] = keep + h;
    aref_run(&s, q, k, v, d, &f);
    for (size_t i = 0; i < nq; i++) lp += d[i] * f.o[i];
    x[e] = keep - h;
    aref_run(&s, q, k, v, d, &f);
    for (size_t i = 0; i < nq; i++) lm += d[i] * f.o[i];
    x[e] = keep;
    double fd = (lp - lm) / (2 * h);
    if (!CHECK(fabs(fd - grad[e]) <= 1e-7 * (1 + fabs(grad[e])),
               "element %zu of (q, k, v): gradient %.12g, central difference %.12g", e, grad[e], fd))
      break;
  }
  free(x);
  free(buf);
  free(grad);
  free(obuf);
}

/* ---- invariance -------------------------------------------------------------- */

/* copies sequence sb of src into sequence db of dst (inputs only) */
static void copy_seq(aprob *dst, size_t db, const aprob *src, size_t sb) {
  size_t L = src->s.L, fq = src->s.Hq * src->s.D, fk = src->s.Hkv * src->s.D;
  memcpy(dst->q + db * L * fq, src->q + sb * L * fq, L * fq * 4);
  memcpy(dst->dout + db * L * fq, src->dout + sb * L * fq, L * fq * 4);
  memcpy(dst->k + db * L * fk, src->k + sb * L * fk, L * fk * 4);
  memcpy(dst->v + db * L * fk, src->v + sb * L * fk, L * fk * 4);
}

/* sequence db of x against sequence sb of y, every output */
static int same_seq(const aprob *x, size_t xb, const aprob *y, size_t yb, const char *what) {
  size_t L = x->s.L, fq = x->s.Hq * x->s.D, fk = x->s.Hkv * x->s.D, fs = x->s.Hq * 2;
  char w[200];
  int ok = 1;
  const float *xs[5] = {x->o, x->stats, x->dq, x->dk, x->dv}, *ys[5] = {y->o, y->stats, y->dq, y->dk, y->dv};
  size_t f[5] = {fq, fs, fq, fk, fk};
  static const char *nm[5] = {"o", "stats", "dq", "dk", "dv"};
  for (int t = 0; t < 5 && ok; t++) {
    snprintf(w, sizeof w, "%s: %s of the sequence", what, nm[t]);
    ok = same_bits(xs[t] + xb * L * f[t], ys[t] + yb * L * f[t], L * f[t], w);
  }
  return ok;
}

void test_attention_batch_invariance(void) {
  bxt_rng r;
  bxt_rng_init(&r);
  static const size_t Rs[] = {1, 2, 4};
  for (int rep = 0; rep < 6 && !bxt_failures(); rep++) {
    size_t R = Rs[rep % 3], Hkv = 2, D = rep < 3 ? 16 : 13, L = 9 + bxt_below(&r, 20);
    aprob one, pool;
    ap_make(&one, 1, L, Hkv * R, Hkv, D);
    ap_make(&pool, 6, L, Hkv * R, Hkv, D);
    ap_fill(&r, &pool, 2.0);
    copy_seq(&one, 0, &pool, 0);
    CHECK_STATUS(ap_fwd(&one, 1), BX_OK, "alone");
    CHECK_STATUS(ap_bwd(&one, 1), BX_OK, "alone");
    for (size_t B = 2; B <= 6; B++) { /* the sequence at position B-1 of B, others random */
      aprob bat;
      ap_make(&bat, B, L, Hkv * R, Hkv, D);
      ap_fill(&r, &bat, 2.0);
      copy_seq(&bat, B - 1, &pool, 0);
      CHECK_STATUS(ap_fwd(&bat, 3), BX_OK, "batch");
      CHECK_STATUS(ap_bwd(&bat, 3), BX_OK, "batch");
      char what[160];
      snprintf(what, sizeof what, "seed %llu R %zu L %zu: alone vs at %zu of %zu",
               (unsigned long long)bxt_seed(), R, L, B - 1, B);
      same_seq(&bat, B - 1, &one, 0, what);
      ap_free(&bat);
    }
    /* prefixes: f(x[:k sequences]) == f(x)[:k] */
    CHECK_STATUS(ap_fwd(&pool, 4), BX_OK, "pool");
    CHECK_STATUS(ap_bwd(&pool, 4), BX_OK, "pool");
    for (size_t kb = 1; kb < 6; kb++) {
      aprob pre;
      ap_make(&pre, kb, L, Hkv * R, Hkv, D);
      for (size_t b = 0; b < kb; b++) copy_seq(&pre, b, &pool, b);
      CHECK_STATUS(ap_fwd(&pre, 2), BX_OK, "prefix");
      CHECK_STATUS(ap_bwd(&pre, 2), BX_OK, "prefix");
      for (size_t b = 0; b < kb; b++) {
        char what[160];
        snprintf(what, sizeof what, "seed %llu R %zu: prefix of %zu, sequence %zu",
                 (unsigned long long)bxt_seed(), R, kb, b);
        same_seq(&pre, b, &pool, b, what);
      }
      ap_free(&pre);
    }
    ap_free(&one);
    ap_free(&pool);
  }
}

void test_attention_threads_isa(void) {
  bxt_rng r;
  bxt_rng_init(&r);
  aprob base, x;
  ap_make(&base, 3, 70, 8, 2, 40);
  ap_make(&x, 3, 70, 8, 2, 40);
  ap_fill(&r, &base, 1.5);
  copy_seq(&x, 0, &base, 0);
  copy_seq(&x, 1, &base, 1);
  copy_seq(&x, 2, &base, 2);
  CHECK_STATUS(ap_fwd(&base, 1), BX_OK, "1 thread");
  CHECK_STATUS(ap_bwd(&base, 1), BX_OK, "1 thread");
  static const int th[] = {1, 2, 3, 8, 0};
  for (int isa = -1; isa < bxt_isa_count(); isa++) {
    if (isa >= 0 && !bxt_force(isa)) continue;
    for (int t = 0; t < 5; t++) {
      memset(x.o, 0xff, x.nq * 4);
      memset(x.dk, 0xff, x.nk * 4);
      CHECK_STATUS(ap_fwd(&x, th[t]), BX_OK, "forward");
      CHECK_STATUS(ap_bwd(&x, th[t]), BX_OK, "backward");
      char what[120];
      snprintf(what, sizeof what, "isa %s, %d threads vs 1", isa < 0 ? "auto" : bxt_isa(isa), th[t]);
      for (size_t b = 0; b < 3; b++) same_seq(&x, b, &base, b, what);
    }
  }
  bxt_force(-1);
  check_problem(&base, "threads problem");
  ap_free(&base);
  ap_free(&x);
}


/* ---- special values ------------------------------------------------------------ */

void test_attention_special_values(void) {
  bxt_rng r;
  bxt_rng_init(&r);
  /* L = 1: p = 1, o = v (with -0 read as +0), dq = dk = +0, dv = dout */
  aprob a;
  ap_make(&a, 4, 1, 3, 3, 5);
  ap_fill(&r, &a, 1.0);
  a.v[2] = -0.0f;
  a.dout[3] = -0.0f;
  CHECK_STATUS(ap_fwd(&a, 2), BX_OK, "L = 1");
  CHECK_STATUS(ap_bwd(&a, 2), BX_OK, "L = 1");
  for (size_t i = 0; i < a.nq; i++) {
    float want = a.v[i] + 0.0f, wdv = a.dout[i] + 0.0f;
    CHECK_BITS_F(a.o[i], want, "L = 1: o[%zu] = v", i);
    CHECK_BITS_F(a.dq[i], 0.0f, "L = 1: dq[%zu] = +0", i);
    CHECK_BITS_F(a.dk[i], 0.0f, "L = 1: dk[%zu] = +0", i);
    CHECK_BITS_F(a.dv[i], wdv, "L = 1: dv[%zu] = dout", i);
  }
  for (size_t t = 0; t < a.T * 3; t++) CHECK_BITS_F(a.stats[2 * t + 1], 1.0f, "L = 1: l = 1");
  ap_free(&a);
  /* huge scores (|s| ~ 1e30): no overflow, finite, the documented bits */
  ap_make(&a, 2, 17, 4, 2, 7);
  ap_fill(&r, &a, 1e15);
  for (size_t i = 0; i < a.nk; i++) a.k[i] *= 1e15f;
  CHECK_STATUS(ap_fwd(&a, 2), BX_OK, "huge scores");
  CHECK_STATUS(ap_bwd(&a, 2), BX_OK, "huge scores");
  int finite = 1;
  for (size_t i = 0; i < a.nq; i++) finite &= isfinite(a.o[i]) && isfinite(a.dq[i]);
  for (size_t i = 0; i < a.nk; i++) finite &= isfinite(a.dk[i]) && isfinite(a.dv[i]);
  CHECK(finite, "huge scores: every output finite");
  float *o = malloc(a.nq * 4), *st = malloc(a.nst * 4);
  achain_forward(&a.s, a.q, a.k, a.v, o, st);
  same_bits(a.o, o, a.nq, "huge scores: o vs the documented order");
  free(o);
  free(st);
  ap_free(&a);
  /* a -Inf and a NaN in sequence 1 make NaN there and nowhere else */
  ap_make(&a, 3, 6, 2, 1, 4);
  ap_fill(&r, &a, 1.0);
  aprob c;
  ap_make(&c, 3, 6, 2, 1, 4);
  memcpy(c.q, a.q, a.nq * 4);
  memcpy(c.k, a.k, a.nk * 4);
  memcpy(c.v, a.v, a.nk * 4);
  memcpy(c.dout, a.dout, a.nq * 4);
  c.k[(6 + 2) * 4 + 1] = -INFINITY; /* sequence 1, position 2 */
  c.q[(6 + 4) * 8 + 5] = NAN;       /* sequence 1, position 4, head 1 */
  CHECK_STATUS(ap_fwd(&a, 1), BX_OK, "clean");
  CHECK_STATUS(ap_bwd(&a, 1), BX_OK, "clean");
  CHECK_STATUS(ap_fwd(&c, 3), BX_OK, "with -Inf");
  CHECK_STATUS(ap_bwd(&c, 3), BX_OK, "with -Inf");
  same_seq(&c, 0, &a, 0, "non-finite in another sequence (0)");
  same_seq(&c, 2, &a, 2, "non-finite in another sequence (2)");
  CHECK(isnan(c.o[(6 + 4) * 8 + 5]), "the NaN's row is NaN");
  /* in sequence 1, the documented order (a NaN of any payload for a NaN) */
  float *co = malloc(c.nq * 4), *cs = malloc(c.nst * 4);
  achain_forward(&c.s, c.q, c.k, c.v, co, cs);
  for (size_t i = 6 * 8; i < 12 * 8; i++)
    if (!CHECK(isnan(co[i]) ? isnan(c.o[i]) : bxt_fbits(co[i]) == bxt_fbits(c.o[i]),
               "non-finite inputs: o[%zu] = %a, the documented order %a", i, (double)c.o[i],
               (double)co[i]))
      break;
  free(co);
  free(cs);
  ap_free(&a);
  ap_free(&c);
}

/* ---- bad input --------------------------------------------------------------------- */

typedef struct snap {
  unsigned char *bytes[5];
  size_t n[5];
} snap;

static void snap_take(snap *s, const aprob *a) {
  const float *p[5] = {a->o, a->stats, a->dq, a->dk, a->dv};
  size_t n[5] = {a->nq, a->nst, a->nq, a->nk, a->nk};
  for (int i = 0; i < 5; i++) {
    s->n[i] = n[i] * 4;
    s->bytes[i] = malloc(s->n[i] + 1);
    memcpy(s->bytes[i], p[i], s->n[i]);
  }
}

static int snap_same(snap *s, const aprob *a) {
  const float *p[5] = {a->o, a->stats, a->dq, a->dk, a->dv};
  int ok = 1;
  for (int i = 0; i < 5; i++) {
    ok &= memcmp(s->bytes[i], p[i], s->n[i]) == 0;
    free(s->bytes[i]);
  }
  return ok;
}

typedef struct acall {
  const DLTensor *t[8]; /* forward: q k v o stats; backward: dout q k v stats dq dk dv */
  int64_t L, Hq, Hkv, D;
  const bx_attention_opts *opts;
} acall;

static void acall_fwd(acall *c, aprob *a) {
  memset(c, 0, sizeof *c);
  const DLTensor *t[5] = {&a->tq, &a->tk, &a->tv, &a->to, &a->tst};
  memcpy(c->t, t, sizeof t);
  c->L = (int64_t)a->s.L;
  c->Hq = (int64_t)a->s.Hq;
  c->Hkv = (int64_t)a->s.Hkv;
  c->D = (int64_t)a->s.D;
}

static void acall_bwd(acall *c, aprob *a) {
  acall_fwd(c, a);
  const DLTensor *t[8] = {&a->tdo, &a->tq, &a->tk, &a->tv, &a->tst, &a->tdq, &a->tdk, &a->tdv};
  memcpy(c->t, t, sizeof t);
}

static void expect(aprob *a, const acall *c, int bwd, bx_status want, const char *word,
                   const char *what) {
  snap s;
  snap_take(&s, a);
  bx_status st = bwd ? bx_attention_backward(c->t[0], c->t[1], c->t[2], c->t[3], c->t[4], c->L,
                                             c->Hq, c->Hkv, c->D, (DLTensor *)c->t[5],
                                             (DLTensor *)c->t[6], (DLTensor *)c->t[7], c->opts)
                     : bx_attention_forward(c->t[0], c->t[1], c->t[2], c->L, c->Hq, c->Hkv, c->D,
                                            (DLTensor *)c->t[3], (DLTensor *)c->t[4], c->opts);
  const char *fn = bwd ? "bx_attention_backward" : "bx_attention_forward";
  CHECK_STATUS(st, want, "%s: %s", fn, what);
  CHECK(strstr(bx_last_error(), fn) && strstr(bx_last_error(), word),
        "%s: %s: message '%s' should name the function and '%s'", fn, what, bx_last_error(), word);
  CHECK(snap_same(&s, a), "%s: %s: an output was written", fn, what);
}

void test_attention_bad_input(void) {
  bxt_rng r;
  bxt_rng_init(&r);
  aprob a;
  ap_make(&a, 2, 5, 4, 2, 3); /* T 10, q [10, 12], k [10, 6] */
  ap_fill(&r, &a, 1.0);
  for (size_t i = 0; i < a.nq; i++) a.o[i] = a.dq[i] = 7.0f;
  aprob w; /* wrongly shaped buffers: T 9, q-sized and k-sized */
  ap_make(&w, 1, 9, 4, 2, 3);
  DLTensor bad;
  int64_t sh3[3] = {2, 4, 12}, shs3[3] = {10, 4, 3}, str[2] = {1, 10};
  for (int bwd = 0; bwd < 2; bwd++) {
    acall c;
    int iq = bwd ? 1 : 0, ik = iq + 1, iv = iq + 2, iout = bwd ? 5 : 3, ist = 4;
#define RESET() (bwd ? acall_bwd(&c, &a) : acall_fwd(&c, &a))
    RESET();
    c.t[iq] = NULL;
    expect(&a, &c, bwd, BX_EINVAL, "(q) is NULL", "NULL q");
    RESET();
    c.t[iout] = NULL;
    expect(&a, &c, bwd, BX_EINVAL, bwd ? "tensor 5 (dq) is NULL" : "tensor 3 (o) is NULL", "NULL out");
    RESET();
    c.t[ik] = &w.tk; /* 9 tokens */
    expect(&a, &c, bwd, BX_EINVAL, "(k) has 9 tokens", "k with 9 tokens");
    RESET();
    c.t[iv] = &a.tq; /* [10, 12] for a kv tensor */
    expect(&a, &c, bwd, BX_EINVAL, "(v): last dimension 12", "v shaped like q");
    RESET();
    c.Hkv = 3;
    expect(&a, &c, bwd, BX_EINVAL, "not a multiple of num_kv_heads", "Hq 4, Hkv 3");
    RESET();
    c.D = 4;
    expect(&a, &c, bwd, BX_EINVAL, "last dimension", "head_dim 4 for [T, 12]");
    RESET();
    c.L = 3;
    expect(&a, &c, bwd, BX_EINVAL, "not a multiple of seq_len", "T 10, seq_len 3");
    RESET();
    c.L = 0;
    expect(&a, &c, bwd, BX_EINVAL, "seq_len", "seq_len 0");
    RESET();
    c.Hq = 0;
    expect(&a, &c, bwd, BX_EINVAL, "num_heads", "num_heads 0");
    RESET();
    c.D = 0;
    expect(&a, &c, bwd, BX_EINVAL, "head_dim", "head_dim 0");
    bad = a.tq;
    bad.dtype.bits = 64;
    RESET();
    c.t[iq] = &bad;
    expect(&a, &c, bwd, BX_EDTYPE, "(q) has dtype", "fp64 q");
    bad = a.tst;
    bad.dtype.code = kDLBfloat;
    bad.dtype.bits = 16;
    RESET();
    c.t[ist] = &bad;
    expect(&a, &c, bwd, BX_EDTYPE, "tensor 4 (stats)", "bf16 stats");
    bad = a.tk;
    bad.device.device_type = kDLCUDA;
    RESET();
    c.t[ik] = &bad;
    expect(&a, &c, bwd, BX_EDEVICE, "(k) is on device", "CUDA k");
    bad = a.tk;
    bad.strides = str;
    RESET();
    c.t[ik] = &bad;
    expect(&a, &c, bwd, BX_ELAYOUT, "(k) is not row-major", "transposed k");
    bad = a.tv;
    bad.byte_offset = 2;
    RESET();
    c.t[iv] = &bad;
    expect(&a, &c, bwd, BX_ELAYOUT, "(v): data + byte_offset", "misaligned v");
    bad = a.tq;
    bad.data = NULL;
    RESET();
    c.t[iq] = &bad;
    expect(&a, &c, bwd, BX_EINVAL, "(q): data is NULL", "NULL data");
    bad = a.tq;
    bad.shape = sh3; /* [2, 4, 12]: seq_len 5 but L 4 */
    bad.ndim = 3;
    RESET();
    c.t[iq] = &bad;
    expect(&a, &c, bwd, BX_EINVAL, "(q)", "3-D q with L 4");
    bad = a.tst;
    bad.shape = shs3;
    RESET();
    c.t[ist] = &bad;
    expect(&a, &c, bwd, BX_EINVAL, "tensor 4 (stats): last dimension 3", "stats [T, Hq, 3]");
    bad = a.tq;
    bad.ndim = 1;
    RESET();
    c.t[iq] = &bad;
    expect(&a, &c, bwd, BX_EINVAL, "dimensions", "1-D q");
    /* overlaps: an output on an input, two outputs on each other */
    RESET();
    c.t[iout] = &a.tq;
    expect(&a, &c, bwd, BX_ELAYOUT, "overlaps tensor", "output on q");
    if (bwd) {
      RESET();
      c.t[7] = &a.tdk; /* dv = dk */
      expect(&a, &c, bwd, BX_ELAYOUT, "(dk) overlaps tensor 7 (dv)", "dv on dk");
    } else {
      bad = a.to; /* o shifted by one element: overlaps the real o? use stats on o */
      RESET();
      DLTensor so = a.tst;
      so.data = a.o;
      c.t[4] = &so;
      expect(&a, &c, bwd, BX_ELAYOUT, "(o) overlaps tensor 4 (stats)", "stats on o");
    }
    bx_attention_opts o = BX_ATTENTION_OPTS_DEFAULT;
    o.struct_size = 3;
    RESET();
    c.opts = &o;
    expect(&a, &c, bwd, BX_EINVAL, "struct_size", "struct_size 3");
    o = (bx_attention_opts)BX_ATTENTION_OPTS_DEFAULT;
    o.num_threads = -2;
    expect(&a, &c, bwd, BX_EINVAL, "num_threads", "num_threads -2");
#undef RESET
  }
  /* and good calls still work after all that */
  CHECK_STATUS(ap_fwd(&a, 0), BX_OK, "good forward");
  CHECK_STATUS(ap_bwd(&a, 0), BX_OK, "good backward");
  check_problem(&a, "after errors");
  /* T = 0: nothing to do, OK */
  aprob z;
  ap_make(&z, 0, 4, 2, 1, 3);
  CHECK_STATUS(ap_fwd(&z, 0), BX_OK, "T = 0 forward");
  CHECK_STATUS(ap_bwd(&z, 0), BX_OK, "T = 0 backward");
  ap_free(&z);
  ap_free(&w);
  ap_free(&a);
}
