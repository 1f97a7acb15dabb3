/*
 * checks.c — shared comparisons against the reference (see checks.h).
 */
#include "checks.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

int bxt_check_acc_vs(const char *what, const bx_acc *acc, const ref_sum *want) {
  int before = bxt_failures();
  /* DESIGN §2: a counted NaN reads as NaN, else a counted Inf as +Inf */
  if (want->nan_count > 0 || want->inf_count > 0) {
    double d = want->nan_count > 0 ? NAN : INFINITY;
    float f = (float)d;
    CHECK_BITS_D(bx_acc_value(acc), d, "%s: bx_acc_value with NaN/Inf counted", what);
    CHECK_BITS_D(bx_acc_sqrt(acc), d, "%s: bx_acc_sqrt with NaN/Inf counted", what);
    CHECK_BITS_F(bx_acc_valuef(acc), f, "%s: bx_acc_valuef with NaN/Inf counted", what);
    CHECK_BITS_F(bx_acc_sqrtf(acc), f, "%s: bx_acc_sqrtf with NaN/Inf counted", what);
  }
  /* the exact sum of the finite elements, read with the counters cleared */
  bx_acc finite = *acc;
  finite.nan_count = finite.inf_count = 0;
  CHECK_BITS_D(bx_acc_value(&finite), ref_round_d(want->sum), "%s: bx_acc_value", what);
  CHECK_BITS_D(bx_acc_sqrt(&finite), ref_sqrt_d(want->sum), "%s: bx_acc_sqrt", what);
  CHECK_BITS_F(bx_acc_valuef(&finite), ref_round_f(want->sum), "%s: bx_acc_valuef", what);
  CHECK_BITS_F(bx_acc_sqrtf(&finite), ref_sqrt_f(want->sum), "%s: bx_acc_sqrtf", what);
  CHECK(acc->nan_count == want->nan_count, "%s: nan_count %lld want %lld", what,
        (long long)acc->nan_count, (long long)want->nan_count);
  CHECK(acc->inf_count == want->inf_count, "%s: inf_count %lld want %lld", what,
        (long long)acc->inf_count, (long long)want->inf_count);
  CHECK(acc->count == want->count, "%s: count %lld want %lld", what,
        (long long)acc->count, (long long)want->count);
  return bxt_failures() - before;
}

/* Header: every function that writes a bx_acc leaves it normalised. */
static void check_normalised(const char *what, const bx_acc *acc) {
  for (int i = 0; i < BX_ACC_DIGITS - 1; i++)
    if (!CHECK(acc->digit[i] >= 0 && acc->digit[i] < (1ll << 32),
               "%s: digit[%d] = %lld is not normalised", what, i,
               (long long)acc->digit[i]))
      break;
}

int bxt_check_acc(const char *what, bxt_tensor *xs, size_t count) {
  int before = bxt_failures();
  for (int op = 0; op < 2; op++) {
    ref_sum want;
    ref_sum_init(&want);
    for (size_t k = 0; k < count; k++)
      (op ? bxt_ref_abs : bxt_ref_squares)(&want, &xs[k]);
    for (int isa = 0; isa < bxt_isa_count(); isa++) {
      char label[256];
      snprintf(label, sizeof label, "%s, %s, isa %s", what,
               op ? "add_abs" : "add_squares", bxt_isa(isa));
      if (!CHECK(bxt_force(isa), "%s: cannot force the ISA", label)) continue;
      bx_acc acc;
      bx_acc_init(&acc);
      for (size_t k = 0; k < count; k++) {
        bx_status st = op ? bx_acc_add_abs(&acc, &xs[k].t) : bx_acc_add_squares(&acc, &xs[k].t);
        CHECK_STATUS(st, BX_OK, "%s: tensor %zu (%s, %zu elements)", label, k,
                     bxt_dt_name(xs[k].dt), xs[k].n);
      }
      bxt_check_acc_vs(label, &acc, &want);
      CHECK(acc.naccs == 1 && acc.version == BX_ACC_VERSION_TAG,
            "%s: naccs %lld version %lld", label, (long long)acc.naccs,
            (long long)acc.version);
      CHECK_STATUS(bx_acc_check(&acc), BX_OK, "%s: bx_acc_check", label);
      check_normalised(label, &acc);
      if (bxt_failures() - before > 8) break;
    }
    bxt_force(-1);
    ref_sum_clear(&want);
  }
  return bxt_failures() - before;
}

void bxt_check_values(const char *what, int dt, const double *v, size_t n) {
  bxt_tensor x;
  bxt_tensor_from(&x, dt, v, n);
  bxt_check_acc(what, &x, 1);
  bxt_tensor_free(&x);
}

double bxt_ref_norm(bxt_tensor *const *xs, size_t count, double p) {
  int any_nan = 0, any_inf = 0;
  for (size_t k = 0; k < count; k++)
    for (size_t i = 0; i < xs[k]->n; i++) {
      double v = bxt_get(xs[k], i);
      any_nan |= isnan(v);
      any_inf |= isinf(v);
    }
  /* DESIGN §2: p = 0 counts NaN and Inf as non-zero (v != 0 holds for
   * both); every other p: NaN gives NaN */
  if (any_nan && p != 0) return NAN;
  if (any_inf && p > 0) return INFINITY;
  if (p == 2 || p == 1) {
    ref_sum s;
    ref_sum_init(&s);
    for (size_t k = 0; k < count; k++)
      (p == 2 ? bxt_ref_squares : bxt_ref_abs)(&s, xs[k]);
    double r = p == 2 ? ref_sqrt_d(s.sum) : ref_round_d(s.sum);
    ref_sum_clear(&s);
    return r;
  }
  if (p == 0) {
    double nz = 0;
    for (size_t k = 0; k < count; k++)
      for (size_t i = 0; i < xs[k]->n; i++) nz += bxt_get(xs[k], i) != 0;
    return nz;
  }
  if (p == INFINITY) {
    double m = 0;
    for (size_t k = 0; k < count; k++)
      for (size_t i = 0; i < xs[k]->n; i++) m = fmax(m, fabs(bxt_get(xs[k], i)));
    return m;
  }
  if (p == -INFINITY) {
    double m = INFINITY;
    for (size_t k = 0; k < count; k++)
      for (size_t i = 0; i < xs[k]->n; i++) m = fmin(m, fabs(bxt_get(xs[k], i)));
    return m;
  }
  return NAN; /* other p with finite data: no exact reference */
}

double bxt_ref_megatron(bxt_tensor *const *xs, size_t count) {
  int any_nan = 0, any_inf = 0;
  ref_sum s;
  ref_sum_init(&s);
  mpfr_t t;
  mpfr_init2(t, 64);
  for (size_t k = 0; k < count; k++)
    for (size_t i = 0; i < xs[k]->n; i++) {
      double v = bxt_get(xs[k], i);
      if (isnan(v)) {
        any_nan = 1;
        continue;
      }
      double v32 = ref_double_to(REF_F32, v); /* element to fp32 */
      if (isinf(v32)) {
        any_inf = 1;
        continue;
      }
      double sq32 = ref_mul_round(v32, v32, REF_F32); /* square rounded to fp32 */
      if (isinf(sq32)) {
        any_inf = 1;
        continue;
      }
      ref_add_double(&s, sq32); /* exact sum */
    }
  double r;
  if (any_nan)
    r = NAN;
  else if (any_inf)
    r = INFINITY;
  else {
    double sum32 = ref_round_fmt(s.sum, REF_FMT[REF_F32]); /* one rounding */
    mpfr_set_d(t, sum32, MPFR_RNDN);
    r = ref_sqrt_fmt(t, REF_FMT[REF_F32]); /* fp32 sqrt of that (Inf stays Inf) */
    if (isinf(sum32)) r = INFINITY;
  }
  mpfr_clear(t);
  ref_sum_clear(&s);
  return r;
}

size_t bxt_pow2_square_terms(const int *pos, size_t npos, double *out) {
  size_t n = 0;
  for (size_t j = 0; j < npos; j++) {
    int p = pos[j];
    int k = p >= 0 ? p / 2 : -((-p + 1) / 2); /* floor(p / 2) */
    out[n++] = ldexp(1.0, k);
    if (p - 2 * k == 1) out[n++] = ldexp(1.0, k); /* 2 * 2^(2k) = 2^(2k+1) */
  }
  return n;
}

size_t bxt_bit_positions(unsigned __int128 v, int shift, int *pos) {
  size_t n = 0;
  for (int b = 0; b < 128; b++)
    if ((v >> b) & 1) pos[n++] = b + shift;
  return n;
}

void bxt_tensor_from(bxt_tensor *x, int dt, const double *v, size_t n) {
  bxt_tensor_alloc(x, dt, n);
  for (size_t i = 0; i < n; i++) bxt_set_bits(x, i, ref_encode(dt, v[i]));
}

static void layout_fill(bxt_layout *l, bxt_tensor **order, size_t n, const size_t *sizes,
                        size_t ngroups) {
  l->n = n;
  l->ngroups = ngroups;
  for (size_t i = 0; i < n; i++) {
    l->src[i] = order[i];
    l->dl[i] = order[i]->t;
  }
  size_t at = 0;
  for (size_t g = 0; g < ngroups; g++) {
    l->groups[g].tensors = sizes[g] ? &l->dl[at] : NULL;
    l->groups[g].count = sizes[g];
    at += sizes[g];
  }
}

void bxt_layout_random(bxt_rng *r, bxt_layout *l, bxt_tensor *xs, size_t n, size_t ngroups,
                       int no_empty) {
  bxt_tensor *order[BXT_MAX_TENSORS];
  size_t sizes[BXT_MAX_GROUPS] = {0};
  for (size_t i = 0; i < n; i++) order[i] = &xs[i];
  bxt_shuffle(r, order, n, sizeof order[0]);
  if (no_empty && ngroups > n) ngroups = n ? n : 1;
  for (size_t i = 0; i < n; i++) sizes[bxt_below(r, ngroups)]++;
  if (no_empty) { /* move one tensor into every empty group */
    for (size_t g = 0; g < ngroups; g++)
      while (sizes[g] == 0)
        for (size_t h = 0; h < ngroups && sizes[g] == 0; h++)
          if (sizes[h] > 1) {
            sizes[h]--;
            sizes[g]++;
          }
  }
  layout_fill(l, order, n, sizes, ngroups);
}

void bxt_layout_single(bxt_layout *l, bxt_tensor *xs, size_t n) {
  bxt_tensor *order[BXT_MAX_TENSORS];
  size_t sizes[1] = {n};
  for (size_t i = 0; i < n; i++) order[i] = &xs[i];
  layout_fill(l, order, n, sizes, 1);
}

size_t bxt_layout_first(const bxt_layout *l, size_t g) {
  size_t at = 0;
  for (size_t h = 0; h < g; h++) at += l->groups[h].count;
  return at;
}

void bxt_tensors_random(bxt_rng *r, bxt_tensor *xs, size_t n, size_t max_len) {
  for (size_t k = 0; k < n; k++) {
    int dt = (int)bxt_below(r, REF_NDT);
    size_t len = bxt_below(r, 10) == 0 ? 0 : 1 + bxt_below(r, bxt_below(r, 3) ? max_len / 8 + 1 : max_len);
    bxt_tensor_alloc(&xs[k], dt, len);
    bxt_fill_mixed(r, &xs[k]);
  }
}

void bxt_tensors_free(bxt_tensor *xs, size_t n) {
  for (size_t k = 0; k < n; k++) bxt_tensor_free(&xs[k]);
}

/* ---- scaling references --------------------------------------------- */
_Static_assert(FLT_EVAL_METHOD == 0, "the torch formula assumes float math in float");

uint64_t bxt_torch_scale_bits(int dt, uint64_t g, double coef) {
  float c32 = (float)coef; /* nearest even */
  switch (dt) {
  case REF_F32: {
    float x;
    uint32_t u = (uint32_t)g;
    memcpy(&x, &u, 4);
    return bxt_fbits(x * c32);
  }
  case REF_F64: {
    double x;
    memcpy(&x, &g, 8);
    return bxt_dbits(x * coef);
  }
  case REF_BF16:
    return bxt_f32_to_bf16(bxt_bf16_to_f32((uint16_t)g) * c32);
  default:
    return bxt_f32_to_f16(bxt_f16_to_f32((uint16_t)g) * c32);
  }
}

uint64_t bxt_exact_scale_bits(int dt, uint64_t g, double coef) {
  double x = ref_elem(dt, &g, 0); /* little-endian: the low bytes hold the element */
  return ref_encode(dt, ref_mul_round(x, coef, dt));
}

int bxt_check_scaled(const char *what, const bxt_tensor *before, const bxt_tensor *after,
                     double coef, bx_scale_mode mode, int strict_zero_sign) {
  int fails = 0;
  for (size_t i = 0; i < before->n; i++) {
    uint64_t g = bxt_get_bits(before, i), got = bxt_get_bits(after, i);
    uint64_t want = mode == BX_SCALE_TORCH ? bxt_torch_scale_bits(before->dt, g, coef)
                                           : bxt_exact_scale_bits(before->dt, g, coef);
    double wv = ref_elem(before->dt, &want, 0), gv = ref_elem(before->dt, &got, 0);
    int ok = isnan(wv) ? isnan(gv) : got == want;
    if (!ok && !strict_zero_sign && wv == 0) ok = gv == 0;
    if (!ok) {
      fails++;
      if (fails <= 3)
        bxt_check(0, __FILE__, __LINE__, "scaled element",
                  "%s: %s %s element %zu: g=%a coef=%a: got 0x%llx (%a) want 0x%llx (%a)", what,
              mode == BX_SCALE_TORCH ? "torch" : "exact", bxt_dt_name(before->dt), i,
              ref_elem(before->dt, &g, 0), coef, (unsigned long long)got, gv,
              (unsigned long long)want, wv);
    }
  }
  if (fails > 3) bxt_check(0, __FILE__, __LINE__, "scaled elements", "%s: %d differ in all", what, fails);
  return fails;
}
