/*
 * test_merge.c — the accumulator as a wire format: data split into random
 * partitions, each accumulated separately, the raw int64 words summed by
 * hand in a random order exactly as MPI_SUM / ncclSum / all_reduce(SUM)
 * would, must give the whole's sum, counters, naccs and version; merges in
 * any order agree; the documented headroom (2^31 accumulators) holds; the
 * version word catches mixed builds.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checks.h"
#include "harness.h"
#include "tests.h"
#include "util.h"

#define MAX_TENSORS 12
#define MAX_PARTS 16

typedef struct dataset {
  bxt_tensor x[MAX_TENSORS];
  size_t count;
} dataset;

static void dataset_make(bxt_rng *r, dataset *d, int with_nonfinite) {
  d->count = 1 + bxt_below(r, MAX_TENSORS);
  for (size_t k = 0; k < d->count; k++) {
    int dt = (int)bxt_below(r, REF_NDT);
    size_t n = bxt_below(r, 8) == 0 ? 0 : 1 + bxt_below(r, bxt_below(r, 4) ? 3000 : 40000);
    bxt_tensor_alloc(&d->x[k], dt, n);
    bxt_fill_mixed(r, &d->x[k]);
    if (with_nonfinite && n && bxt_below(r, 3) == 0)
      bxt_set_bits(&d->x[k], bxt_below(r, n), ref_encode(dt, bxt_below(r, 2) ? NAN : -INFINITY));
  }
}

static void dataset_free(dataset *d) {
  for (size_t k = 0; k < d->count; k++) bxt_tensor_free(&d->x[k]);
}

static bx_status add(bx_acc *acc, const DLTensor *t, int abs_op) {
  return abs_op ? bx_acc_add_abs(acc, t) : bx_acc_add_squares(acc, t);
}

/* Accumulates random contiguous pieces of every tensor into nparts
 * accumulators (each piece to a random one). */
static void accumulate_partitioned(bxt_rng *r, dataset *d, int abs_op, bx_acc *parts,
                                   size_t nparts) {
  for (size_t p = 0; p < nparts; p++) bx_acc_init(&parts[p]);
  for (size_t k = 0; k < d->count; k++) {
    bxt_tensor *x = &d->x[k];
    size_t at = 0;
    do {
      size_t len = x->n - at;
      if (len > 1 && bxt_below(r, 2)) len = 1 + bxt_below(r, len);
      int64_t shape[1] = {(int64_t)len};
      DLTensor v = x->t;
      v.shape = shape;
      v.byte_offset = at * bxt_dt_size(x->dt);
      size_t p = bxt_below(r, nparts);
      CHECK_STATUS(add(&parts[p], &v, abs_op), BX_OK, "piece [%zu, +%zu) of tensor %zu", at, len, k);
      at += len;
    } while (at < x->n);
  }
}

void test_merge_partitions_by_hand(void) {
  bxt_rng r;
  bxt_rng_init(&r);
  for (int rep = 0; rep < 40 && bxt_failures() < 10; rep++) {
    dataset d;
    dataset_make(&r, &d, rep % 4 == 3);
    int abs_op = rep % 2;
    bx_acc whole;
    bx_acc_init(&whole);
    for (size_t k = 0; k < d.count; k++) add(&whole, &d.x[k].t, abs_op);
    ref_sum want;
    ref_sum_init(&want);
    for (size_t k = 0; k < d.count; k++) (abs_op ? bxt_ref_abs : bxt_ref_squares)(&want, &d.x[k]);
    char what[64];
    snprintf(what, sizeof what, "rep %d whole", rep);
    bxt_check_acc_vs(what, &whole, &want);

    size_t nparts = 1 + bxt_below(&r, MAX_PARTS);
    bx_acc parts[MAX_PARTS];
    accumulate_partitioned(&r, &d, abs_op, parts, nparts);
    /* MPI_SUM by hand, in a random order of the ranks */
    size_t order[MAX_PARTS];
    for (size_t p = 0; p < nparts; p++) order[p] = p;
    bxt_shuffle(&r, order, nparts, sizeof order[0]);
    int64_t words[BX_ACC_WORDS];
    memset(words, 0, sizeof words);
    for (size_t p = 0; p < nparts; p++) {
      int64_t w[BX_ACC_WORDS];
      memcpy(w, &parts[order[p]], sizeof w);
      for (int i = 0; i < BX_ACC_WORDS; i++) words[i] += w[i];
    }
    bx_acc sum;
    memcpy(&sum, words, sizeof sum);
    CHECK_STATUS(bx_acc_check(&sum), BX_OK, "rep %d: a sum of %zu accumulators", rep, nparts);
    CHECK(sum.naccs == (int64_t)nparts, "rep %d: naccs %lld want %zu", rep, (long long)sum.naccs, nparts);
    snprintf(what, sizeof what, "rep %d, %zu parts, raw word sum", rep, nparts);
    bxt_check_acc_vs(what, &sum, &want); /* un-normalised words accepted */
    CHECK(bx_acc_compare(&sum, &whole) == 0, "rep %d: compare with the whole", rep);
    bx_acc_normalize(&sum);
    CHECK(memcmp(sum.digit, whole.digit, sizeof sum.digit) == 0,
          "rep %d: normalised digits equal the whole's (the normal form is unique)", rep);
    /* merging the raw sum into a fresh accumulator */
    memcpy(&sum, words, sizeof sum);
    bx_acc into;
    bx_acc_init(&into);
    bx_acc_merge(&into, &sum);
    CHECK(into.naccs == (int64_t)nparts + 1, "rep %d: naccs after merge", rep);
    CHECK_STATUS(bx_acc_check(&into), BX_OK, "rep %d: merged", rep);
    snprintf(what, sizeof what, "rep %d merged into a fresh acc", rep);
    bxt_check_acc_vs(what, &into, &want);
    CHECK(memcmp(into.digit, whole.digit, sizeof into.digit) == 0, "rep %d: merge normalises", rep);
    ref_sum_clear(&want);
    dataset_free(&d);
  }
}

void test_merge_random_order(void) {
  bxt_rng r;
  bxt_rng_init(&r);
  for (int rep = 0; rep < 30 && bxt_failures() < 10; rep++) {
    dataset d;
    dataset_make(&r, &d, rep % 3 == 2);
    int abs_op = rep % 2;
    ref_sum want;
    ref_sum_init(&want);
    for (size_t k = 0; k < d.count; k++) (abs_op ? bxt_ref_abs : bxt_ref_squares)(&want, &d.x[k]);
    size_t nparts = 1 + bxt_below(&r, MAX_PARTS);
    bx_acc parts[MAX_PARTS];
    accumulate_partitioned(&r, &d, abs_op, parts, nparts);
    /* a random reduction tree */
    size_t live = nparts;
    while (live > 1) {
      size_t i = bxt_below(&r, live), j = bxt_below(&r, live - 1);
      if (j >= i) j++;
      bx_acc_merge(&parts[i], &parts[j]);
      parts[j] = parts[live - 1];
      live--;
    }
    char what[64];
    snprintf(what, sizeof what, "rep %d, tree of %zu", rep, nparts);
    bxt_check_acc_vs(what, &parts[0], &want);
    CHECK(parts[0].naccs == (int64_t)nparts, "naccs %lld", (long long)parts[0].naccs);
    CHECK_STATUS(bx_acc_check(&parts[0]), BX_OK, "tree result");
    /* into == from: doubles everything */
    bx_acc twice = parts[0];
    bx_acc_merge(&twice, &twice);
    ref_sum want2;
    ref_sum_init(&want2);
    mpfr_mul_2ui(want2.sum, want.sum, 1, MPFR_RNDN);
    want2.nan_count = 2 * want.nan_count;
    want2.inf_count = 2 * want.inf_count;
    want2.count = 2 * want.count;
    snprintf(what, sizeof what, "rep %d, merged with itself", rep);
    bxt_check_acc_vs(what, &twice, &want2);
    CHECK(twice.naccs == 2 * (int64_t)nparts, "self-merge naccs");
    CHECK_STATUS(bx_acc_check(&twice), BX_OK, "self-merge version");
    ref_sum_clear(&want2);
    ref_sum_clear(&want);
    dataset_free(&d);
  }
}

/* The header promises that the word sum of 2^31 normalised non-negative
 * accumulators is exact. The worst case per word is every digit at
 * 2^32 - 1: scale such an accumulator's words by 2^31 and compare. */
void test_merge_many_accumulators(void) {
  bxt_rng r;
  bxt_rng_init(&r);
  mpfr_t exact;
  mpfr_init2(exact, REF_SUM_PREC + 128);
  for (int rep = 0; rep < 6; rep++) {
    bx_acc one;
    bx_acc_init(&one);
    if (rep < 3) { /* a real accumulator */
      bxt_tensor x;
      bxt_tensor_alloc(&x, rep == 0 ? REF_F64 : REF_F32, 3000);
      bxt_fill_wide(&r, &x);
      bx_acc_add_squares(&one, &x.t);
      bxt_tensor_free(&x);
    } else { /* all-ones digits in a window (a valid normalised accumulator) */
      int lo = rep == 3 ? 0 : rep == 4 ? 40 : 100;
      for (int i = lo; i < lo + 30 && i < BX_ACC_DIGITS - 1; i++) one.digit[i] = 0xFFFFFFFFll;
      one.count = 1000;
    }
    bx_acc many = one;
    const int64_t k = (int64_t)1 << 31;
    for (int i = 0; i < BX_ACC_WORDS; i++) ((int64_t *)&many)[i] = ((int64_t *)&one)[i] * k;
    CHECK_STATUS(bx_acc_check(&many), BX_OK, "rep %d: 2^31 accumulators' version word", rep);
    ref_acc_words_value(exact, one.digit, BX_ACC_DIGITS, BX_ACC_LSB_EXP);
    mpfr_mul_2ui(exact, exact, 31, MPFR_RNDN);
    CHECK_BITS_D(bx_acc_value(&many), ref_round_d(exact), "rep %d: value of 2^31 copies", rep);
    CHECK_BITS_D(bx_acc_sqrt(&many), ref_sqrt_d(exact), "rep %d: sqrt of 2^31 copies", rep);
    CHECK_BITS_F(bx_acc_sqrtf(&many), ref_sqrt_f(exact), "rep %d: sqrtf", rep);
    /* and as a merge of two halves of 2^30 each */
    bx_acc half = one, half2;
    for (int i = 0; i < BX_ACC_WORDS; i++) ((int64_t *)&half)[i] = ((int64_t *)&one)[i] * (k / 2);
    half2 = half;
    bx_acc_merge(&half, &half2);
    CHECK(bx_acc_compare(&half, &many) == 0, "rep %d: merge of two 2^30 sums", rep);
    CHECK_BITS_D(bx_acc_value(&half), ref_round_d(exact), "rep %d: merged value", rep);
    CHECK_STATUS(bx_acc_check(&half), BX_OK, "rep %d: merged version", rep);
  }
  mpfr_clear(exact);
}

void test_acc_check_versions(void) {
  bx_acc a, b;
  bx_acc_init(&a);
  CHECK_STATUS(bx_acc_check(&a), BX_OK, "fresh");
  a.version = BX_ACC_VERSION_TAG + 1; /* a different format */
  CHECK_STATUS(bx_acc_check(&a), BX_EMISMATCH, "another format's tag");
  CHECK(bx_last_error()[0] != '\0', "a message explains the mismatch");
  bx_acc_init(&a);
  bx_acc_init(&b);
  b.version = BX_ACC_VERSION_TAG - BX_ACC_FORMAT + (BX_ACC_FORMAT + 1); /* next format's build */
  int64_t words[BX_ACC_WORDS];
  for (int i = 0; i < BX_ACC_WORDS; i++) words[i] = ((int64_t *)&a)[i] + ((int64_t *)&b)[i];
  bx_acc sum;
  memcpy(&sum, words, sizeof sum);
  CHECK_STATUS(bx_acc_check(&sum), BX_EMISMATCH, "summed with another build's accumulator");
  bx_acc_init(&b);
  for (int i = 0; i < BX_ACC_WORDS; i++) words[i] = ((int64_t *)&a)[i] + ((int64_t *)&b)[i];
  memcpy(&sum, words, sizeof sum);
  CHECK_STATUS(bx_acc_check(&sum), BX_OK, "two of this build");
  sum.naccs = 3; /* naccs and version disagree */
  CHECK_STATUS(bx_acc_check(&sum), BX_EMISMATCH, "naccs 3 with a version of 2");
  memset(&sum, 0, sizeof sum);
  CHECK_STATUS(bx_acc_check(&sum), BX_EMISMATCH, "all-zero (never initialised)");
  sum.naccs = -1;
  sum.version = -BX_ACC_VERSION_TAG;
  CHECK_STATUS(bx_acc_check(&sum), BX_EMISMATCH, "naccs -1");
  bx_acc_merge(&a, &b);
  CHECK_STATUS(bx_acc_check(&a), BX_OK, "after bx_acc_merge");
  CHECK(a.naccs == 2 && a.version == 2 * BX_ACC_VERSION_TAG, "merge adds naccs and version");
  CHECK(bx_acc_check(NULL) != BX_OK, "NULL is not a valid accumulator");
}
