/*
 * test_errors.c — bad input, each case its own check, through every entry
 * point that takes tensors (bx_total_norm, bx_scale, bx_clip_grad_norm,
 * bx_acc_add_squares): the status, bx_last_error() naming the group and
 * tensor index, outputs untouched and no gradient modified.
 *
 * Where the header names no status for a case (negative shapes, ndim < 0,
 * shapes whose byte size overflows, negative strides) any of BX_EINVAL /
 * BX_ELAYOUT is accepted: what matters is that it is refused, named, and
 * nothing is written.
 */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checks.h"
#include "harness.h"
#include "tests.h"
#include "util.h"

#define SENTINEL -4242.5

void test_errors_status_and_version(void) {
  static const char *names[] = {"BX_OK",       "BX_EINVAL",  "BX_EDTYPE", "BX_EDEVICE",
                                "BX_ELAYOUT",  "BX_ENONFINITE", "BX_ENOMEM", "BX_ECOMM",
                                "BX_EMISMATCH", "BX_EINTERNAL"};
  for (int s = 0; s <= BX_EINTERNAL; s++) {
    const char *t = bx_status_str((bx_status)s);
    CHECK(t != NULL && t[0] != '\0', "bx_status_str(%d) is a text", s);
    if (t) CHECK(strstr(t, names[s]) != NULL, "bx_status_str(%d) = \"%s\" names %s", s, t, names[s]);
  }
  CHECK(bx_status_str((bx_status)1234) != NULL, "unknown status: still a text");
  CHECK(bx_status_str((bx_status)-1) != NULL, "negative status: still a text");
  CHECK(bx_version() == BX_VERSION_NUMBER, "bx_version() %u == BX_VERSION_NUMBER %d",
        bx_version(), BX_VERSION_NUMBER);
}

/* ---- one bad tensor through every entry point ------------------------ */

typedef struct fixture {
  bxt_tensor good[4];  /* fp32, bf16, fp64, fp16 */
  bxt_tensor badbuf;   /* memory behind the bad tensor: readable, 64 KiB */
} fixture;

static void fixture_make(fixture *f) {
  bxt_rng r;
  bxt_rng_init(&r);
  static const int dts[4] = {REF_F32, REF_BF16, REF_F64, REF_F16};
  for (int k = 0; k < 4; k++) {
    bxt_tensor_alloc(&f->good[k], dts[k], 300);
    bxt_fill_gradient(&r, &f->good[k], 1.0);
  }
  bxt_tensor_alloc(&f->badbuf, REF_F64, 8192);
  bxt_fill_gradient(&r, &f->badbuf, 1.0);
}

static void fixture_free(fixture *f) {
  for (int k = 0; k < 4; k++) bxt_tensor_free(&f->good[k]);
  bxt_tensor_free(&f->badbuf);
}

/* A view on the bad buffer with the fixture's defaults: fp32, 1-D, 100. */
static DLTensor bad_base(fixture *f, int64_t *shape) {
  DLTensor t = f->badbuf.t;
  t.dtype = bxt_dl_dtype(REF_F32);
  shape[0] = 100;
  t.shape = shape;
  t.ndim = 1;
  t.strides = NULL;
  return t;
}

static int status_in(bx_status s, const bx_status *allowed, int n) {
  for (int i = 0; i < n; i++)
    if (s == allowed[i]) return 1;
  return 0;
}

static uint64_t fingerprint(const fixture *f) {
  uint64_t h = 1469598103934665603ull;
  for (int k = 0; k < 4; k++) {
    const unsigned char *p = f->good[k].buf;
    for (size_t i = 0; i < f->good[k].n * bxt_dt_size(f->good[k].dt); i++)
      h = (h ^ p[i]) * 1099511628211ull;
  }
  const unsigned char *p = f->badbuf.buf;
  for (size_t i = 0; i < 8192 * 8; i++) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

/* bad sits at group 1, tensor 2 for the norm and the clip, and at index 2
 * of bx_scale's array. */
static void expect_refused(fixture *f, const char *what, DLTensor bad, const bx_status *allowed,
                           int nallowed) {
  uint64_t before = fingerprint(f);
  DLTensor dl[5] = {f->good[0].t, f->good[1].t, f->good[2].t, f->good[3].t, bad};
  /* groups: {good0, good1}, {good2, good3, bad} */
  bx_group g[2] = {{dl, 2}, {dl + 2, 3}};
  double total = SENTINEL, gn[2] = {SENTINEL, SENTINEL}, coef = SENTINEL;
  bx_status st = bx_total_norm(g, 2, NULL, NULL, &total, gn);
  CHECK(status_in(st, allowed, nallowed), "%s: bx_total_norm status %d (%s); \"%s\"", what,
        (int)st, bx_status_str(st), bx_last_error());
  CHECK(bxt_mentions(bx_last_error(), "group", 1) && bxt_mentions(bx_last_error(), "tensor", 2),
        "%s: bx_total_norm names group 1, tensor 2: \"%s\"", what, bx_last_error());
  CHECK(total == SENTINEL && gn[0] == SENTINEL && gn[1] == SENTINEL,
        "%s: bx_total_norm wrote an output", what);

  DLTensor sc[3] = {f->good[0].t, f->good[1].t, bad};
  st = bx_scale(sc, 3, 0.5, NULL);
  CHECK(status_in(st, allowed, nallowed), "%s: bx_scale status %d (%s); \"%s\"", what, (int)st,
        bx_status_str(st), bx_last_error());
  CHECK(bxt_mentions(bx_last_error(), "tensor", 2), "%s: bx_scale names tensor 2: \"%s\"", what,
        bx_last_error());

  st = bx_clip_grad_norm(g, 2, NULL, 1e-3, NULL, &total, &coef);
  CHECK(status_in(st, allowed, nallowed), "%s: bx_clip_grad_norm status %d (%s); \"%s\"", what,
        (int)st, bx_status_str(st), bx_last_error());
  CHECK(bxt_mentions(bx_last_error(), "group", 1) && bxt_mentions(bx_last_error(), "tensor", 2),
        "%s: bx_clip_grad_norm names group 1, tensor 2: \"%s\"", what, bx_last_error());
  CHECK(total == SENTINEL && coef == SENTINEL, "%s: bx_clip_grad_norm wrote an output", what);

  bx_acc acc, acc0;
  bx_acc_init(&acc);
  bx_acc_add_squares(&acc, &f->good[0].t);
  acc0 = acc;
  st = bx_acc_add_squares(&acc, &bad);
  CHECK(status_in(st, allowed, nallowed), "%s: bx_acc_add_squares status %d (%s)", what, (int)st,
        bx_status_str(st));
  st = bx_acc_add_abs(&acc, &bad);
  CHECK(status_in(st, allowed, nallowed), "%s: bx_acc_add_abs status %d (%s)", what, (int)st,
        bx_status_str(st));
  CHECK(memcmp(&acc, &acc0, sizeof acc) == 0, "%s: the accumulator changed", what);
  CHECK(fingerprint(f) == before, "%s: a gradient was modified", what);
}

static void expect_one(fixture *f, const char *what, DLTensor bad, bx_status want) {
  expect_refused(f, what, bad, &want, 1);
}

void test_errors_null_pointers(void) {
  fixture f;
  fixture_make(&f);
  int64_t shape[4];
  DLTensor bad = bad_base(&f, shape);
  bad.data = NULL;
  expect_one(&f, "data NULL with 100 elements", bad, BX_EINVAL);
  bad = bad_base(&f, shape);
  bad.shape = NULL;
  expect_one(&f, "shape NULL with ndim 1", bad, BX_EINVAL);

  DLTensor dl[2] = {f.good[0].t, f.good[1].t};
  double total = SENTINEL, coef = SENTINEL;
  CHECK_STATUS(bx_total_norm(NULL, 2, NULL, NULL, &total, NULL), BX_EINVAL, "groups NULL, ngroups 2");
  CHECK(total == SENTINEL, "untouched");
  bx_group g[2] = {{dl, 2}, {NULL, 3}};
  CHECK_STATUS(bx_total_norm(g, 2, NULL, NULL, &total, NULL), BX_EINVAL,
               "group 1: tensors NULL, count 3");
  CHECK(bxt_mentions(bx_last_error(), "group", 1), "names group 1: \"%s\"", bx_last_error());
  CHECK(total == SENTINEL, "untouched");
  CHECK_STATUS(bx_total_norm(g, 1, NULL, NULL, NULL, NULL), BX_EINVAL, "total_norm NULL");
  CHECK(bx_last_error()[0] != '\0', "a message for total_norm NULL");
  CHECK_STATUS(bx_clip_grad_norm(NULL, 1, NULL, 1.0, NULL, &total, &coef), BX_EINVAL,
               "clip: groups NULL");
  CHECK_STATUS(bx_clip_grad_norm(g, 2, NULL, 1.0, NULL, &total, &coef), BX_EINVAL,
               "clip: group tensors NULL");
  CHECK(total == SENTINEL && coef == SENTINEL, "untouched");
  CHECK_STATUS(bx_scale(NULL, 3, 0.5, NULL), BX_EINVAL, "scale: tensors NULL, count 3");
  CHECK_STATUS(bx_scale(NULL, 0, 0.5, NULL), BX_OK, "scale: nothing to do");
  CHECK_STATUS(bx_clip_grad_norm(NULL, 0, NULL, 1.0, NULL, &total, &coef), BX_OK,
               "clip of nothing");
  CHECK(total == 0.0, "clip of nothing: norm 0");
  /* a zero-element tensor may have data == NULL (torch.empty(0) does):
   * read as "allowed, contributes nothing" */
  bad = bad_base(&f, shape);
  bad.data = NULL;
  shape[0] = 0;
  bx_group g1 = {&bad, 1};
  total = SENTINEL;
  CHECK_STATUS(bx_total_norm(&g1, 1, NULL, NULL, &total, NULL), BX_OK,
               "zero elements with data NULL");
  CHECK(total == 0.0, "zero elements with data NULL: norm 0");
  CHECK_STATUS(bx_scale(&bad, 1, 0.5, NULL), BX_OK, "scale zero elements with data NULL");
  fixture_free(&f);
}

void test_errors_dtypes(void) {
  fixture f;
  fixture_make(&f);
  struct {
    uint8_t code, bits;
    uint16_t lanes;
    const char *what;
  } cases[] = {
      {kDLInt, 8, 1, "int8"},          {kDLInt, 16, 1, "int16"},
      {kDLInt, 32, 1, "int32"},        {kDLInt, 64, 1, "int64"},
      {kDLUInt, 8, 1, "uint8"},        {kDLUInt, 16, 1, "uint16"},
      {kDLFloat, 8, 1, "fp8 as kDLFloat bits 8"},
      {10, 8, 1, "fp8 as a newer code (10) bits 8"},
      {7, 8, 1, "fp8 as code 7 bits 8"},
      {kDLComplex, 64, 1, "complex64"}, {kDLComplex, 128, 1, "complex128"},
      {kDLComplex, 32, 1, "complex32"}, {kDLFloat, 128, 1, "float128"},
      {kDLFloat, 80, 1, "float80"},    {kDLBfloat, 32, 1, "bfloat bits 32"},
      {kDLBfloat, 8, 1, "bfloat bits 8"}, {kDLOpaqueHandle, 64, 1, "opaque handle"},
      {6, 8, 1, "bool (code 6)"},      {kDLFloat, 32, 4, "fp32 lanes 4"},
      {kDLFloat, 16, 2, "fp16 lanes 2"}, {kDLFloat, 32, 0, "fp32 lanes 0"},
      {kDLBfloat, 16, 8, "bf16 lanes 8"}, {kDLFloat, 0, 1, "float bits 0"},
      {kDLFloat, 33, 1, "float bits 33"}, {99, 32, 1, "unknown code 99"},
  };
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    int64_t shape[1];
    DLTensor bad = bad_base(&f, shape);
    bad.dtype.code = cases[c].code;
    bad.dtype.bits = cases[c].bits;
    bad.dtype.lanes = cases[c].lanes;
    expect_one(&f, cases[c].what, bad, BX_EDTYPE);
    if (bxt_failures() > 30) break;
  }
  fixture_free(&f);
}

void test_errors_devices(void) {
  fixture f;
  fixture_make(&f);
  static const struct {
    int dev;
    const char *what;
  } refused[] = {{kDLCUDA, "kDLCUDA"},     {kDLOpenCL, "kDLOpenCL"}, {kDLVulkan, "kDLVulkan"},
                 {kDLMetal, "kDLMetal"},   {kDLVPI, "kDLVPI"},       {kDLROCM, "kDLROCM"},
                 {kDLExtDev, "kDLExtDev"}, {0, "device 0"},          {99, "device 99"}};
  for (size_t c = 0; c < sizeof refused / sizeof refused[0]; c++) {
    int64_t shape[1];
    DLTensor bad = bad_base(&f, shape);
    bad.device.device_type = (DLDeviceType)refused[c].dev;
    expect_one(&f, refused[c].what, bad, BX_EDEVICE);
  }
  /* host-readable memory is accepted and gives the same norm */
  static const int ok[] = {kDLCUDAHost, kDLCUDAManaged, kDLROCMHost};
  double want = SENTINEL;
  bx_group g = {&f.good[0].t, 1};
  CHECK_STATUS(bx_total_norm(&g, 1, NULL, NULL, &want, NULL), BX_OK, "kDLCPU");
  for (size_t c = 0; c < 3; c++) {
    DLTensor t = f.good[0].t;
    t.device.device_type = (DLDeviceType)ok[c];
    t.device.device_id = 1;
    bx_group gh = {&t, 1};
    double got = SENTINEL;
    CHECK_STATUS(bx_total_norm(&gh, 1, NULL, NULL, &got, NULL), BX_OK, "host-readable device %d",
                 ok[c]);
    CHECK_BITS_D(got, want, "device %d: same norm as kDLCPU", ok[c]);
  }
  fixture_free(&f);
}

void test_errors_shapes(void) {
  fixture f;
  fixture_make(&f);
  static const bx_status allowed[2] = {BX_EINVAL, BX_ELAYOUT};
  int64_t shape[4];
  DLTensor bad = bad_base(&f, shape);
  shape[0] = -1;
  expect_refused(&f, "shape [-1]", bad, allowed, 2);
  bad = bad_base(&f, shape);
  bad.ndim = 2;
  shape[0] = 3;
  shape[1] = -2;
  expect_refused(&f, "shape [3, -2]", bad, allowed, 2);
  shape[0] = -2;
  shape[1] = -3; /* a positive product must not hide it */
  expect_refused(&f, "shape [-2, -3]", bad, allowed, 2);
  shape[0] = 0;
  shape[1] = -1;
  expect_refused(&f, "shape [0, -1]", bad, allowed, 2);
  bad = bad_base(&f, shape);
  bad.ndim = -1;
  expect_refused(&f, "ndim -1", bad, allowed, 2);
  bad = bad_base(&f, shape);
  bad.ndim = 2;
  shape[0] = (int64_t)1 << 62;
  shape[1] = 4; /* 2^64 elements: the element count overflows */
  expect_refused(&f, "shape [2^62, 4] (count overflows)", bad, allowed, 2);
  shape[0] = (int64_t)1 << 61; /* 2^61 fp32 elements: the byte size overflows */
  shape[1] = 1;
  expect_refused(&f, "shape [2^61, 1] (byte size overflows)", bad, allowed, 2);
  fixture_free(&f);
}

void test_errors_layouts(void) {
  fixture f;
  fixture_make(&f);
  struct {
    int ndim;
    int64_t sh[3], st[3];
    const char *what;
  } gapped[] = {
      {1, {50}, {2}, "1-D stride 2"},
      {2, {3, 4}, {8, 1}, "rows with gaps"},
      {2, {3, 4}, {1, 6}, "columns with gaps (transposed with padding)"},
      {1, {4}, {0}, "stride 0 on a size-4 dim (one element four times)"},
      {2, {4, 4}, {1, 1}, "self-overlapping [4,4] strides [1,1]"},
      {2, {4, 4}, {4, 2}, "overlap and gaps"},
      {3, {2, 3, 4}, {12, 4, 2}, "3-D with a gap in the last dim"},
      {1, {10}, {-1}, "negative stride"},
      {2, {10, 10}, {10, 0}, "stride 0 on a size-10 dim"},
  };
  /* norms read every logical element of any layout; writing in place
   * refuses the layouts whose logical elements overlap (the others:
   * tests/test_strided.c) */
  static const int overlapping[] = {0, 0, 0, 1, 1, 1, 0, 0, 1};
  for (size_t c = 0; c < sizeof gapped / sizeof gapped[0]; c++) {
    int64_t shape[4], strides[3];
    DLTensor bad = bad_base(&f, shape);
    bad.byte_offset = 64 * 8; /* leave room before, for the negative stride */
    bad.ndim = gapped[c].ndim;
    memcpy(shape, gapped[c].sh, sizeof gapped[c].sh);
    memcpy(strides, gapped[c].st, sizeof strides);
    bad.strides = strides;
    bx_group one = {&bad, 1};
    double total = SENTINEL;
    CHECK_STATUS(bx_total_norm(&one, 1, NULL, NULL, &total, NULL), BX_OK, "%s: a norm reads it",
                 gapped[c].what);
    if (!overlapping[c]) continue;
    uint64_t before = fingerprint(&f);
    DLTensor dl[5] = {f.good[0].t, f.good[1].t, f.good[2].t, f.good[3].t, bad};
    bx_group g[2] = {{dl, 2}, {dl + 2, 3}};
    double coef = SENTINEL;
    total = SENTINEL;
    CHECK_STATUS(bx_scale(dl + 2, 3, 0.5, NULL), BX_ELAYOUT, "%s: bx_scale", gapped[c].what);
    CHECK(bxt_mentions(bx_last_error(), "tensor", 2), "%s: bx_scale names tensor 2: \"%s\"",
          gapped[c].what, bx_last_error());
    CHECK_STATUS(bx_clip_grad_norm(g, 2, NULL, 1e-3, NULL, &total, &coef), BX_ELAYOUT,
                 "%s: bx_clip_grad_norm", gapped[c].what);
    CHECK(bxt_mentions(bx_last_error(), "group", 1) && bxt_mentions(bx_last_error(), "tensor", 2),
          "%s: bx_clip_grad_norm names group 1, tensor 2: \"%s\"", gapped[c].what,
          bx_last_error());
    CHECK(total == SENTINEL && coef == SENTINEL, "%s: bx_clip_grad_norm wrote an output",
          gapped[c].what);
    CHECK(fingerprint(&f) == before, "%s: a gradient was modified", gapped[c].what);
  }
  /* dense layouts in another order are accepted: same norm, and bx_scale
   * scales every element exactly once */
  bxt_tensor x;
  bxt_tensor_alloc(&x, REF_F32, 24);
  for (size_t i = 0; i < 24; i++) bxt_set(&x, i, (double)(i + 1));
  double want = SENTINEL;
  bx_group g = {&x.t, 1};
  CHECK_STATUS(bx_total_norm(&g, 1, NULL, NULL, &want, NULL), BX_OK, "plain");
  struct {
    int ndim;
    int64_t sh[3], st[3];
  } dense[] = {{2, {4, 6}, {1, 4}}, {3, {2, 3, 4}, {1, 2, 6}}, {3, {4, 3, 2}, {6, 2, 1}},
               {3, {3, 1, 8}, {8, 5, 1}}, {2, {6, 4}, {4, 1}}};
  for (size_t c = 0; c < sizeof dense / sizeof dense[0]; c++) {
    bxt_tensor y;
    bxt_tensor_clone(&y, &x);
    memcpy(y.shape, dense[c].sh, sizeof dense[c].sh);
    memcpy(y.strides, dense[c].st, sizeof dense[c].st);
    y.t.ndim = dense[c].ndim;
    y.t.strides = y.strides;
    bx_group gy = {&y.t, 1};
    double got = SENTINEL;
    CHECK_STATUS(bx_total_norm(&gy, 1, NULL, NULL, &got, NULL), BX_OK, "dense layout %zu", c);
    CHECK_BITS_D(got, want, "dense layout %zu: same norm", c);
    CHECK_STATUS(bx_scale(&y.t, 1, 2.0, NULL), BX_OK, "scale dense layout %zu", c);
    for (size_t i = 0; i < 24; i++)
      if (!CHECK(bxt_get(&y, i) == 2.0 * (double)(i + 1), "layout %zu: element %zu scaled once", c, i))
        break;
    bxt_tensor_free(&y);
  }
  bxt_tensor_free(&x);
  fixture_free(&f);
}

void test_errors_bad_p(void) {
  fixture f;
  fixture_make(&f);
  DLTensor dl[4] = {f.good[0].t, f.good[1].t, f.good[2].t, f.good[3].t};
  bx_group g[2] = {{dl, 2}, {dl + 2, 2}};
  static const double bad[] = {NAN, -NAN}; /* negative p is valid (test_strided.c) */
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    bx_norm_opts o = BX_NORM_OPTS_DEFAULT;
    o.norm_type = bad[i];
    double total = SENTINEL, gn[2] = {SENTINEL, SENTINEL};
    CHECK_STATUS(bx_total_norm(g, 2, NULL, &o, &total, gn), BX_EINVAL, "p = %g", bad[i]);
    CHECK(total == SENTINEL && gn[0] == SENTINEL && gn[1] == SENTINEL, "p = %g: untouched", bad[i]);
    CHECK(bx_last_error()[0] != '\0', "p = %g: a message", bad[i]);
    bx_clip_opts co = BX_CLIP_OPTS_DEFAULT;
    co.norm.norm_type = bad[i];
    double coef = SENTINEL;
    uint64_t before = fingerprint(&f);
    CHECK_STATUS(bx_clip_grad_norm(g, 2, NULL, 1e-3, &co, &total, &coef), BX_EINVAL,
                 "clip with p = %g", bad[i]);
    CHECK(fingerprint(&f) == before && total == SENTINEL && coef == SENTINEL,
          "clip with p = %g: nothing modified", bad[i]);
  }
  bx_norm_opts o = BX_NORM_OPTS_DEFAULT;
  o.norm_type = -INFINITY;
  double total = SENTINEL;
  CHECK_STATUS(bx_total_norm(g, 2, NULL, &o, &total, NULL), BX_OK, "p = -inf is valid");
  fixture_free(&f);
}

void test_errors_scale_overlap(void) {
  bxt_tensor buf;
  bxt_tensor_alloc(&buf, REF_F32, 1000);
  for (size_t i = 0; i < 1000; i++) bxt_set(&buf, i, 1.0 + (double)i);
  bxt_tensor other;
  bxt_tensor_alloc(&other, REF_F32, 10);
  bxt_tensor copy;
  bxt_tensor_clone(&copy, &buf);
  int64_t sh[6] = {100, 100, 100, 100, 100, 10};
  DLTensor v[6];
  for (int k = 0; k < 6; k++) {
    v[k] = buf.t;
    v[k].shape = &sh[k];
  }
  struct {
    uint64_t off1, off3; /* byte offsets of views 1 and 3 (others disjoint) */
    int dt3;
    const char *what;
  } cases[] = {
      {400, 400, REF_F32, "the same view twice"},
      {400, 600, REF_F32, "views overlapping by 50 elements"},
      {400, 796, REF_F32, "views overlapping by one element"},
      {0, 40, REF_F32, "one view inside another"},
      {400, 798, REF_F32, "overlap by two bytes (misaligned view)"},
      {400, 700, REF_F16, "an fp16 view over an fp32 view's bytes"},
  };
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    /* views 0, 2, 4 are disjoint from everything; 1 and 3 collide; 5 is
     * another buffer */
    v[0].byte_offset = 2000;
    v[2].byte_offset = 2400;
    v[4].byte_offset = 2800;
    v[1].byte_offset = cases[c].off1;
    v[3].byte_offset = cases[c].off3;
    v[3].dtype = bxt_dl_dtype(cases[c].dt3);
    if (c == 3) sh[1] = 100, sh[3] = 5;
    else sh[1] = 100, sh[3] = 100;
    v[5] = other.t;
    CHECK_STATUS(bx_scale(v, 6, 0.5, NULL), BX_ELAYOUT, "%s", cases[c].what);
    CHECK(bxt_mentions(bx_last_error(), "tensor", 3) || bxt_mentions(bx_last_error(), "tensor", 1),
          "%s: names tensor 1 or 3: \"%s\"", cases[c].what, bx_last_error());
    CHECK(memcmp(buf.buf, copy.buf, 4000) == 0, "%s: nothing modified", cases[c].what);
    v[3].dtype = bxt_dl_dtype(REF_F32);
  }
  /* a view that overlaps itself */
  int64_t st[1] = {0};
  DLTensor self = buf.t;
  int64_t sh4[1] = {4};
  self.shape = sh4;
  self.strides = st;
  DLTensor two[2] = {other.t, self};
  CHECK_STATUS(bx_scale(two, 2, 0.5, NULL), BX_ELAYOUT, "stride 0: one element four times");
  CHECK(bxt_mentions(bx_last_error(), "tensor", 1), "names tensor 1: \"%s\"", bx_last_error());
  CHECK(memcmp(buf.buf, copy.buf, 4000) == 0, "self-overlap: nothing modified");
  /* adjacent views touch but do not overlap: accepted, each scaled once */
  DLTensor adj[3];
  int64_t ash[3] = {100, 100, 100};
  for (int k = 0; k < 3; k++) {
    adj[k] = buf.t;
    adj[k].shape = &ash[k];
    adj[k].byte_offset = (uint64_t)(400 * (2 - k)); /* out of order on purpose */
  }
  CHECK_STATUS(bx_scale(adj, 3, 0.5, NULL), BX_OK, "adjacent views");
  for (size_t i = 0; i < 1000; i++) {
    double want = i < 300 ? (1.0 + (double)i) * 0.5 : 1.0 + (double)i;
    if (!CHECK(bxt_get(&buf, i) == want, "adjacent views: element %zu", i)) break;
  }
  /* thousands of one-element views in random order: all disjoint, then one
   * duplicate among them */
  enum { NV = 1000 };
  static DLTensor many[NV + 1];
  static int64_t one[NV + 1];
  for (int k = 0; k < NV; k++) {
    many[k] = buf.t;
    one[k] = 1;
    many[k].shape = &one[k];
    many[k].byte_offset = (uint64_t)k * 4;
  }
  bxt_rng r;
  bxt_rng_init(&r);
  bxt_shuffle(&r, many, NV, sizeof many[0]);
  memcpy(copy.buf, buf.buf, 4000);
  CHECK_STATUS(bx_scale(many, NV, 2.0, NULL), BX_OK, "%d disjoint one-element views", NV);
  for (size_t i = 0; i < 1000; i++)
    if (!CHECK(bxt_get(&buf, i) == 2.0 * bxt_get(&copy, i), "element %zu scaled once", i)) break;
  memcpy(copy.buf, buf.buf, 4000);
  many[NV] = many[bxt_below(&r, NV)];
  one[NV] = 1;
  many[NV].shape = &one[NV];
  CHECK_STATUS(bx_scale(many, NV + 1, 2.0, NULL), BX_ELAYOUT, "one duplicate among %d views", NV);
  CHECK(memcmp(buf.buf, copy.buf, 4000) == 0, "duplicate among many: nothing modified");
  bxt_tensor_free(&buf);
  bxt_tensor_free(&other);
  bxt_tensor_free(&copy);
}

void test_errors_scale_bad_input(void) {
  fixture f;
  fixture_make(&f);
  DLTensor dl[4] = {f.good[0].t, f.good[1].t, f.good[2].t, f.good[3].t};
  uint64_t before = fingerprint(&f);
  static const double nans[] = {NAN, -NAN};
  for (int i = 0; i < 2; i++) {
    CHECK_STATUS(bx_scale(dl, 4, nans[i], NULL), BX_EINVAL, "NaN coef");
    CHECK(fingerprint(&f) == before, "NaN coef: nothing modified");
    CHECK(bx_last_error()[0] != '\0', "NaN coef: a message");
  }
  bx_scale_opts o = BX_SCALE_OPTS_DEFAULT;
  o.mode = (bx_scale_mode)7;
  o.num_threads = 1;
  CHECK_STATUS(bx_scale(dl, 4, 0.5, &o), BX_EINVAL, "unknown scale mode 7");
  CHECK(fingerprint(&f) == before, "unknown mode: nothing modified");
  /* a bad tensor after good ones: nothing written, not even the good ones */
  DLTensor mixed[4] = {f.good[0].t, f.good[1].t, f.good[2].t, f.good[3].t};
  mixed[3].dtype.code = kDLInt;
  CHECK_STATUS(bx_scale(mixed, 4, 0.5, NULL), BX_EDTYPE, "int tensor last");
  CHECK(bxt_mentions(bx_last_error(), "tensor", 3), "names tensor 3: \"%s\"", bx_last_error());
  CHECK(fingerprint(&f) == before, "all-or-nothing: the good tensors were not scaled");
  fixture_free(&f);
}

/* bx_last_error is thread-local: "" in a thread that has not failed; a
 * failure in one thread does not change another's text. */
typedef struct te_result {
  char before[256], after[256];
  bx_status st;
} te_result;

static void *te_thread(void *arg) {
  te_result *res = arg;
  snprintf(res->before, sizeof res->before, "%s", bx_last_error());
  bx_norm_opts o = BX_NORM_OPTS_DEFAULT;
  o.norm_type = NAN;
  double v;
  res->st = bx_total_norm(NULL, 0, NULL, &o, &v, NULL);
  snprintf(res->after, sizeof res->after, "%s", bx_last_error());
  return NULL;
}

void test_errors_last_error_thread_local(void) {
  double v;
  bx_status st = bx_total_norm(NULL, 1, NULL, NULL, &v, NULL); /* fails here first */
  CHECK_STATUS(st, BX_EINVAL, "groups NULL");
  char mine[256];
  snprintf(mine, sizeof mine, "%s", bx_last_error());
  CHECK(mine[0] != '\0', "main thread has a message");
  te_result res;
  pthread_t th;
  pthread_create(&th, NULL, te_thread, &res);
  pthread_join(th, NULL);
  CHECK(res.before[0] == '\0', "a new thread starts with \"\" (got \"%s\")", res.before);
  CHECK_STATUS(res.st, BX_EINVAL, "p = NaN in the thread");
  CHECK(res.after[0] != '\0' && strcmp(res.after, mine) != 0, "the thread has its own message");
  CHECK(strcmp(bx_last_error(), mine) == 0, "main thread's message unchanged: \"%s\" vs \"%s\"",
        bx_last_error(), mine);
  /* a successful call does not clear or change it (valid until the next
   * failing call) */
  CHECK_STATUS(bx_total_norm(NULL, 0, NULL, NULL, &v, NULL), BX_OK, "success");
  CHECK(strcmp(bx_last_error(), mine) == 0, "unchanged by a successful call");
}
