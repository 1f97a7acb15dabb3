/*
 * fuzz_tokred.c — the token reduction (bitexact_train.h): random fp32
 * addends (one tensor of a few elements, up to 64 chunks) and a random
 * split of the chunks into states (micro-batches / threads / ranks) merged
 * in a random order, against the exact MPFR reference of the documented
 * grid: E = max frexp exponent, e = E - min(51, 62 - ceil(log2 N)),
 * q = rint(a / 2^e), Q = sum q, result = Q 2^e (and Q 2^e / T) rounded
 * once. Also: one state holding every chunk gives the same words as the
 * split, and the grid error stays within N 2^(e-1). Then a stated bound
 * (BX_TOKRED_BOUND_FLAG, E - 2 .. E + 3 from byte size-2) on the same
 * split: the observed exponent is E after the merges, the state is flagged
 * exactly when the bound is below E (finish refuses it), and otherwise
 * the sums are the reference's on the stated grid.
 *
 * Input: byte 0: elements (1..8), byte 1: chunks (1..64), byte 2: tokens
 * per chunk (1..16, the last chunk shorter by byte 3 mod C), then per chunk
 * a state index byte and 4 bytes per element (raw fp32 bits; non-finite
 * ones are cleared to 0).
 */
#include "bitexact_train.h"
#include "fuzz_common.h"
#include "tokred_grid.h"
#include "tokred_ref.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FZ_MAXE 8
#define FZ_MAXC 64
#define FZ_MAXS 6

static inline void fz_check(bx_status st, const char *what) {
  if (st != BX_OK) FZ_FAIL("%s: %s", what, bx_last_error());
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 4) return 0;
  int n = 1 + data[0] % FZ_MAXE;
  int64_t N = 1 + data[1] % FZ_MAXC;
  int64_t C = 1 + data[2] % 16;
  int64_t T = N * C - (int64_t)(data[3] % C);
  size_t at = 4;
  static float part[FZ_MAXC][FZ_MAXE];
  int owner[FZ_MAXC];
  for (int64_t c = 0; c < N; c++) {
    owner[c] = at < size ? data[at] % FZ_MAXS : 0;
    at++;
    for (int i = 0; i < n; i++) {
      uint32_t u = 0;
      if (at + 4 <= size) memcpy(&u, data + at, 4);
      at += 4;
      if ((u & 0x7fffffffu) >= 0x7f800000u) u = 0;
      memcpy(&part[c][i], &u, 4);
    }
  }
  int64_t shape[1] = {n};
  DLTensor g;
  memset(&g, 0, sizeof g);
  g.device.device_type = kDLCPU;
  g.ndim = 1;
  g.shape = shape;
  g.dtype.code = kDLFloat;
  g.dtype.bits = 32;
  g.dtype.lanes = 1;
  bx_tokred *all = NULL, *st[FZ_MAXS] = {0};
  fz_check(bx_tokred_create(&g, 1, C, T, NULL, &all), "create");
  for (int64_t c = 0; c < N; c++) {
    DLTensor p = g;
    p.data = part[c];
    fz_check(bx_tokred_bound(all, 0, c, &p), "bound");
  }
  fz_check(bx_tokred_agree(all, NULL), "agree");
  for (int k = 0; k < FZ_MAXS; k++) fz_check(bx_tokred_fork(all, &st[k]), "fork");
  for (int64_t c = 0; c < N; c++) {
    DLTensor p = g;
    p.data = part[c];
    fz_check(bx_tokred_add(st[owner[c]], 0, c, &p), "add split");
  }
  bx_tokred *one = NULL;
  fz_check(bx_tokred_fork(all, &one), "fork one");
  for (int64_t c = N - 1; c >= 0; c--) { /* reverse order: still the same words */
    DLTensor p = g;
    p.data = part[c];
    fz_check(bx_tokred_add(one, 0, c, &p), "add one");
  }
  int first = data[size - 1] % FZ_MAXS;
  for (int k = 0; k < FZ_MAXS; k++) fz_check(bx_tokred_merge(all, st[(first + k) % FZ_MAXS]), "merge");
  int64_t *wa, *wo;
  size_t na, no;
  fz_check(bx_tokred_words(all, &wa, &na), "words");
  fz_check(bx_tokred_words(one, &wo, &no), "words one");
  if (na != no || memcmp(wa, wo, na * sizeof *wa) != 0) FZ_FAIL("split words differ from one state's");
  float sum[FZ_MAXE];
  double mean[FZ_MAXE];
  DLTensor os = g, om = g;
  os.data = sum;
  om.data = mean;
  om.dtype.bits = 64;
  fz_check(bx_tokred_finish(all, &os, 1, 1), "finish sum");
  fz_check(bx_tokred_finish(all, &om, 1, T), "finish mean");
  int e;
  fz_check(bx_tokred_grid_exp(all, 0, &e), "grid");
  /* the reference */
  int E = -149;
  for (int64_t c = 0; c < N; c++)
    for (int i = 0; i < n; i++)
      if (part[c][i] != 0.0f) {
        int ex;
        frexpf(part[c][i], &ex);
        if (ex > E) E = ex;
      }
  int P = 62 - bx_tokred_ceil_log2(N);
  if (P > 51) P = 51;
  if (e != E - P) FZ_FAIL("grid 2^%d, reference 2^%d", e, E - P);
  mpfr_t Q, quo;
  mpfr_init2(Q, 600);
  mpfr_init2(quo, 2000);
  for (int i = 0; i < n; i++) {
    if (!bxt_tokred_ref_element(&part[0][i], FZ_MAXE, N, e, Q))
      FZ_FAIL("element %d: grid error above N 2^(e-1)", i);
    fz_same_f(sum[i], ref_round_f(Q), "sum", "-");
    mpfr_div_si(quo, Q, (long)T, MPFR_RNDZ); /* T <= 1024: no long zero runs */
    fz_same_d(mean[i], ref_round_d(quo), "mean", "-");
  }
  /* a stated bound under BX_TOKRED_BOUND_FLAG */
  int stated = E + (int)(size >= 2 ? data[size - 2] % 6 : 0) - 2;
  stated = stated < -149 ? -149 : stated > 128 ? 128 : stated;
  bx_tokred_opts fo = BX_TOKRED_OPTS_DEFAULT;
  fo.on_bound = BX_TOKRED_BOUND_FLAG;
  bx_tokred *fl = NULL, *fs[FZ_MAXS] = {0};
  fz_check(bx_tokred_create(&g, 1, C, T, &fo, &fl), "create flag");
  fz_check(bx_tokred_bound_exp(fl, 0, stated), "bound_exp");
  fz_check(bx_tokred_agree(fl, NULL), "agree flag");
  for (int k = 0; k < FZ_MAXS; k++) fz_check(bx_tokred_fork(fl, &fs[k]), "fork flag");
  for (int64_t c = 0; c < N; c++) {
    DLTensor p = g;
    p.data = part[c];
    fz_check(bx_tokred_add(fs[owner[c]], 0, c, &p), "add flag");
  }
  for (int k = 0; k < FZ_MAXS; k++) fz_check(bx_tokred_merge(fl, fs[(first + k) % FZ_MAXS]), "merge flag");
  int obs;
  int64_t flagged;
  fz_check(bx_tokred_observed(fl, 0, &obs, &flagged), "observed");
  if (obs != E) FZ_FAIL("observed 2^%d, reference 2^%d", obs, E);
  if ((flagged != 0) != (stated < E)) FZ_FAIL("flagged %lld with bound 2^%d, largest 2^%d", (long long)flagged, stated, E);
  float before = sum[0];
  bx_status fst = bx_tokred_finish(fl, &os, 1, 1);
  if (flagged) {
    if (fst != BX_EINVAL || sum[0] != before) FZ_FAIL("a flagged state finished (%d)", (int)fst);
  } else {
    fz_check(fst, "finish flag");
    for (int i = 0; i < n; i++) {
      if (!bxt_tokred_ref_element(&part[0][i], FZ_MAXE, N, stated - P, Q))
        FZ_FAIL("element %d: stated grid error above N 2^(e-1)", i);
      fz_same_f(sum[i], ref_round_f(Q), "stated sum", "-");
    }
  }
  for (int k = 0; k < FZ_MAXS; k++) bx_tokred_destroy(fs[k]);
  bx_tokred_destroy(fl);
  mpfr_clears(Q, quo, (mpfr_ptr)0);
  for (int k = 0; k < FZ_MAXS; k++) bx_tokred_destroy(st[k]);
  bx_tokred_destroy(one);
  bx_tokred_destroy(all);
  return 0;
}
