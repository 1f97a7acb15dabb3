/*
 * test_acc.c — the accumulator against the MPFR reference, bit for bit:
 * bx_acc_add_squares / bx_acc_add_abs on DLTensors of every dtype, under
 * every ISA, then bx_acc_value, bx_acc_sqrt, bx_acc_valuef, bx_acc_sqrtf
 * and the NaN/Inf/element counters. Random gradient-like data, random bit
 * patterns, and adversarial sets: extremes of each format, long runs of
 * tiny values, non-finite mixes, tensors longer than one kernel chunk,
 * views; hand-made words. Rounding ties have their own file, test_ties.c.
 */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checks.h"
#include "harness.h"
#include "kernels.h"
#include "tests.h"
#include "util.h"

/* Lengths around vector widths, unroll factors and ~2048-element blocks. */
static const size_t SIZES[] = {1,   2,    3,    5,    7,    8,    15,   16,  17,
                               31,  32,   33,   63,   64,   65,   127,  128, 129,
                               255, 257,  1000, 2047, 2048, 2049, 4095, 4096, 4097,
                               6143, 8193, 20000};
#define NSIZES (sizeof SIZES / sizeof SIZES[0])

void test_acc_init_and_layout(void) {
  CHECK(sizeof(bx_acc) == BX_ACC_WORDS * sizeof(int64_t), "sizeof(bx_acc) = %zu",
        sizeof(bx_acc));
  CHECK(offsetof(bx_acc, digit) == 0, "digits first");
  CHECK(offsetof(bx_acc, nan_count) == BX_ACC_DIGITS * 8, "nan_count after the digits");
  CHECK(offsetof(bx_acc, version) == (BX_ACC_WORDS - 1) * 8, "version is the last word");
  bx_acc acc;
  memset(&acc, 0x5A, sizeof acc);
  bx_acc_init(&acc);
  int zero = 1;
  for (int i = 0; i < BX_ACC_DIGITS; i++) zero &= acc.digit[i] == 0;
  CHECK(zero, "digits zero after init");
  CHECK(acc.nan_count == 0 && acc.inf_count == 0 && acc.count == 0, "counters zero");
  CHECK(acc.naccs == 1 && acc.version == BX_ACC_VERSION_TAG, "naccs 1, version tag");
  CHECK_STATUS(bx_acc_check(&acc), BX_OK, "fresh accumulator");
  CHECK_BITS_D(bx_acc_value(&acc), 0.0, "value of zero is +0");
  CHECK_BITS_D(bx_acc_sqrt(&acc), 0.0, "sqrt of zero is +0");
  CHECK_BITS_F(bx_acc_valuef(&acc), 0.0f, "valuef of zero is +0");
  CHECK_BITS_F(bx_acc_sqrtf(&acc), 0.0f, "sqrtf of zero is +0");
  CHECK(BX_ACC_VERSION_TAG < (1ll << 31), "the version tag times 2^31 fits an int64");
}

/* The words are the wire format: digit i weighs 2^(32 i + BX_ACC_LSB_EXP). */
void test_acc_wire_format_positions(void) {
  struct {
    int dt;
    double v;
    int squares;
    int digit;
    int64_t word;
  } cases[] = {
      {REF_F64, 1.0, 1, (0 - BX_ACC_LSB_EXP) / 32, 1},
      {REF_F32, -1.0, 1, (0 - BX_ACC_LSB_EXP) / 32, 1},
      {REF_F16, 1.0, 0, (0 - BX_ACC_LSB_EXP) / 32, 1},
      {REF_BF16, 2.0, 1, (2 - BX_ACC_LSB_EXP) / 32, 4},
      {REF_F64, 0x1p-1074, 1, 0, (int64_t)1 << (-2148 - BX_ACC_LSB_EXP)},
      {REF_F64, 0x1p-1074, 0, (-1074 - BX_ACC_LSB_EXP) / 32,
       (int64_t)1 << ((-1074 - BX_ACC_LSB_EXP) % 32)},
      {REF_F64, 0x1p1023, 1, (2046 - BX_ACC_LSB_EXP) / 32,
       (int64_t)1 << ((2046 - BX_ACC_LSB_EXP) % 32)},
  };
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    bxt_tensor x;
    bxt_tensor_from(&x, cases[c].dt, &cases[c].v, 1);
    for (int isa = 0; isa < bxt_isa_count(); isa++) {
      bxt_force(isa);
      bx_acc acc;
      bx_acc_init(&acc);
      bx_status st = cases[c].squares ? bx_acc_add_squares(&acc, &x.t) : bx_acc_add_abs(&acc, &x.t);
      CHECK_STATUS(st, BX_OK, "case %zu", c);
      for (int i = 0; i < BX_ACC_DIGITS; i++) {
        int64_t want = i == cases[c].digit ? cases[c].word : 0;
        CHECK(acc.digit[i] == want, "case %zu (%a %s, %s), isa %s: digit[%d] = %lld want %lld",
              c, cases[c].v, bxt_dt_name(cases[c].dt), cases[c].squares ? "square" : "abs",
              bxt_isa(isa), i, (long long)acc.digit[i], (long long)want);
      }
      CHECK(acc.count == 1, "count %lld", (long long)acc.count);
    }
    bxt_tensor_free(&x);
  }
}

void test_acc_random_gradients(void) {
  bxt_rng r;
  bxt_rng_init(&r);
  for (int dt = 0; dt < REF_NDT; dt++)
    for (size_t s = 0; s < NSIZES; s++) {
      bxt_tensor x;
      bxt_tensor_alloc(&x, dt, SIZES[s]);
      double sigma = pow(10.0, -6.0 + 7.0 * bxt_uniform(&r));
      bxt_fill_gradient(&r, &x, sigma);
      char what[96];
      snprintf(what, sizeof what, "gradient %s n=%zu sigma=%g", bxt_dt_name(dt), SIZES[s], sigma);
      bxt_check_acc(what, &x, 1);
      bxt_tensor_free(&x);
      if (bxt_failures() > 20) return;
    }
}

void test_acc_random_bits(void) {
  bxt_rng r;
  bxt_rng_init(&r);
  for (int rep = 0; rep < 2; rep++)
    for (int dt = 0; dt < REF_NDT; dt++)
      for (size_t s = 0; s < NSIZES; s += 2) {
        bxt_tensor x;
        bxt_tensor_alloc(&x, dt, SIZES[s]);
        if (rep == 0)
          bxt_fill_wide(&r, &x); /* exponents uniform: worst case for windows */
        else
          bxt_fill_bits(&r, &x, 1); /* any bits, NaN and Inf included */
        char what[96];
        snprintf(what, sizeof what, "%s %s n=%zu", rep ? "bits" : "wide", bxt_dt_name(dt),
                 SIZES[s]);
        bxt_check_acc(what, &x, 1);
        bxt_tensor_free(&x);
        if (bxt_failures() > 20) return;
      }
}

void test_acc_adversarial_fp32(void) {
  bxt_rng r;
  bxt_rng_init(&r);
  double v[4096];
  /* extremes alone and together */
  const double special[] = {FLT_MAX, -FLT_MAX, FLT_MIN, -FLT_MIN, 0x1p-149, -0x1p-149,
                            0x1.fffffcp-127, 0x1p-126, 1.0, -0.0, 0.0, 0x1.fffffep+63,
                            0x1p+64, 3.0, 0x1.000002p0};
  size_t ns = sizeof special / sizeof special[0];
  for (size_t i = 0; i < ns; i++) {
    char what[64];
    snprintf(what, sizeof what, "fp32 single %a", special[i]);
    bxt_check_values(what, REF_F32, &special[i], 1);
  }
  bxt_check_values("fp32 specials together", REF_F32, special, ns);
  /* many FLT_MAX: overflows fp32 and needs the wide range in fp64 */
  for (size_t i = 0; i < 4096; i++) v[i] = (i & 1) ? FLT_MAX : -FLT_MAX;
  bxt_check_values("4096 x FLT_MAX", REF_F32, v, 4096);
  /* subnormals only: squares 2^-298.. far below fp64's subnormal range? no:
   * 2^-298 is a normal double, but their sum needs every bit */
  for (size_t i = 0; i < 4096; i++) v[i] = ldexp((double)(bxt_below(&r, 1u << 23)), -149);
  bxt_check_values("4096 fp32 subnormals", REF_F32, v, 4096);
  /* FLT_MAX among subnormals (few huge, many tiny) */
  v[1234] = FLT_MAX;
  v[17] = -FLT_MAX;
  bxt_check_values("FLT_MAX among subnormals", REF_F32, v, 4096);
  for (size_t i = 0; i < 4096; i++) v[i] = ldexp(1.0 + bxt_uniform(&r), -149 + (int)bxt_below(&r, 276));
  for (size_t i = 0; i < 4096; i++) v[i] = (double)(float)v[i];
  bxt_check_values("fp32 exponents uniform", REF_F32, v, 4096);
  /* one huge then many values each below 2^-24 of it (a float sum drops them) */
  v[0] = 1.0;
  for (size_t i = 1; i < 4096; i++) v[i] = 0x1p-13 * (1.0 + (double)(i & 7) / 8);
  bxt_check_values("1 then 4095 values whose squares are < ulp(1)", REF_F32, v, 4096);
}

void test_acc_adversarial_fp64(void) {
  bxt_rng r;
  bxt_rng_init(&r);
  double v[4096];
  const double special[] = {DBL_MAX,  -DBL_MAX, 1e300,   -1e300,  1e-300, -1e-300,
                            1e154,    1e-154,   DBL_MIN, -DBL_MIN, 0x1p-1074, -0x1p-1074,
                            0x1.fffffffffffffp-1023, 0x1p511, 0x1p512, 0x1.6a09e667f3bcdp511,
                            1.0,      0.0,      -0.0,    0x1.0000000000001p0};
  size_t ns = sizeof special / sizeof special[0];
  for (size_t i = 0; i < ns; i++) {
    char what[64];
    snprintf(what, sizeof what, "fp64 single %a", special[i]);
    bxt_check_values(what, REF_F64, &special[i], 1);
  }
  bxt_check_values("fp64 specials together", REF_F64, special, ns);
  /* squares of 1e300 must not overflow, of 1e-300 must not vanish */
  for (size_t i = 0; i < 1000; i++) v[i] = (i & 1) ? 1e300 : -1e300;
  bxt_check_values("1000 x 1e300", REF_F64, v, 1000);
  for (size_t i = 0; i < 1000; i++) v[i] = 1e-300 * (1.0 + (double)i);
  bxt_check_values("1000 values near 1e-300", REF_F64, v, 1000);
  for (size_t i = 0; i < 2; i++) v[i] = DBL_MAX;
  bxt_check_values("2 x DBL_MAX (sqrt overflows)", REF_F64, v, 2);
  v[0] = DBL_MAX;
  v[1] = 0x1p-1074;
  bxt_check_values("DBL_MAX and the smallest subnormal", REF_F64, v, 2);
  for (size_t i = 0; i < 4096; i++) v[i] = DBL_MAX * (bxt_uniform(&r) + 0.001);
  bxt_check_values("4096 values near DBL_MAX", REF_F64, v, 4096);
  for (size_t i = 0; i < 4096; i++) v[i] = ldexp((double)(bxt_next(&r) >> 12), -1074);
  bxt_check_values("4096 fp64 subnormals", REF_F64, v, 4096);
  for (size_t i = 0; i < 4096; i++)
    v[i] = ldexp(1.0 + bxt_uniform(&r), -1074 + (int)bxt_below(&r, 2098));
  bxt_check_values("fp64 exponents uniform", REF_F64, v, 4096);
  /* spiky: few huge, many tiny */
  for (size_t i = 0; i < 4096; i++) v[i] = bxt_below(&r, 512) ? 1e-200 * bxt_normal(&r) : 1e200 * bxt_normal(&r);
  bxt_check_values("fp64 spiky", REF_F64, v, 4096);
  /* cancellation-free but order-sensitive: 1, then 2^-60 repeated */
  v[0] = 1.0;
  for (size_t i = 1; i < 4096; i++) v[i] = 0x1p-30;
  bxt_check_values("1 then 4095 x 2^-30 (squares 2^-60)", REF_F64, v, 4096);
}

void test_acc_adversarial_16bit(void) {
  bxt_rng r;
  bxt_rng_init(&r);
  /* every bit pattern of fp16 and bf16 once (NaN and Inf included), and
   * every finite pattern once */
  for (int dt = REF_F16; dt <= REF_BF16; dt++) {
    bxt_tensor x;
    bxt_tensor_alloc(&x, dt, 65536);
    for (uint32_t b = 0; b < 65536; b++) bxt_set_bits(&x, b, b);
    char what[64];
    snprintf(what, sizeof what, "all %s bit patterns", bxt_dt_name(dt));
    bxt_check_acc(what, &x, 1);
    size_t n = 0;
    for (uint32_t b = 0; b < 65536; b++)
      if (isfinite(dt == REF_F16 ? ref_f16_to_double((uint16_t)b) : ref_bf16_to_double((uint16_t)b)))
        bxt_set_bits(&x, n++, b);
    x.n = n;
    x.shape[0] = (int64_t)n;
    bxt_shuffle(&r, x.buf, n, 2);
    snprintf(what, sizeof what, "all finite %s patterns, shuffled", bxt_dt_name(dt));
    bxt_check_acc(what, &x, 1);
    bxt_tensor_free(&x);
  }
  double v[3000];
  for (size_t i = 0; i < 3000; i++) v[i] = (i % 3) ? 65504.0 : -65504.0;
  bxt_check_values("3000 x fp16 max", REF_F16, v, 3000);
  for (size_t i = 0; i < 3000; i++) v[i] = 0x1p-24 * (double)(1 + bxt_below(&r, 1023));
  bxt_check_values("3000 fp16 subnormals", REF_F16, v, 3000);
  for (size_t i = 0; i < 3000; i++) v[i] = (i & 1) ? 0x1.fep127 : -0x1p-133;
  bxt_check_values("bf16 max and min subnormal", REF_BF16, v, 3000);
}

void test_acc_tiny_runs(void) {
  /* 100000 x 2^-1074: squares 2^-2148 each, sum far below DBL_TRUE_MIN,
   * sqrt = 316.2... * 2^-1074 (a subnormal) */
  size_t n = 100000;
  double *v = malloc(n * sizeof *v);
  for (size_t i = 0; i < n; i++) v[i] = (i & 1) ? 0x1p-1074 : -0x1p-1074;
  bxt_check_values("100000 x 2^-1074", REF_F64, v, n);
  for (size_t i = 0; i < n; i++) v[i] = 0x1p-149;
  bxt_check_values("100000 x 2^-149 (fp32)", REF_F32, v, n);
  for (size_t i = 0; i < n; i++) v[i] = 0x1p-24;
  bxt_check_values("100000 x 2^-24 (fp16)", REF_F16, v, n);
  for (size_t i = 0; i < n; i++) v[i] = 0x1p-133;
  bxt_check_values("100000 x 2^-133 (bf16)", REF_BF16, v, n);
  /* one big value, then many tiny ones that only matter together */
  v[0] = 1.0;
  for (size_t i = 1; i < n; i++) v[i] = 0x1p-40;
  bxt_check_values("1 then 99999 x 2^-40 (squares 2^-80)", REF_F64, v, n);
  bxt_check_values("1 then 99999 x 2^-40 (fp32)", REF_F32, v, n);
  free(v);
}

void test_acc_nonfinite_counters(void) {
  bxt_rng r;
  bxt_rng_init(&r);
  for (int dt = 0; dt < REF_NDT; dt++)
    for (int rep = 0; rep < 6; rep++) {
      size_t n = 1 + bxt_below(&r, 5000);
      bxt_tensor x;
      bxt_tensor_alloc(&x, dt, n);
      bxt_fill_gradient(&r, &x, 1.0);
      size_t nbad = bxt_below(&r, 40);
      for (size_t k = 0; k < nbad; k++) {
        size_t i = bxt_below(&r, n);
        double bad = (bxt_next(&r) & 1) ? NAN : (bxt_next(&r) & 1) ? INFINITY : -INFINITY;
        bxt_set_bits(&x, i, ref_encode(dt, bad));
        if (dt == REF_F32 && isnan(bad)) bxt_set_bits(&x, i, 0xFF812345u); /* a signalling, negative NaN */
      }
      if (rep == 5) /* non-finite only */
        for (size_t i = 0; i < n; i++) bxt_set_bits(&x, i, ref_encode(dt, (i & 1) ? NAN : -INFINITY));
      char what[96];
      snprintf(what, sizeof what, "%s n=%zu with %zu NaN/Inf", bxt_dt_name(dt), n, nbad);
      bxt_check_acc(what, &x, 1);
      bxt_tensor_free(&x);
    }
}

/* Tensors longer than one kernel call (BX_CHUNK) and wide data that lands
 * in the integer-bin fallback: the driver must normalise between calls. */
void test_acc_large_chunks(void) {
  bxt_rng r;
  bxt_rng_init(&r);
  size_t n = 3 * BX_CHUNK + 37;
  bxt_tensor x;
  bxt_tensor_alloc(&x, REF_F16, n);
  bxt_fill_bits(&r, &x, 1);
  bxt_check_acc("fp16 3 chunks + 37, random bits", &x, 1);
  /* every element the largest: exercises the digit words' headroom */
  for (size_t i = 0; i < n; i++) bxt_set_bits(&x, i, 0x7BFF);
  bxt_check_acc("fp16 3 chunks + 37 x 65504", &x, 1);
  bxt_tensor_free(&x);
  bxt_tensor_alloc(&x, REF_BF16, BX_CHUNK + 1);
  for (size_t i = 0; i < x.n; i++) bxt_set_bits(&x, i, 0x7F7F); /* bf16 max */
  bxt_check_acc("bf16 chunk + 1 x max", &x, 1);
  bxt_tensor_free(&x);
}

/* Views: byte_offset, 2-D shapes, a transposed dense layout, size-1 dims
 * with arbitrary strides, a 0-d scalar, zero-element tensors. */
void test_acc_views_and_shapes(void) {
  bxt_rng r;
  bxt_rng_init(&r);
  for (int dt = 0; dt < REF_NDT; dt++) {
    bxt_tensor x;
    bxt_tensor_alloc(&x, dt, 5000);
    bxt_fill_mixed(&r, &x);
    size_t es = bxt_dt_size(dt);
    /* reference over elements [off, off + 12*300) */
    size_t off = 1 + bxt_below(&r, 100);
    ref_sum want;
    ref_sum_init(&want);
    ref_add_squares(&want, dt, (char *)x.buf + off * es, 12 * 300);
    int64_t shape[3], strides[3];
    DLTensor v = x.t;
    v.byte_offset = off * es;
    v.shape = shape;
    v.strides = strides;
    struct {
      int ndim;
      int64_t sh[3], st[3];
      int null_strides;
    } layouts[] = {
        {1, {3600}, {1}, 1},
        {2, {12, 300}, {300, 1}, 0},       /* row-major */
        {2, {12, 300}, {1, 12}, 0},        /* transposed (column-major): dense */
        {3, {12, 1, 300}, {300, 77, 1}, 0}, /* size-1 dim with a junk stride */
        {3, {300, 3, 4}, {1, 1200, 300}, 0}, /* a permutation of a dense layout */
        {2, {3600, 1}, {1, 0}, 0},          /* size-1 dim with stride 0 */
    };
    for (size_t l = 0; l < sizeof layouts / sizeof layouts[0]; l++) {
      v.ndim = layouts[l].ndim;
      memcpy(shape, layouts[l].sh, sizeof shape);
      memcpy(strides, layouts[l].st, sizeof strides);
      v.strides = layouts[l].null_strides ? NULL : strides;
      for (int isa = 0; isa < bxt_isa_count(); isa++) {
        bxt_force(isa);
        bx_acc acc;
        bx_acc_init(&acc);
        CHECK_STATUS(bx_acc_add_squares(&acc, &v), BX_OK, "%s layout %zu", bxt_dt_name(dt), l);
        char what[64];
        snprintf(what, sizeof what, "%s layout %zu isa %s", bxt_dt_name(dt), l, bxt_isa(isa));
        bxt_check_acc_vs(what, &acc, &want);
      }
    }
    ref_sum_clear(&want);
    /* 0-d scalar: one element (shape may be NULL) */
    v.ndim = 0;
    v.shape = NULL;
    v.strides = NULL;
    v.byte_offset = 7 * es;
    ref_sum_init(&want);
    ref_add_squares(&want, dt, (char *)x.buf + 7 * es, 1);
    bx_acc acc;
    bx_acc_init(&acc);
    CHECK_STATUS(bx_acc_add_squares(&acc, &v), BX_OK, "%s scalar", bxt_dt_name(dt));
    bxt_check_acc_vs("scalar", &acc, &want);
    ref_sum_clear(&want);
    /* zero elements: shape [0], [4, 0, 3] */
    int64_t z1[1] = {0}, z3[3] = {4, 0, 3};
    v.ndim = 1;
    v.shape = z1;
    bx_acc_init(&acc);
    CHECK_STATUS(bx_acc_add_squares(&acc, &v), BX_OK, "%s shape [0]", bxt_dt_name(dt));
    v.ndim = 3;
    v.shape = z3;
    CHECK_STATUS(bx_acc_add_abs(&acc, &v), BX_OK, "%s shape [4,0,3]", bxt_dt_name(dt));
    CHECK(acc.count == 0 && bx_acc_value(&acc) == 0, "zero elements add nothing");
    bxt_tensor_free(&x);
  }
  bxt_force(-1);
}

/* On error the accumulator is unchanged (header: "On error acc is
 * unchanged"). */
void test_acc_bad_tensor_leaves_acc(void) {
  bxt_rng r;
  bxt_rng_init(&r);
  bxt_tensor x;
  bxt_tensor_alloc(&x, REF_F32, 100);
  bxt_fill_gradient(&r, &x, 1.0);
  bx_acc acc, before;
  bx_acc_init(&acc);
  CHECK_STATUS(bx_acc_add_squares(&acc, &x.t), BX_OK, "good tensor");
  memcpy(&before, &acc, sizeof acc);
  DLTensor bad = x.t;
  bad.dtype.code = kDLInt;
  CHECK_STATUS(bx_acc_add_squares(&acc, &bad), BX_EDTYPE, "int32");
  CHECK_STATUS(bx_acc_add_abs(&acc, &bad), BX_EDTYPE, "int32 (abs)");
  bad = x.t;
  bad.device.device_type = kDLCUDA;
  CHECK_STATUS(bx_acc_add_squares(&acc, &bad), BX_EDEVICE, "cuda");
  int64_t sh[2] = {10, 10}, st[2] = {20, 1}; /* gaps */
  bad = x.t;
  bad.ndim = 2;
  bad.shape = sh;
  bad.strides = st;
  CHECK_STATUS(bx_acc_add_squares(&acc, &bad), BX_ELAYOUT, "strided with gaps");
  CHECK_STATUS(bx_acc_add_squares(&acc, NULL), BX_EINVAL, "NULL tensor");
  CHECK_STATUS(bx_acc_add_squares(NULL, &x.t), BX_EINVAL, "NULL acc");
  CHECK(memcmp(&acc, &before, sizeof acc) == 0, "the accumulator is unchanged after errors");
  bxt_tensor_free(&x);
}

/* Hand-made words: a negative sum rounds to a negative value; its sqrt is
 * NaN (header). */
void test_acc_negative_words(void) {
  bx_acc acc;
  bx_acc_init(&acc);
  int one = (0 - BX_ACC_LSB_EXP) / 32;
  acc.digit[one] = -3; /* -3, un-normalised */
  CHECK_BITS_D(bx_acc_value(&acc), -3.0, "value of -3");
  CHECK_BITS_F(bx_acc_valuef(&acc), -3.0f, "valuef of -3");
  CHECK(isnan(bx_acc_sqrt(&acc)), "sqrt of a negative sum is NaN");
  CHECK(isnan(bx_acc_sqrtf(&acc)), "sqrtf of a negative sum is NaN");
  bx_acc_normalize(&acc);
  CHECK_BITS_D(bx_acc_value(&acc), -3.0, "value of -3 after normalising");
  CHECK(acc.digit[BX_ACC_DIGITS - 1] < 0, "a negative sum keeps its sign in the top digit");
  for (int i = 0; i < BX_ACC_DIGITS - 1; i++)
    if (!CHECK(acc.digit[i] >= 0 && acc.digit[i] < (1ll << 32), "digit %d normalised", i)) break;
  acc.digit[one] += 3; /* back to zero through the un-normalised path */
  bx_acc_normalize(&acc);
  CHECK_BITS_D(bx_acc_value(&acc), 0.0, "-3 + 3 = +0");
}

/* Random un-normalised (non-negative) word vectors, as an all-reduce of
 * many accumulators produces: value/sqrt against the exact value of the
 * words as the header defines them. */
void test_acc_random_words(void) {
  bxt_rng r;
  bxt_rng_init(&r);
  mpfr_t exact;
  mpfr_init2(exact, REF_SUM_PREC + 128);
  for (int rep = 0; rep < 400 && bxt_failures() < 10; rep++) {
    bx_acc acc;
    bx_acc_init(&acc);
    int lo = (int)bxt_below(&r, BX_ACC_DIGITS), span = 1 + (int)bxt_below(&r, 6);
    if (rep % 3 == 0) span = BX_ACC_DIGITS;
    for (int i = lo; i < lo + span && i < BX_ACC_DIGITS - 1; i++) {
      /* as if up to 2^31 normalised digits were summed */
      acc.digit[i] = (int64_t)(bxt_next(&r) >> (1 + bxt_below(&r, 63)));
    }
    if (rep % 5 == 0) acc.digit[lo] = (int64_t)0x7FFFFFFF00000001ll; /* 2^31 (2^32-1) + ... */
    ref_acc_words_value(exact, acc.digit, BX_ACC_DIGITS, BX_ACC_LSB_EXP);
    CHECK_BITS_D(bx_acc_value(&acc), ref_round_d(exact), "rep %d value", rep);
    CHECK_BITS_D(bx_acc_sqrt(&acc), ref_sqrt_d(exact), "rep %d sqrt", rep);
    CHECK_BITS_F(bx_acc_valuef(&acc), ref_round_f(exact), "rep %d valuef", rep);
    CHECK_BITS_F(bx_acc_sqrtf(&acc), ref_sqrt_f(exact), "rep %d sqrtf", rep);
    bx_acc copy = acc;
    bx_acc_normalize(&copy);
    CHECK_BITS_D(bx_acc_value(&copy), ref_round_d(exact), "rep %d value after normalising", rep);
    CHECK(bx_acc_compare(&copy, &acc) == 0, "rep %d: normalising keeps the sum", rep);
  }
  mpfr_clear(exact);
}

void test_acc_compare(void) {
  bxt_rng r;
  bxt_rng_init(&r);
  for (int rep = 0; rep < 200 && bxt_failures() < 10; rep++) {
    int dt = (int)bxt_below(&r, REF_NDT);
    size_t n = 1 + bxt_below(&r, 300);
    bxt_tensor a, b;
    bxt_tensor_alloc(&a, dt, n);
    bxt_fill_mixed(&r, &a);
    bxt_tensor_clone(&b, &a);
    int how = rep % 3; /* 0: equal, 1: one element changed by one ulp, 2: independent */
    size_t i = bxt_below(&r, n);
    if (how == 1) bxt_set_bits(&b, i, bxt_get_bits(&b, i) ^ 1);
    if (how == 2) bxt_fill_mixed(&r, &b);
    bxt_shuffle(&r, b.buf, n, bxt_dt_size(dt)); /* order must not matter */
    ref_sum sa, sb;
    ref_sum_init(&sa);
    ref_sum_init(&sb);
    bxt_ref_squares(&sa, &a);
    bxt_ref_squares(&sb, &b);
    int want = mpfr_cmp(sa.sum, sb.sum);
    want = want < 0 ? -1 : want > 0;
    bx_acc aa, ab;
    bx_acc_init(&aa);
    bx_acc_init(&ab);
    bx_acc_add_squares(&aa, &a.t);
    bx_acc_add_squares(&ab, &b.t);
    CHECK(bx_acc_compare(&aa, &ab) == want, "rep %d: compare %d want %d", rep,
          bx_acc_compare(&aa, &ab), want);
    CHECK(bx_acc_compare(&ab, &aa) == -want, "rep %d: reversed", rep);
    CHECK(bx_acc_compare(&aa, &aa) == 0, "rep %d: self", rep);
    ref_sum_clear(&sa);
    ref_sum_clear(&sb);
    bxt_tensor_free(&a);
    bxt_tensor_free(&b);
  }
}

/* Element data at an address that is not a multiple of the element size
 * (a tensor in an mmap'ed safetensors file can start anywhere): the same
 * sums as the reference on the same bytes, under every ISA (UBSan in
 * `make SAN=1 test` also catches misaligned typed loads). */
void test_acc_misaligned_data(void) {
  bxt_rng r;
  bxt_rng_init(&r);
  for (int dt = 0; dt < REF_NDT; dt++) {
    size_t es = bxt_dt_size(dt);
    for (size_t off = 1; off < es + 3; off++) {
      size_t n = 1 + bxt_below(&r, 9000);
      bxt_tensor x;
      bxt_tensor_alloc(&x, dt, n + 2);
      bxt_fill_mixed(&r, &x);
      unsigned char *raw = x.buf;
      for (size_t i = 0; i < (n + 1) * es; i++) raw[i] = (unsigned char)bxt_next(&r);
      /* keep the bytes finite-ish: any bit pattern is a valid input anyway */
      DLTensor v = x.t;
      int64_t shape[1] = {(int64_t)n};
      v.shape = shape;
      v.byte_offset = off;
      ref_sum sq, ab;
      ref_sum_init(&sq);
      ref_sum_init(&ab);
      ref_add_squares(&sq, dt, raw + off, n);
      ref_add_abs(&ab, dt, raw + off, n);
      for (int isa = 0; isa < bxt_isa_count(); isa++) {
        bxt_force(isa);
        bx_acc a1, a2;
        bx_acc_init(&a1);
        bx_acc_init(&a2);
        bx_status s1 = bx_acc_add_squares(&a1, &v), s2 = bx_acc_add_abs(&a2, &v);
        char what[96];
        snprintf(what, sizeof what, "%s n=%zu at byte offset %zu, isa %s", bxt_dt_name(dt), n,
                 off, bxt_isa(isa));
        /* refusing a misaligned view is acceptable (BX_ELAYOUT); a wrong sum is not */
        if (s1 == BX_ELAYOUT && s2 == BX_ELAYOUT) continue;
        CHECK_STATUS(s1, BX_OK, "%s: squares", what);
        CHECK_STATUS(s2, BX_OK, "%s: abs", what);
        bxt_check_acc_vs(what, &a1, &sq);
        bxt_check_acc_vs(what, &a2, &ab);
      }
      bxt_force(-1);
      ref_sum_clear(&sq);
      ref_sum_clear(&ab);
      bxt_tensor_free(&x);
    }
  }
}
