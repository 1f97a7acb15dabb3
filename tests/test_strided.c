/*
 * test_strided.c — any DLPack strides in bx_total_norm, bx_clip_grad_norm
 * and bx_scale (host tensors): views with gaps, permuted, negative and
 * zero strides, as torch's g[:, ::2], g.t(), g.flip(0), g.expand(4, 3).
 *
 * The reference is the dense copy of the logical elements (row-major,
 * made here by walking the view's indices): the norms of the views must
 * equal the norms of the copies bit for bit (every dtype, every p, threads,
 * groups, ISAs), and scaling a view must give the bits of scaling its
 * copy in every logical element and leave every other byte of the buffer
 * as it was. Layouts whose logical elements overlap cannot be scaled in
 * place (refused naming the tensor, nothing modified); two views that
 * really share a byte are refused, two interleaved but disjoint views
 * (the even and odd columns of one buffer) accepted.
 * Negative p: tests/test_negative_p.c.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "strided_views.h"
#include "tests.h"
#include "util.h"

#define NV 10 /* views per random set */

static const double P_LIST[] = {2, 1, INFINITY, -INFINITY, 0, 3, 0.5, -1, -0.5, -2};
#define NP (sizeof P_LIST / sizeof P_LIST[0])

/* The norms of the views and of their dense copies, in the same groups:
 * bitwise equal totals and group norms; returns the number of failures. */
static int compare_norms(const char *what, bxt_sview *v, size_t n, size_t ngroups, bxt_rng *r,
                         const double *plist, size_t np) {
  DLTensor sv[NV], dv[NV];
  bx_group gs[4], gd[4];
  size_t cut[5] = {0, 0, 0, 0, n};
  for (size_t g = 1; g < ngroups; g++) cut[g] = (size_t)bxt_below(r, n + 1);
  for (size_t g = 1; g < ngroups; g++) /* sorted cut points */
    for (size_t h = g + 1; h < ngroups; h++)
      if (cut[h] < cut[g]) {
        size_t t = cut[g];
        cut[g] = cut[h];
        cut[h] = t;
      }
  cut[ngroups] = n;
  for (size_t i = 0; i < n; i++) {
    sv[i] = v[i].t;
    dv[i] = v[i].dense.t;
  }
  for (size_t g = 0; g < ngroups; g++) {
    gs[g] = (bx_group){sv + cut[g], cut[g + 1] - cut[g]};
    gd[g] = (bx_group){dv + cut[g], cut[g + 1] - cut[g]};
  }
  int fails = 0;
  static const int threads[] = {1, 2, 3, 8};
  for (size_t pi = 0; pi < np; pi++) {
    bx_norm_opts o = BX_NORM_OPTS_DEFAULT;
    o.norm_type = plist[pi];
    o.norm_dtype = bxt_below(r, 3) ? BX_NORM_F64 : BX_NORM_GRADS;
    double want, wg[4];
    o.num_threads = 1;
    if (bx_total_norm(gd, ngroups, NULL, &o, &want, wg) != BX_OK) {
      fails += !CHECK(0, "%s: dense copies, p = %g: %s", what, plist[pi], bx_last_error());
      continue;
    }
    for (size_t ti = 0; ti < 4; ti++) {
      o.num_threads = threads[ti];
      double got = -1, gg[4] = {-1, -1, -1, -1};
      bx_status st = bx_total_norm(gs, ngroups, NULL, &o, &got, gg);
      fails += !CHECK_STATUS(st, BX_OK, "%s: views, p = %g, %d threads", what, plist[pi],
                             threads[ti]);
      fails += !CHECK_BITS_D(got, want, "%s: p = %g, %d threads: the view's norm is the copy's",
                             what, plist[pi], threads[ti]);
      for (size_t g = 0; g < ngroups; g++)
        fails += !CHECK_BITS_D(gg[g], wg[g], "%s: p = %g, group %zu", what, plist[pi], g);
      if (fails) return fails;
    }
  }
  return fails;
}

void test_strided_norms_random(void) {
  bxt_rng r;
  bxt_rng_init(&r);
  for (int round = 0; round < 60 && bxt_failures() == 0; round++) {
    bxt_sview v[NV];
    size_t n = 1 + (size_t)bxt_below(&r, NV);
    int mixed = bxt_below(&r, 2) == 0, dt0 = (int)bxt_below(&r, REF_NDT);
    for (size_t i = 0; i < n; i++)
      bxt_sview_random(&r, &v[i], mixed ? (int)bxt_below(&r, REF_NDT) : dt0, 0, 200);
    char what[64];
    snprintf(what, sizeof what, "round %d (%zu views)", round, n);
    compare_norms(what, v, n, 1 + (size_t)bxt_below(&r, 4), &r, P_LIST, NP);
    for (size_t i = 0; i < n; i++) bxt_sview_free(&v[i]);
  }
}

/* Views big enough for several pieces (2^18 elements) and gathers (2048):
 * a column block (long runs, read in place), every other column (runs of
 * one), a transposed one with row padding, an expanded row, a flipped
 * one; under every ISA. */
void test_strided_norms_large(void) {
  bxt_rng r;
  bxt_rng_init(&r);
  static const struct {
    int ndim;
    int64_t sh[3], st[3];
    const char *what;
  } cases[] = {
      {2, {300, 1000}, {1500, 1}, "column block [:, :1000] of 1500 columns"},
      {2, {700, 400}, {800, 2}, "every other column [:, ::2]"},
      {2, {400, 700}, {1, 420}, "transposed, rows padded to 420"},
      {2, {400, 700}, {0, 1}, "a row expanded 400 times"},
      {3, {3, 300, 350}, {-120000, 400, -1}, "flipped in two dims, gaps"},
  };
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    bxt_sview v[2];
    for (int k = 0; k < 2; k++)
      bxt_sview_make(&r, &v[k], k ? REF_BF16 : REF_F32, cases[c].ndim, cases[c].sh, cases[c].st);
    /* the ISA matters to p = 2 and 1 (the vector kernels) */
    static const double p_isa[] = {2, 1}, p_all[] = {2, 1, INFINITY, -INFINITY, 0, 0.5, -2};
    for (int isa = 0; isa < bxt_isa_count(); isa++) {
      if (!bxt_force(isa)) continue;
      char what[128];
      snprintf(what, sizeof what, "%s (%s)", cases[c].what, bxt_isa(isa));
      compare_norms(what, v, 2, 2, &r, p_isa, 2);
    }
    bxt_force(-1);
    compare_norms(cases[c].what, v, 2, 2, &r, p_all, sizeof p_all / sizeof p_all[0]);
    for (int k = 0; k < 2; k++) bxt_sview_free(&v[k]);
  }
}

/* Scale the views (one call) and their copies: the logical elements get
 * the copies' bits, every other byte of the buffers is unchanged. */
static void check_scaled(const char *what, bxt_sview *v, size_t n, double coef,
                         bx_scale_mode mode, int threads) {
  DLTensor sv[NV], dv[NV];
  bxt_tensor before[NV];
  for (size_t i = 0; i < n; i++) {
    bxt_tensor_clone(&before[i], &v[i].store);
    sv[i] = v[i].t;
    dv[i] = v[i].dense.t;
  }
  bx_scale_opts o = BX_SCALE_OPTS_DEFAULT;
  o.mode = mode;
  o.num_threads = threads;
  CHECK_STATUS(bx_scale(dv, n, coef, &o), BX_OK, "%s: the copies", what);
  CHECK_STATUS(bx_scale(sv, n, coef, &o), BX_OK, "%s: the views", what);
  for (size_t i = 0; i < n; i++) {
    CHECK(bxt_sview_matches(&v[i]), "%s: view %zu: every logical element has the copy's bits",
          what, i);
    CHECK(bxt_sview_gaps_kept(&v[i], &before[i]), "%s: view %zu: the bytes between elements "
          "are untouched", what, i);
    bxt_tensor_free(&before[i]);
  }
}

void test_strided_scale_random(void) {
  bxt_rng r;
  bxt_rng_init(&r);
  for (int round = 0; round < 60 && bxt_failures() == 0; round++) {
    bxt_sview v[NV];
    size_t n = 1 + (size_t)bxt_below(&r, NV);
    for (size_t i = 0; i < n; i++)
      bxt_sview_random(&r, &v[i], (int)bxt_below(&r, REF_NDT), 1, 300);
    char what[64];
    snprintf(what, sizeof what, "round %d", round);
    double coef = round % 5 == 0 ? 1.0 : ldexp(bxt_uniform(&r), -(int)bxt_below(&r, 30));
    check_scaled(what, v, n, coef, round % 2 ? BX_SCALE_EXACT : BX_SCALE_TORCH,
                 (int)(1 + bxt_below(&r, 8)));
    /* a clip: the same norm, coefficient and bits as on the copies */
    DLTensor sv[NV], dv[NV];
    for (size_t i = 0; i < n; i++) {
      sv[i] = v[i].t;
      dv[i] = v[i].dense.t;
    }
    bx_group gs = {sv, n}, gd = {dv, n};
    bx_clip_opts co = BX_CLIP_OPTS_DEFAULT;
    co.norm.norm_type = P_LIST[round % NP];
    co.scale.mode = round % 3 ? BX_SCALE_TORCH : BX_SCALE_EXACT;
    double tw = 0, cw = 0, tg = -1, cg = -1;
    bx_status sw = bx_clip_grad_norm(&gd, 1, NULL, 1e-3, &co, &tw, &cw);
    bx_status sg = bx_clip_grad_norm(&gs, 1, NULL, 1e-3, &co, &tg, &cg);
    CHECK(sw == BX_OK && sg == BX_OK, "%s: clips succeed (%s)", what, bx_last_error());
    CHECK_BITS_D(tg, tw, "%s: clip p = %g: total", what, co.norm.norm_type);
    CHECK_BITS_D(cg, cw, "%s: clip: coefficient", what);
    for (size_t i = 0; i < n; i++)
      CHECK(bxt_sview_matches(&v[i]), "%s: clip: view %zu scaled as its copy", what, i);
    for (size_t i = 0; i < n; i++) bxt_sview_free(&v[i]);
  }
}

void test_strided_scale_large(void) {
  bxt_rng r;
  bxt_rng_init(&r);
  int64_t sh1[2] = {600, 1000}, st1[2] = {1500, 1}, sh2[2] = {700, 400}, st2[2] = {-800, 2};
  int64_t sh3[3] = {2, 500, 600}, st3[3] = {700000, 1, 1300};
  bxt_sview v[3];
  bxt_sview_make(&r, &v[0], REF_F32, 2, sh1, st1);
  bxt_sview_make(&r, &v[1], REF_BF16, 2, sh2, st2);
  bxt_sview_make(&r, &v[2], REF_F16, 3, sh3, st3);
  check_scaled("large views, torch mode", v, 3, 0.3, BX_SCALE_TORCH, 3);
  check_scaled("large views, exact mode", v, 3, 0.7, BX_SCALE_EXACT, 8);
  for (int k = 0; k < 3; k++) bxt_sview_free(&v[k]);
}

/* ---- overlaps ------------------------------------------------------------ */

static uint64_t hash_bytes(const void *p, size_t n) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; i++) h = (h ^ ((const unsigned char *)p)[i]) * 1099511628211ull;
  return h;
}

/* views[0..n) on buf: bx_scale and bx_clip_grad_norm refuse them, naming
 * every word in names (at index ids), and leave buf as it was. */
static void expect_overlap(const char *what, DLTensor *views, size_t n, bxt_tensor *buf,
                           long a, long b) {
  uint64_t before = hash_bytes(buf->buf, buf->n * bxt_dt_size(buf->dt));
  CHECK_STATUS(bx_scale(views, n, 0.5, NULL), BX_ELAYOUT, "%s: bx_scale", what);
  CHECK(bxt_mentions(bx_last_error(), "tensor", a) && (b < 0 || bxt_mentions(bx_last_error(), "tensor", b)),
        "%s: names tensor %ld%s: \"%s\"", what, a, b < 0 ? "" : " and the other", bx_last_error());
  long loc = (long)bx_last_error_location()->tensor;
  CHECK(loc == a || loc == b, "%s: located at tensor %ld", what, loc);
  bx_group g = {views, n};
  double total = -1, coef = -1;
  CHECK_STATUS(bx_clip_grad_norm(&g, 1, NULL, 1e-6, NULL, &total, &coef), BX_ELAYOUT,
               "%s: bx_clip_grad_norm", what);
  CHECK(total == -1 && coef == -1, "%s: clip outputs untouched", what);
  CHECK(hash_bytes(buf->buf, buf->n * bxt_dt_size(buf->dt)) == before, "%s: nothing modified",
        what);
  /* norms read them all the same */
  CHECK_STATUS(bx_total_norm(&g, 1, NULL, NULL, &total, NULL), BX_OK, "%s: a norm", what);
}

static DLTensor view_of(bxt_tensor *buf, int ndim, int64_t *sh, int64_t *st, size_t first) {
  DLTensor t = buf->t;
  t.ndim = ndim;
  t.shape = sh;
  t.strides = st;
  t.byte_offset = first * bxt_dt_size(buf->dt);
  return t;
}

void test_strided_overlaps(void) {
  bxt_rng r;
  bxt_rng_init(&r);
  bxt_tensor buf;
  bxt_tensor_alloc(&buf, REF_F32, 64 * 64);
  bxt_fill_gradient(&r, &buf, 1.0);
  int64_t sh_e[2] = {4, 3}, st_e[2] = {0, 1};       /* g.expand(4, 3) */
  int64_t sh_o[2] = {4, 4}, st_o[2] = {1, 1};       /* overlapping strides */
  int64_t sh_m[2] = {4, 4}, st_m[2] = {4, 2};       /* overlap with gaps */
  int64_t sh_ok[2] = {3, 2}, st_ok[2] = {2, 3};     /* strides that might overlap, do not */
  int64_t sh_c[2] = {64, 32}, st_c2[2] = {64, 2};   /* g[:, 0::2], g[:, 1::2] */
  int64_t sh_3[2] = {64, 22}, st_3[2] = {64, 3};    /* g[:, 0::3] */
  int64_t st_col[1] = {64};                         /* one column */
  int64_t sh_d[1] = {64};                           /* one dense row */
  DLTensor dense0 = view_of(&buf, 1, sh_d, NULL, 64 * 63);
  {
    DLTensor v[2] = {dense0, view_of(&buf, 2, sh_e, st_e, 0)};
    expect_overlap("an expanded view", v, 2, &buf, 1, -1);
    CHECK(strstr(bx_last_error(), "expanded") != NULL, "says expanded: %s", bx_last_error());
    v[1] = view_of(&buf, 2, sh_o, st_o, 0);
    expect_overlap("strides [1, 1]", v, 2, &buf, 1, -1);
    v[1] = view_of(&buf, 2, sh_m, st_m, 0);
    expect_overlap("strides [4, 2] on [4, 4]", v, 2, &buf, 1, -1);
    v[1] = view_of(&buf, 2, sh_ok, st_ok, 0);
    CHECK_STATUS(bx_scale(v, 2, 1.0, NULL), BX_OK, "strides [2, 3] on [3, 2]: disjoint");
  }
  {
    DLTensor v[3] = {view_of(&buf, 2, sh_c, st_c2, 0), view_of(&buf, 2, sh_c, st_c2, 1), dense0};
    bxt_tensor copy;
    bxt_tensor_clone(&copy, &buf);
    CHECK_STATUS(bx_scale(v, 2, 0.25, NULL), BX_OK, "even and odd columns: disjoint");
    CHECK_STATUS(bx_scale(&copy.t, 1, 0.25, NULL), BX_OK, "the whole buffer");
    CHECK(memcmp(copy.buf, buf.buf, buf.n * 4) == 0, "even + odd columns = the whole buffer");
    bxt_tensor_free(&copy);
    v[2] = view_of(&buf, 2, sh_3, st_3, 0);
    expect_overlap("g[:, 0::2] and g[:, 0::3] share column 0", v, 3, &buf, 0, 2);
    v[2] = view_of(&buf, 1, sh_d, NULL, 64 * 5);
    expect_overlap("even and odd columns and a dense row", v, 3, &buf, 2, 0);
    v[2] = v[0];
    expect_overlap("the same strided view twice", v, 3, &buf, 0, 2);
  }
  { /* every column of one buffer as its own tensor: all interleaved */
    DLTensor cols[64];
    int64_t shc[1] = {64};
    for (size_t j = 0; j < 64; j++) cols[j] = view_of(&buf, 1, shc, st_col, j);
    CHECK_STATUS(bx_scale(cols, 64, 2.0, NULL), BX_OK, "64 columns of one buffer");
    cols[40] = view_of(&buf, 1, shc, st_col, 7);
    expect_overlap("column 7 twice among 64", cols, 64, &buf, 7, 40);
  }
  { /* a partial overlap of element bytes: fp16 view into fp32 data */
    DLTensor v[2] = {view_of(&buf, 2, sh_c, st_c2, 0), buf.t};
    v[1].dtype = bxt_dl_dtype(REF_F16);
    int64_t sh16[1] = {4}, st16[1] = {4};
    v[1].shape = sh16;
    v[1].strides = st16;
    v[1].ndim = 1;
    v[1].byte_offset = 64 * 4 * 10 + 2 + 4; /* the upper halves of (10, 1), (10, 3), ... */
    CHECK_STATUS(bx_scale(v, 2, 1.0, NULL), BX_OK, "fp16 halves of odd fp32 columns vs even "
                 "columns: disjoint");
    /* ... and of (10, 0), (10, 2), ...: even columns' bytes */
    v[1].byte_offset = 64 * 4 * 10 + 2;
    expect_overlap("fp16 halves of even fp32 columns", v, 2, &buf, 0, 1);
  }
  { /* interleaved over more than the exact check handles: refused, clearly */
    int64_t shh[1] = {2}, sth[1] = {(int64_t)1 << 31};
    DLTensor v[2] = {view_of(&buf, 1, shh, sth, 0), view_of(&buf, 1, shh, sth, 1)};
    CHECK_STATUS(bx_scale(v, 2, 0.5, NULL), BX_ELAYOUT, "2^33-byte interleave");
    CHECK(strstr(bx_last_error(), "cannot decide") != NULL, "says why: %s", bx_last_error());
  }
  bxt_tensor_free(&buf);
}

/* CUDA tensors stay dense-only, with a message saying so (no device needed:
 * the check runs before anything touches the device). */
void test_strided_cuda_dense_only(void) {
  bxt_tensor buf;
  bxt_tensor_alloc(&buf, REF_F32, 100);
  int64_t sh[2] = {5, 5}, st[2] = {10, 2};
  DLTensor t = view_of(&buf, 2, sh, st, 0);
  t.device.device_type = kDLCUDA;
  CHECK_STATUS(bx_scale(&t, 1, 0.5, NULL), BX_ELAYOUT, "bx_scale: a strided CUDA tensor");
  CHECK(strstr(bx_last_error(), "non-dense CUDA tensors are not supported: pass .contiguous()"),
        "the message: %s", bx_last_error());
  bx_group g = {&t, 1};
  double total = -1, coef = -1;
  CHECK_STATUS(bx_clip_grad_norm(&g, 1, NULL, 1.0, NULL, &total, &coef), BX_ELAYOUT,
               "bx_clip_grad_norm: a strided CUDA tensor");
  CHECK(strstr(bx_last_error(), "pass .contiguous()"), "the message: %s", bx_last_error());
  bxt_tensor_free(&buf);
}
