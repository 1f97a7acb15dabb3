/*
 * test_tokred.c — the layout-invariant token reduction (bitexact_train.h,
 * "Token reduction"): the grid's numerics against MPFR, a whole reduction
 * against an exact MPFR reference of the documented grid rounding (bit for
 * bit, and the accuracy bound), invariance over random splits into ranks
 * (simulated in threads with a bx_comm), micro-batches and thread states
 * merged in random orders, the ordinary mode drifting on the same kind of
 * split, refused layouts and bad arguments.
 *
 * The addends are written here: the fixed-order chunk partial of a dense
 * weight gradient X^T dY (tokens in increasing order, fp32, no
 * contraction), of a gain (sum of dY * X[:, 0]) and of a loss (a scalar).
 */
#include <errno.h>
#include <math.h>
#include <mpfr.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bitexact_train.h"
#include "harness.h"
#include "sim_comm.h"
#include "mpfr_ref.h"
#include "tests.h"
#include "tokred_grid.h"
#include "tokred_ref.h"
#include "util.h"

#define DIN 5
#define DOUT 7
#define NT 3 /* tensors: W [DIN, DOUT], gain [DOUT], loss [] */
#define MAXT 256
#define MAXR 4

static const int64_t numel_of[NT] = {DIN * DOUT, DOUT, 1};

typedef struct batch {
  int64_t T, C, N;
  float x[MAXT][DIN], dy[MAXT][DOUT], loss[MAXT];
} batch;

static float scaled(bxt_rng *r, int spread) {
  double v = bxt_normal(r) * ldexp(1.0, (int)bxt_below(r, (uint64_t)spread + 1) - spread / 2);
  return (float)v;
}

static void batch_make(bxt_rng *r, batch *b, int64_t T, int64_t C, int spread) {
  b->T = T;
  b->C = C;
  b->N = T / C + (T % C != 0);
  for (int64_t t = 0; t < T; t++) {
    for (int i = 0; i < DIN; i++) b->x[t][i] = scaled(r, spread);
    for (int j = 0; j < DOUT; j++) b->dy[t][j] = scaled(r, spread);
    b->loss[t] = (float)fabs((double)scaled(r, spread));
  }
}

/* The canonical addend of tensor k for chunk c: fixed token order. */
static void chunk_partial(const batch *b, int k, int64_t c, float *out) {
  int64_t t0 = c * b->C, t1 = t0 + b->C < b->T ? t0 + b->C : b->T;
  for (int64_t i = 0; i < numel_of[k]; i++) out[i] = 0.0f;
  for (int64_t t = t0; t < t1; t++) {
    if (k == 0) {
      for (int i = 0; i < DIN; i++)
        for (int j = 0; j < DOUT; j++) {
          volatile float p = b->x[t][i] * b->dy[t][j];
          out[i * DOUT + j] += p;
        }
    } else if (k == 1) {
      for (int j = 0; j < DOUT; j++) {
        volatile float p = b->x[t][0] * b->dy[t][j];
        out[j] += p;
      }
    } else {
      out[0] += b->loss[t];
    }
  }
}

static int64_t shapes[NT][2] = {{DIN, DOUT}, {DOUT, 0}, {0, 0}};
static const int ndims[NT] = {2, 1, 0};

static DLTensor view(void *data, int k, int f64) {
  DLTensor t;
  memset(&t, 0, sizeof t);
  t.data = data;
  t.device.device_type = kDLCPU;
  t.ndim = ndims[k];
  t.shape = ndims[k] ? shapes[k] : NULL;
  t.dtype.code = kDLFloat;
  t.dtype.bits = f64 ? 64 : 32;
  t.dtype.lanes = 1;
  return t;
}

static void grads_like(DLTensor *g) {
  for (int k = 0; k < NT; k++) g[k] = view(NULL, k, 0);
}

/* ---- the exact reference ------------------------------------------------ */

typedef struct result {
  float sum[NT][DIN * DOUT];
  double mean[NT][DIN * DOUT];
  float mean32[NT][DIN * DOUT];
  int grid[NT];
  int observed[NT]; /* bx_tokred_observed: the largest frexp exponent of any addend element */
  int64_t flagged[NT];
} result;

/* The documented grid, with MPFR: E = max frexp exponent, e = E - P,
 * q = rint(a / 2^e), Q = sum q exactly, then Q 2^e (/ T) rounded once. The
 * accuracy bound |Q 2^e - exact| <= N 2^(e-1) is checked on the way. */
static void reference_stated(const batch *b, result *ref, const int *stated) {
  int P = 62 - bx_tokred_ceil_log2(b->N);
  if (P > 51) P = 51;
  static float part[1 << 14][DIN * DOUT];
  for (int k = 0; k < NT; k++) {
    int E = -149;
    for (int64_t c = 0; c < b->N; c++) {
      chunk_partial(b, k, c, part[c]);
      for (int64_t i = 0; i < numel_of[k]; i++)
        if (part[c][i] != 0.0f) {
          int ex;
          frexpf(part[c][i], &ex);
          if (ex > E) E = ex;
        }
    }
    ref->observed[k] = E;
    if (stated) E = stated[k]; /* the caller's bound (at or above the observed one) */
    int e = E - P;
    ref->grid[k] = e;
    mpfr_t Q, tmp;
    mpfr_inits2(600, Q, tmp, (mpfr_ptr)0);
    for (int64_t i = 0; i < numel_of[k]; i++) {
      CHECK(bxt_tokred_ref_element(&part[0][i], DIN * DOUT, b->N, e, Q),
            "tensor %d element %lld: grid error above N 2^(e-1)", k, (long long)i);
      ref->sum[k][i] = ref_round_f(Q);
      /* Q / T at 2000 bits, truncated: the quotient of a 63-bit integer by
       * T <= 256 has no run of 1900 zero bits unless it is exact, so this
       * rounds like the exact quotient */
      mpfr_set_prec(tmp, 2000);
      mpfr_div_si(tmp, Q, (long)b->T, MPFR_RNDZ);
      ref->mean[k][i] = ref_round_d(tmp);
      ref->mean32[k][i] = ref_round_f(tmp);
      mpfr_set_prec(tmp, 600);
    }
    mpfr_clears(Q, tmp, (mpfr_ptr)0);
  }
}

static void reference(const batch *b, result *ref) { reference_stated(b, ref, NULL); }

/* ---- simulated ranks: sim_comm.h ---------------------------------------- */
typedef bxt_world world;
typedef bxt_rank_ctx rank_ctx;

/* ---- one rank's step under a layout -------------------------------------- */

#define MAXMB 8
#define MAXTH 4

typedef struct rank_job {
  const batch *b;
  bx_tokred_mode mode;
  int64_t tok_begin, tok_end;        /* this rank's global tokens */
  int nmb;                            /* micro-batches: cut points below */
  int64_t mb_cut[MAXMB + 1];         /* token boundaries, mb_cut[0] = tok_begin */
  int nthreads;                       /* thread states per micro-batch */
  uint64_t seed;                      /* chunk -> thread and merge orders */
  int64_t total_override;             /* != 0: this rank claims another T */
  const int *stated;                  /* != NULL: bounds stated (bx_tokred_bound_exp) under
                                         BX_TOKRED_BOUND_FLAG instead of bx_tokred_bound */
  rank_ctx ctx;
  bx_comm comm;
  int use_comm;
  int float_comm;                     /* the comm offers allreduce_f32 */
  bx_status st;
  char err[512];
  result out;
} rank_job;

/* st, noting the first failure's text in j->err */
static bx_status note(rank_job *j, bx_status st) {
  if (st != BX_OK && !j->err[0]) snprintf(j->err, sizeof j->err, "%s", bx_last_error());
  return st;
}

static bx_status rank_step(rank_job *j) {
  const batch *b = j->b;
  bx_tokred_opts o = BX_TOKRED_OPTS_DEFAULT;
  o.mode = j->mode;
  if (j->stated) o.on_bound = BX_TOKRED_BOUND_FLAG;
  DLTensor g[NT];
  grads_like(g);
  bx_tokred *s = NULL, *th[MAXTH] = {0};
  const bx_comm *comm = j->use_comm ? &j->comm : NULL;
  float part[DIN * DOUT];
  bxt_rng r;
  bxt_rng_seed(&r, j->seed);
  bx_status st = note(j, bx_tokred_create(g, NT, b->C, j->total_override ? j->total_override : b->T, &o, &s));
  if (st != BX_OK) return st;
  int64_t c0, c1;
  st = note(j, bx_tokred_chunks(s, j->tok_begin, j->tok_end, &c0, &c1));
  for (int64_t c = c0; st == BX_OK && c < c1 && !j->stated; c++)
    for (int k = 0; k < NT && st == BX_OK; k++) {
      chunk_partial(b, k, c, part);
      DLTensor p = view(part, k, 0);
      st = note(j, bx_tokred_bound(s, (size_t)k, c, &p));
    }
  for (int k = 0; k < NT && st == BX_OK && j->stated; k++)
    st = note(j, bx_tokred_bound_exp(s, (size_t)k, j->stated[k]));
  if (st == BX_OK || comm) { /* a failed rank still joins the agreement */
    bx_status a = note(j, bx_tokred_agree(s, comm));
    if (st == BX_OK) st = a;
  }
  for (int m = 0; st == BX_OK && m < j->nmb; m++) {
    int64_t m0, m1;
    st = note(j, bx_tokred_chunks(s, j->mb_cut[m], j->mb_cut[m + 1], &m0, &m1));
    for (int t = 0; st == BX_OK && t < j->nthreads; t++) st = note(j, bx_tokred_fork(s, &th[t]));
    for (int64_t c = m0; st == BX_OK && c < m1; c++) {
      int t = (int)bxt_below(&r, (uint64_t)j->nthreads);
      for (int k = 0; k < NT && st == BX_OK; k++) {
        chunk_partial(b, k, c, part);
        DLTensor p = view(part, k, 0);
        st = note(j, bx_tokred_add(th[t], (size_t)k, c, &p));
      }
    }
    int order[MAXTH];
    for (int t = 0; t < j->nthreads; t++) order[t] = t;
    bxt_shuffle(&r, order, (size_t)j->nthreads, sizeof order[0]);
    for (int t = 0; st == BX_OK && t < j->nthreads; t++) st = note(j, bx_tokred_merge(s, th[order[t]]));
    for (int t = 0; t < j->nthreads; t++) {
      bx_tokred_destroy(th[t]);
      th[t] = NULL;
    }
  }
  if (st == BX_OK || comm) {
    bx_status a = comm ? note(j, bx_tokred_allreduce(s, comm)) : BX_OK;
    if (st == BX_OK) st = a;
  }
  DLTensor out[NT], mean[NT], mean32[NT];
  for (int k = 0; k < NT; k++) {
    out[k] = view(j->out.sum[k], k, 0);
    mean[k] = view(j->out.mean[k], k, 1);
    mean32[k] = view(j->out.mean32[k], k, 0);
  }
  for (int k = 0; k < NT && st == BX_OK; k++)
    st = note(j, bx_tokred_observed(s, (size_t)k, &j->out.observed[k], &j->out.flagged[k]));
  if (st == BX_OK) st = note(j, bx_tokred_finish(s, out, NT, 1));
  if (st == BX_OK) st = note(j, bx_tokred_finish(s, mean, NT, b->T));
  if (st == BX_OK) st = note(j, bx_tokred_finish(s, mean32, NT, b->T));
  for (int k = 0; k < NT && st == BX_OK && j->mode == BX_TOKRED_GRID; k++)
    st = note(j, bx_tokred_grid_exp(s, (size_t)k, &j->out.grid[k]));
  bx_tokred_destroy(s);
  return st;
}

static void *rank_main(void *arg) {
  rank_job *j = arg;
  j->err[0] = 0;
  j->st = rank_step(j);
  return NULL;
}

/* A random layout of the batch: nranks contiguous ranges of whole chunks,
 * each cut into micro-batches of whole chunks, nthreads states each. */
static void random_layout(bxt_rng *r, const batch *b, rank_job *jobs, int nranks,
                          bx_tokred_mode mode) {
  int64_t cut[MAXR + 1];
  cut[0] = 0;
  cut[nranks] = b->N;
  for (int q = 1; q < nranks; q++) cut[q] = (int64_t)bxt_below(r, (uint64_t)b->N + 1);
  for (int q = 1; q < nranks; q++) /* sort */
    for (int p = q; p > 1 && cut[p] < cut[p - 1]; p--) {
      int64_t tmp = cut[p];
      cut[p] = cut[p - 1];
      cut[p - 1] = tmp;
    }
  for (int q = 0; q < nranks; q++) {
    rank_job *j = &jobs[q];
    memset(j, 0, sizeof *j);
    j->b = b;
    j->mode = mode;
    int64_t t0 = cut[q] * b->C < b->T ? cut[q] * b->C : b->T, t1 = cut[q + 1] * b->C < b->T ? cut[q + 1] * b->C : b->T;
    j->tok_begin = t0;
    j->tok_end = t1;
    j->nmb = 1 + (int)bxt_below(r, MAXMB);
    j->mb_cut[0] = cut[q];
    for (int m = 1; m < j->nmb; m++)
      j->mb_cut[m] = cut[q] + (int64_t)bxt_below(r, (uint64_t)(cut[q + 1] - cut[q]) + 1);
    j->mb_cut[j->nmb] = cut[q + 1];
    for (int m = 1; m < j->nmb; m++)
      for (int p = m; p > 1 && j->mb_cut[p] < j->mb_cut[p - 1]; p--) {
        int64_t tmp = j->mb_cut[p];
        j->mb_cut[p] = j->mb_cut[p - 1];
        j->mb_cut[p - 1] = tmp;
      }
    for (int m = 0; m <= j->nmb; m++) { /* chunks -> global token ids */
      int64_t tk = j->mb_cut[m] * b->C;
      j->mb_cut[m] = tk < b->T ? tk : b->T;
    }
    j->nthreads = 1 + (int)bxt_below(r, MAXTH);
    j->seed = bxt_next(r);
  }
}

static void run_world(rank_job *jobs, int nranks) {
  world w;
  bxt_world_init(&w, nranks);
  pthread_t th[MAXR];
  for (int q = 0; q < nranks; q++) {
    jobs[q].comm = bxt_sim_comm(&w, &jobs[q].ctx, q);
    if (jobs[q].float_comm) jobs[q].comm.allreduce_f32 = bxt_sim_allreduce_f32;
    jobs[q].use_comm = 1;
    pthread_create(&th[q], NULL, rank_main, &jobs[q]);
  }
  for (int q = 0; q < nranks; q++) pthread_join(th[q], NULL);
  CHECK(!w.timed_out, "a rank waited 5 s in a collective: a hang");
  bxt_world_free(&w);
}

static int same_result(const result *a, const result *b) {
  for (int k = 0; k < NT; k++)
    if (memcmp(a->sum[k], b->sum[k], (size_t)numel_of[k] * sizeof(float)) != 0 ||
        memcmp(a->mean[k], b->mean[k], (size_t)numel_of[k] * sizeof(double)) != 0 ||
        memcmp(a->mean32[k], b->mean32[k], (size_t)numel_of[k] * sizeof(float)) != 0)
      return 0;
  return 1;
}

/* ---- the tests ------------------------------------------------------------ */

void test_tokred_grid_numerics(void) {
  bxt_rng r;
  bxt_rng_init(&r);
  /* exponent bound = frexp exponent; limit = 2^E */
  for (int i = 0; i < 20000; i++) {
    uint32_t ab = (uint32_t)bxt_next(&r) & 0x7fffffffu;
    if (i % 4 == 0) ab &= 0x7fffffu; /* subnormals */
    if (ab >= 0x7f800000u) continue;
    float f;
    memcpy(&f, &ab, 4);
    int ex = -149;
    if (f != 0.0f) frexpf(f, &ex);
    CHECK(bx_tokred_exp_of_abs(ab) == ex, "exp of 0x%08x: %d, frexp %d", ab,
          bx_tokred_exp_of_abs(ab), ex);
    CHECK(ab < bx_tokred_abs_limit(ex) && (ex == -149 || ab >= bx_tokred_abs_limit(ex - 1)),
          "limit of 0x%08x", ab);
  }
  /* q = rint(a 2^-e) and the final rounding Q 2^e / d, vs MPFR */
  mpfr_t m;
  mpfr_init2(m, 400);
  for (int i = 0; i < 20000 && bxt_failures() < 10; i++) {
    int e = (int)bxt_below(&r, 306) - 200;
    float a = (float)(bxt_normal(&r) * ldexp(1.0, (int)bxt_below(&r, 50)));
    double lim = ldexp(1.0, 51);
    if (fabs((double)a) >= lim) a = (float)(lim / 2);
    a = (float)ldexp((double)a, e - 20);
    if (!(fabs(ldexp((double)a, -e)) <= lim)) continue;
    mpfr_set_flt(m, a, MPFR_RNDN);
    mpfr_mul_2si(m, m, -e, MPFR_RNDN);
    mpfr_rint(m, m, MPFR_RNDN);
    int64_t want = (int64_t)mpfr_get_si(m, MPFR_RNDN);
    CHECK(bx_tokred_q(a, bx_tokred_pow2(-e)) == want, "q(%a, e %d)", (double)a, e);
    int64_t Q = (int64_t)(bxt_next(&r) >> (1 + bxt_below(&r, 63))) * (bxt_below(&r, 2) ? 1 : -1);
    if (i % 3 == 0) Q = (int64_t)bxt_below(&r, 1 << 20) - (1 << 19);
    int64_t d = i % 2 ? 1 : (int64_t)(bxt_next(&r) >> (1 + bxt_below(&r, 63))) + 1;
    if (d <= 0) d = 3;
    int ee = (int)bxt_below(&r, 1400) - 1200; /* subnormal fp64 and fp32 results too */
    mpfr_set_prec(m, 2200);
    mpfr_set_si(m, (long)Q, MPFR_RNDN);
    mpfr_mul_2si(m, m, ee, MPFR_RNDN);
    mpfr_div_si(m, m, (long)d, MPFR_RNDZ); /* 2200 bits: sticky below both formats */
    float wf = ref_round_f(m);
    double wd = ref_round_d(m);
    mpfr_set_prec(m, 400);
    uint32_t gf = (uint32_t)bx_tokred_finish_bits(Q, ee, d, 24);
    uint64_t gd = bx_tokred_finish_bits(Q, ee, d, 53);
    CHECK(gf == bxt_fbits(wf), "fp32 of %lld * 2^%d / %lld: 0x%08x want %a", (long long)Q, ee,
          (long long)d, gf, (double)wf);
    CHECK(gd == bxt_dbits(wd), "fp64 of %lld * 2^%d / %lld: 0x%016llx want %a", (long long)Q,
          ee, (long long)d, (unsigned long long)gd, wd);
  }
  /* the fast paths (|Q|, d < 2^53, grid exponents) against the exact one,
   * midpoints of fp32 included: (2^25 + 2) / 2 = 2^24 + 1, a tie */
  for (int i = 0; i < 40000 && bxt_failures() < 10; i++) {
    int e = (int)bxt_below(&r, 305) - 200;
    int64_t Q = (int64_t)(bxt_next(&r) >> (11 + bxt_below(&r, 53)));
    int64_t d = 1 + (int64_t)(bxt_next(&r) >> (11 + bxt_below(&r, 53)));
    if (i % 5 == 0) {
      d = 1 + (int64_t)bxt_below(&r, 9);
      Q = ((int64_t)(bxt_next(&r) >> 40) | 1) * d << bxt_below(&r, 3); /* often a tie */
      if (i % 10 == 0) Q = (((int64_t)1 << 25) + 2) * d / 2 * 2;
    }
    if (i % 7 == 0) {
      /* Q / d within 2^-40 of an fp32 midpoint k / 1024 (k odd, 25 bits):
       * the double quotient rounds onto the midpoint, the exact one is not
       * on it. d odd, k = d^-1 (mod 1024), so k d = 1 (mod 1024). */
      d = ((int64_t)1 << 30) + 1 + 2 * (int64_t)bxt_below(&r, 1 << 20);
      int64_t inv = 1;
      for (int it = 0; it < 10; it++) inv = inv * (2 - d * inv) & 1023; /* Newton mod 2^k */
      int64_t k = ((int64_t)1 << 24) + 1024 * (int64_t)bxt_below(&r, 1 << 14) + inv;
      int above = (int)bxt_below(&r, 2);
      int64_t kk = above ? k * d + 1 : k * d - 1; /* wanted 1024 | kk: adjust k for "above" */
      if (above) {
        k = ((int64_t)1 << 24) + 1024 * (int64_t)bxt_below(&r, 1 << 14) + ((1024 - inv) & 1023);
        kk = k * d + 1;
      }
      Q = kk / 1024;
      e = -10 + (int)bxt_below(&r, 20) - 10;
    }
    if (bxt_below(&r, 2)) Q = -Q;
    double step = bx_tokred_pow2(e);
    float gf = bx_tokred_finish_f32(Q, e, d, step);
    double gd = bx_tokred_finish_f64(Q, e, d, step);
    CHECK(bxt_fbits(gf) == (uint32_t)bx_tokred_finish_bits(Q, e, d, 24),
          "fast fp32 of %lld * 2^%d / %lld: %a", (long long)Q, e, (long long)d, (double)gf);
    CHECK(bxt_dbits(gd) == bx_tokred_finish_bits(Q, e, d, 53), "fast fp64 of %lld * 2^%d / %lld",
          (long long)Q, e, (long long)d);
  }
  mpfr_clear(m);
}

/* One process, one state: bit for bit the documented grid rounding. */
void test_tokred_vs_exact_reference(void) {
  bxt_rng r;
  bxt_rng_init(&r);
  static batch b;
  static result ref;
  for (int round = 0; round < 40 && bxt_failures() == 0; round++) {
    int64_t T = 1 + (int64_t)bxt_below(&r, MAXT), C = 1 + (int64_t)bxt_below(&r, 24);
    batch_make(&r, &b, T, C, round % 3 == 0 ? 0 : round % 3 == 1 ? 20 : 80);
    reference(&b, &ref);
    rank_job j;
    memset(&j, 0, sizeof j);
    j.b = &b;
    j.mode = BX_TOKRED_GRID;
    j.tok_begin = 0;
    j.tok_end = T;
    j.nmb = 1;
    j.mb_cut[0] = 0;
    j.mb_cut[1] = T;
    j.nthreads = 1;
    j.seed = 1;
    CHECK_STATUS(rank_step(&j), BX_OK, "round %d: %s", round, bx_last_error());
    for (int k = 0; k < NT; k++) {
      CHECK(j.out.grid[k] == ref.grid[k], "round %d tensor %d: grid 2^%d, reference 2^%d", round,
            k, j.out.grid[k], ref.grid[k]);
      for (int64_t i = 0; i < numel_of[k]; i++) {
        CHECK_BITS_F(j.out.sum[k][i], ref.sum[k][i], "round %d (T %lld C %lld) tensor %d [%lld] sum",
                     round, (long long)T, (long long)C, k, (long long)i);
        CHECK_BITS_D(j.out.mean[k][i], ref.mean[k][i], "round %d tensor %d [%lld] mean", round, k,
                     (long long)i);
        CHECK_BITS_F(j.out.mean32[k][i], ref.mean32[k][i], "round %d tensor %d [%lld] fp32 mean",
                     round, k, (long long)i);
      }
    }
  }
}

/* Random ranks x micro-batches x thread states, merged in random orders:
 * the same bits as the reference every time. */
void test_tokred_invariance(void) {
  bxt_rng r;
  bxt_rng_init(&r);
  static batch b;
  static result ref;
  static rank_job jobs[MAXR];
  for (int round = 0; round < 10 && bxt_failures() == 0; round++) {
    int64_t T = 40 + (int64_t)bxt_below(&r, MAXT - 40), C = 1 + (int64_t)bxt_below(&r, 12);
    batch_make(&r, &b, T, C, 40);
    reference(&b, &ref);
    for (int split = 0; split < 8; split++) {
      int nranks = 1 + (int)bxt_below(&r, MAXR);
      random_layout(&r, &b, jobs, nranks, BX_TOKRED_GRID);
      run_world(jobs, nranks);
      for (int q = 0; q < nranks; q++) {
        CHECK_STATUS(jobs[q].st, BX_OK, "round %d split %d rank %d: %s", round, split, q,
                     jobs[q].err);
        for (int k = 0; k < NT; k++)
          CHECK(jobs[q].out.grid[k] == ref.grid[k], "split %d rank %d tensor %d: grid", split, q, k);
        CHECK(same_result(&jobs[q].out, &ref),
              "round %d split %d (%d ranks) rank %d: bits differ from the reference", round,
              split, nranks, q);
      }
    }
  }
}

/* The one-pass step's primitive: bounds stated before any partial exists
 * (bx_tokred_bound_exp) under BX_TOKRED_BOUND_FLAG. Stated at or above
 * the observed exponent: the reference's bits on that grid on every
 * layout, the observed exponent reported, nothing flagged. One tensor
 * stated below it: every rank of every layout learns the flag and the
 * observed exponents (the same as the reference's), and finish refuses,
 * naming the tensor, nothing written. */
void test_tokred_stated_flag(void) {
  bxt_rng r;
  bxt_rng_init(&r);
  static batch b;
  static result ref, sref;
  static rank_job jobs[MAXR];
  for (int round = 0; round < 8 && bxt_failures() == 0; round++) {
    int64_t T = 24 + (int64_t)bxt_below(&r, MAXT - 24), C = 1 + (int64_t)bxt_below(&r, 12);
    batch_make(&r, &b, T, C, round % 2 ? 40 : 0);
    reference(&b, &ref);
    int stated[NT];
    for (int k = 0; k < NT; k++) stated[k] = ref.observed[k] + (int)bxt_below(&r, 4);
    reference_stated(&b, &sref, stated);
    for (int split = 0; split < 4; split++) {
      int nranks = 1 + (int)bxt_below(&r, MAXR);
      random_layout(&r, &b, jobs, nranks, BX_TOKRED_GRID);
      for (int q = 0; q < nranks; q++) jobs[q].stated = stated;
      run_world(jobs, nranks);
      for (int q = 0; q < nranks; q++) {
        CHECK_STATUS(jobs[q].st, BX_OK, "round %d split %d rank %d: %s", round, split, q,
                     jobs[q].err);
        for (int k = 0; k < NT; k++) {
          CHECK(jobs[q].out.grid[k] == sref.grid[k], "rank %d tensor %d: grid 2^%d, want 2^%d", q,
                k, jobs[q].out.grid[k], sref.grid[k]);
          CHECK(jobs[q].out.observed[k] == ref.observed[k] && jobs[q].out.flagged[k] == 0,
                "round %d rank %d tensor %d: observed %d (want %d), flagged %lld", round, q, k,
                jobs[q].out.observed[k], ref.observed[k], (long long)jobs[q].out.flagged[k]);
        }
        CHECK(same_result(&jobs[q].out, &sref), "round %d split %d rank %d: bits differ from the "
              "reference on the stated grid", round, split, q);
      }
    }
    /* one tensor stated one binade too low: flagged everywhere, refused */
    int low = (int)bxt_below(&r, NT);
    if (ref.observed[low] == -149) continue; /* all zero: nothing can break it */
    stated[low] = ref.observed[low] - 1;
    for (int split = 0; split < 4; split++) {
      int nranks = 1 + (int)bxt_below(&r, MAXR);
      random_layout(&r, &b, jobs, nranks, BX_TOKRED_GRID);
      for (int q = 0; q < nranks; q++) {
        jobs[q].stated = stated;
        memset(jobs[q].out.sum, 0x5a, sizeof jobs[q].out.sum);
      }
      run_world(jobs, nranks);
      for (int q = 0; q < nranks; q++) {
        CHECK_STATUS(jobs[q].st, BX_EINVAL, "round %d split %d rank %d (low tensor %d): %s",
                     round, split, q, low, jobs[q].err);
        char want[32];
        snprintf(want, sizeof want, "tensor %d:", low);
        CHECK(strstr(jobs[q].err, want) && strstr(jobs[q].err, "broke the stated bound"),
              "rank %d: %s", q, jobs[q].err);
        for (int k = 0; k < NT; k++)
          CHECK(jobs[q].out.observed[k] == ref.observed[k] &&
                    (jobs[q].out.flagged[k] != 0) == (k == low),
                "round %d rank %d tensor %d: observed %d (want %d), flagged %lld", round, q, k,
                jobs[q].out.observed[k], ref.observed[k], (long long)jobs[q].out.flagged[k]);
        unsigned char *o = (unsigned char *)jobs[q].out.sum;
        int untouched = 1;
        for (size_t i = 0; i < sizeof jobs[q].out.sum; i++) untouched &= o[i] == 0x5a;
        CHECK(untouched, "rank %d: a flagged finish wrote", q);
      }
    }
  }
}

/* bx_tokred_reset: a state used (flagged, even) and reset gives the bits
 * of a fresh state; a mode change and bad options are refused, s unchanged. */
void test_tokred_reset(void) {
  bxt_rng r;
  bxt_rng_init(&r);
  static batch b;
  static result ref, got;
  batch_make(&r, &b, 40, 5, 30);
  reference(&b, &ref);
  DLTensor g[NT], out[NT];
  grads_like(g);
  bx_tokred_opts fo = BX_TOKRED_OPTS_DEFAULT;
  fo.on_bound = BX_TOKRED_BOUND_FLAG;
  bx_tokred *s = NULL;
  CHECK_STATUS(bx_tokred_create(g, NT, b.C, b.T, &fo, &s), BX_OK, "create: %s", bx_last_error());
  float part[DIN * DOUT];
  for (int round = 0; round < 3 && s; round++) {
    /* round 0: stated -149 (every add flags); rounds 1, 2: reset to FAIL, bounds from partials */
    if (round) {
      bx_tokred_opts o = BX_TOKRED_OPTS_DEFAULT;
      CHECK_STATUS(bx_tokred_reset(s, round == 1 ? &o : NULL), BX_OK, "reset: %s", bx_last_error());
      for (int64_t c = 0; c < b.N; c++)
        for (int k = 0; k < NT; k++) {
          chunk_partial(&b, k, c, part);
          DLTensor p = view(part, k, 0);
          CHECK_STATUS(bx_tokred_bound(s, (size_t)k, c, &p), BX_OK, "bound: %s", bx_last_error());
        }
    }
    CHECK_STATUS(bx_tokred_agree(s, NULL), BX_OK, "agree: %s", bx_last_error());
    for (int64_t c = 0; c < b.N; c++)
      for (int k = 0; k < NT; k++) {
        chunk_partial(&b, k, c, part);
        DLTensor p = view(part, k, 0);
        CHECK_STATUS(bx_tokred_add(s, (size_t)k, c, &p), BX_OK, "add: %s", bx_last_error());
      }
    for (int k = 0; k < NT; k++) out[k] = view(got.sum[k], k, 0);
    int obs;
    int64_t fl;
    CHECK_STATUS(bx_tokred_observed(s, 0, &obs, &fl), BX_OK, "observed");
    CHECK(obs == ref.observed[0] && (fl != 0) == (round == 0), "round %d: observed %d (want %d), "
          "flagged %lld", round, obs, ref.observed[0], (long long)fl);
    bx_status st = bx_tokred_finish(s, out, NT, 1);
    if (round == 0) {
      CHECK_STATUS(st, BX_EINVAL, "a flagged state finished");
      continue;
    }
    CHECK_STATUS(st, BX_OK, "finish: %s", bx_last_error());
    for (int k = 0; k < NT; k++) {
      int e;
      CHECK_STATUS(bx_tokred_grid_exp(s, (size_t)k, &e), BX_OK, "grid");
      CHECK(e == ref.grid[k], "round %d tensor %d: grid 2^%d, want 2^%d", round, k, e, ref.grid[k]);
      CHECK(!memcmp(got.sum[k], ref.sum[k], (size_t)numel_of[k] * sizeof(float)),
            "round %d tensor %d: a reset state's sums differ from the reference", round, k);
    }
  }
  bx_tokred_opts om = BX_TOKRED_OPTS_DEFAULT;
  om.mode = BX_TOKRED_ORDINARY;
  CHECK_STATUS(bx_tokred_reset(s, &om), BX_EINVAL, "reset to another mode");
  CHECK(strstr(bx_last_error(), "mode") != NULL, "message: %s", bx_last_error());
  om = (bx_tokred_opts)BX_TOKRED_OPTS_DEFAULT;
  om.on_bound = (bx_tokred_on_bound)7;
  CHECK_STATUS(bx_tokred_reset(s, &om), BX_EINVAL, "reset with a bad on_bound");
  om.struct_size = 3;
  CHECK_STATUS(bx_tokred_reset(s, &om), BX_EINVAL, "reset with a bad struct_size");
  CHECK_STATUS(bx_tokred_reset(NULL, NULL), BX_EINVAL, "reset NULL");
  /* still the finished state of round 2: refused resets changed nothing */
  CHECK_STATUS(bx_tokred_finish(s, out, NT, 1), BX_OK, "finish after refused resets: %s", bx_last_error());
  CHECK(!memcmp(got.sum[0], ref.sum[0], (size_t)numel_of[0] * sizeof(float)), "refused resets changed the state");
  bx_tokred_destroy(s);
}

/* The ordinary mode (fp32 sums in layout order) drifts on a constructed
 * split; the grid mode does not. Chunks of one token: 1, 2^-24, 2^-24,
 * 2^-24. One rank: ((1 + u) + u) + u = 1 (each a tie to even). Ranks {0},
 * {1, 2, 3}: 1 + 3u = 1 + 2^-22. The exact sum 1 + 3 * 2^-24 rounds to
 * 1 + 2^-22. */
void test_tokred_ordinary_drifts(void) {
  static batch b;
  memset(&b, 0, sizeof b);
  b.T = 4;
  b.C = 1;
  b.N = 4;
  b.loss[0] = 1.0f;
  b.loss[1] = b.loss[2] = b.loss[3] = 0x1p-24f;
  static rank_job jobs[MAXR];
  float got[2][2]; /* [mode][layout] */
  for (int mode = 0; mode < 2; mode++)
    for (int layout = 0; layout < 2; layout++) {
      int nranks = layout == 0 ? 1 : 2;
      for (int q = 0; q < nranks; q++) {
        rank_job *j = &jobs[q];
        memset(j, 0, sizeof *j);
        j->b = &b;
        j->mode = mode ? BX_TOKRED_ORDINARY : BX_TOKRED_GRID;
        j->tok_begin = layout == 0 ? 0 : q == 0 ? 0 : 1;
        j->tok_end = layout == 0 ? 4 : q == 0 ? 1 : 4;
        j->nmb = 1;
        j->mb_cut[0] = j->tok_begin;
        j->mb_cut[1] = j->tok_end;
        j->nthreads = 1;
      }
      run_world(jobs, nranks);
      for (int q = 0; q < nranks; q++)
        CHECK_STATUS(jobs[q].st, BX_OK, "mode %d layout %d rank %d: %s", mode, layout, q,
                     jobs[q].err);
      got[mode][layout] = jobs[0].out.sum[2][0];
    }
  CHECK_BITS_F(got[0][0], 1.0f + 0x1p-22f, "grid, one rank");
  CHECK_BITS_F(got[0][1], 1.0f + 0x1p-22f, "grid, two ranks");
  CHECK_BITS_F(got[1][0], 1.0f, "ordinary, one rank (layout order)");
  CHECK_BITS_F(got[1][1], 1.0f + 0x1p-22f, "ordinary, two ranks");
  CHECK(bxt_fbits(got[1][0]) != bxt_fbits(got[1][1]), "the ordinary mode must drift here");
  /* and on random splits of a random batch it differs somewhere */
  bxt_rng r;
  bxt_rng_init(&r);
  static batch rb;
  static result first;
  batch_make(&r, &rb, 200, 3, 40);
  int drift = 0;
  for (int split = 0; split < 8; split++) {
    int nranks = 1 + (int)bxt_below(&r, MAXR);
    random_layout(&r, &rb, jobs, nranks, BX_TOKRED_ORDINARY);
    run_world(jobs, nranks);
    CHECK_STATUS(jobs[0].st, BX_OK, "ordinary split %d: %s", split, jobs[0].err);
    if (split == 0) first = jobs[0].out;
    else drift |= !same_result(&first, &jobs[0].out);
  }
  CHECK(drift, "the ordinary mode gave the same bits on 8 random layouts");

  /* A comm with a float all-reduce (DDP's way): the ordinary mode adds the
   * ranks' fp32 sums in the transport's order, here reverse rank order.
   * One token a rank: 1, u, u. Rank order: (1 + u) + u = 1 (ties to even);
   * reverse: (u + u) + 1 = 1 + 2^-23. The grid mode never calls it. */
  b.T = 3;
  b.loss[0] = 1.0f;
  b.loss[1] = b.loss[2] = 0x1p-24f;
  float three[2][2]; /* [mode][float comm] */
  for (int mode = 0; mode < 2; mode++)
    for (int fc = 0; fc < 2; fc++) {
      for (int q = 0; q < 3; q++) {
        rank_job *j = &jobs[q];
        memset(j, 0, sizeof *j);
        j->b = &b;
        j->mode = mode ? BX_TOKRED_ORDINARY : BX_TOKRED_GRID;
        j->tok_begin = q;
        j->tok_end = q + 1;
        j->nmb = 1;
        j->mb_cut[0] = q;
        j->mb_cut[1] = q + 1;
        j->nthreads = 1;
        j->float_comm = fc;
      }
      run_world(jobs, 3);
      for (int q = 0; q < 3; q++) {
        CHECK_STATUS(jobs[q].st, BX_OK, "mode %d float comm %d rank %d: %s", mode, fc, q, jobs[q].err);
        CHECK(bxt_fbits(jobs[q].out.sum[2][0]) == bxt_fbits(jobs[0].out.sum[2][0]),
              "mode %d float comm %d: rank %d's sum differs from rank 0's", mode, fc, q);
      }
      three[mode][fc] = jobs[0].out.sum[2][0];
    }
  CHECK_BITS_F(three[0][0], 1.0f + 0x1p-23f, "grid, three ranks");
  CHECK_BITS_F(three[0][1], 1.0f + 0x1p-23f, "grid, three ranks, float comm unused");
  CHECK_BITS_F(three[1][0], 1.0f, "ordinary, gather in rank order");
  CHECK_BITS_F(three[1][1], 1.0f + 0x1p-23f, "ordinary, the comm's float all-reduce");
}

static bx_tokred *make_state(bx_tokred_mode mode, int64_t C, int64_t T) {
  DLTensor g[NT];
  grads_like(g);
  bx_tokred_opts o = BX_TOKRED_OPTS_DEFAULT;
  o.mode = mode;
  bx_tokred *s = NULL;
  bx_status st = bx_tokred_create(g, NT, C, T, &o, &s);
  CHECK_STATUS(st, BX_OK, "create: %s", bx_last_error());
  return s;
}

/* Misaligned micro-batches and ranks, missing or doubled chunks: named
 * BX_ELAYOUT, nothing written. */
void test_tokred_layout_refused(void) {
  bx_tokred *s = make_state(BX_TOKRED_GRID, 4, 10); /* chunks [0,4) [4,8) [8,10) */
  int64_t c0 = -7, c1 = -7;
  CHECK_STATUS(bx_tokred_chunks(s, 0, 10, &c0, &c1), BX_OK, "whole batch");
  CHECK(c0 == 0 && c1 == 3, "chunks %lld..%lld", (long long)c0, (long long)c1);
  CHECK_STATUS(bx_tokred_chunks(s, 4, 10, &c0, &c1), BX_OK, "ends at T");
  CHECK(c0 == 1 && c1 == 3, "chunks %lld..%lld", (long long)c0, (long long)c1);
  c0 = c1 = -7;
  CHECK_STATUS(bx_tokred_chunks(s, 2, 8, &c0, &c1), BX_ELAYOUT, "starts inside chunk 0");
  CHECK(strstr(bx_last_error(), "chunk 0") != NULL, "message: %s", bx_last_error());
  CHECK_STATUS(bx_tokred_chunks(s, 0, 6, &c0, &c1), BX_ELAYOUT, "ends inside chunk 1");
  CHECK(strstr(bx_last_error(), "chunk 1") != NULL, "message: %s", bx_last_error());
  CHECK_STATUS(bx_tokred_chunks(s, 0, 11, &c0, &c1), BX_ELAYOUT, "past T");
  CHECK_STATUS(bx_tokred_chunks(s, 8, 4, &c0, &c1), BX_ELAYOUT, "reversed");
  CHECK(c0 == -7 && c1 == -7, "outputs written on error");
  for (int k = 0; k < NT; k++) CHECK_STATUS(bx_tokred_bound_exp(s, (size_t)k, 1), BX_OK, "bound");
  CHECK_STATUS(bx_tokred_agree(s, NULL), BX_OK, "agree");
  float part[DIN * DOUT];
  for (int i = 0; i < DIN * DOUT; i++) part[i] = 1.0f;
  for (int64_t c = 0; c < 3; c++)
    for (int k = 0; k < NT; k++) {
      if (c == 1 && k == 1) continue; /* chunk 1 of tensor 1 missing */
      DLTensor p = view(part, k, 0);
      CHECK_STATUS(bx_tokred_add(s, (size_t)k, c, &p), BX_OK, "add: %s", bx_last_error());
    }
  static result out;
  memset(&out, 0x5a, sizeof out);
  result before = out;
  DLTensor o[NT];
  for (int k = 0; k < NT; k++) o[k] = view(out.sum[k], k, 0);
  CHECK_STATUS(bx_tokred_finish_check(s, o, NT, 1), BX_ELAYOUT, "check: missing chunk");
  CHECK(strstr(bx_last_error(), "tensor 1, chunk 1") && strstr(bx_last_error(), "0 times"),
        "check message: %s", bx_last_error());
  CHECK_STATUS(bx_tokred_finish(s, o, NT, 1), BX_ELAYOUT, "missing chunk");
  CHECK(strstr(bx_last_error(), "tensor 1, chunk 1") && strstr(bx_last_error(), "0 times"),
        "message: %s", bx_last_error());
  CHECK(bx_last_error_location()->tensor == 1, "location tensor %lld",
        bx_last_error_location()->tensor);
  CHECK(memcmp(&out, &before, sizeof out) == 0, "written on error");
  DLTensor p1 = view(part, 1, 0);
  CHECK_STATUS(bx_tokred_add(s, 1, 1, &p1), BX_OK, "the missing chunk");
  CHECK_STATUS(bx_tokred_finish_check(s, o, NT, 1), BX_OK, "check: complete");
  CHECK(memcmp(&out, &before, sizeof out) == 0, "finish_check wrote");
  CHECK_STATUS(bx_tokred_finish_check(s, o, NT, 0), BX_EINVAL, "check: divisor 0");
  CHECK_STATUS(bx_tokred_add(s, 1, 2, &p1), BX_OK, "a chunk twice");
  CHECK_STATUS(bx_tokred_finish(s, o, NT, 1), BX_ELAYOUT, "doubled chunk");
  CHECK(strstr(bx_last_error(), "tensor 1, chunk 2") && strstr(bx_last_error(), "2 times"),
        "message: %s", bx_last_error());
  CHECK(memcmp(&out, &before, sizeof out) == 0, "written on error");
  bx_tokred_destroy(s);
}

/* A rank whose token range is misaligned fails, and every rank fails with
 * it (the agreement step); ranks that disagree on total_tokens get
 * BX_EMISMATCH. */
void test_tokred_ranks_errors(void) {
  bxt_rng r;
  bxt_rng_init(&r);
  static batch b;
  batch_make(&r, &b, 48, 8, 10);
  static rank_job jobs[MAXR];
  for (int q = 0; q < 3; q++) {
    memset(&jobs[q], 0, sizeof jobs[q]);
    jobs[q].b = &b;
    jobs[q].mode = BX_TOKRED_GRID;
    jobs[q].tok_begin = q * 16;
    jobs[q].tok_end = q * 16 + 16;
    jobs[q].nmb = 1;
    jobs[q].mb_cut[0] = jobs[q].tok_begin;
    jobs[q].mb_cut[1] = jobs[q].tok_end;
    jobs[q].nthreads = 1;
  }
  jobs[1].tok_begin = 12; /* not a multiple of 8 */
  run_world(jobs, 3);
  for (int q = 0; q < 3; q++) CHECK_STATUS(jobs[q].st, BX_ELAYOUT, "rank %d: %s", q, jobs[q].err);
  /* rank 1 refused its range; the others see its chunks missing */
  CHECK(strstr(jobs[1].err, "inside chunk 1") != NULL, "rank 1: %s", jobs[1].err);
  CHECK(strstr(jobs[0].err, "chunk 2") && strstr(jobs[0].err, "0 times"), "rank 0: %s",
        jobs[0].err);
  jobs[1].tok_begin = 16;
  jobs[2].total_override = 56;
  run_world(jobs, 3);
  for (int q = 0; q < 3; q++)
    CHECK_STATUS(jobs[q].st, BX_EMISMATCH, "rank %d: %s", q, jobs[q].err);
  CHECK(strstr(jobs[0].err, "total_tokens") != NULL, "message: %s", jobs[0].err);
}

/* NULLs, dtypes, shapes, phases, options, bounds, non-finite addends. */
void test_tokred_bad_arguments(void) {
  DLTensor g[NT];
  grads_like(g);
  bx_tokred *s = (bx_tokred *)&g; /* must stay untouched */
  bx_tokred *keep = s;
  CHECK_STATUS(bx_tokred_create(g, NT, 4, 10, NULL, NULL), BX_EINVAL, "NULL out");
  CHECK_STATUS(bx_tokred_create(NULL, NT, 4, 10, NULL, &s), BX_EINVAL, "NULL grads");
  CHECK_STATUS(bx_tokred_create(g, NT, 0, 10, NULL, &s), BX_EINVAL, "chunk 0");
  CHECK_STATUS(bx_tokred_create(g, NT, 4, -1, NULL, &s), BX_EINVAL, "T < 0");
  CHECK_STATUS(bx_tokred_create(g, NT, 1, (int64_t)1 << 40, NULL, &s), BX_EINVAL, "too many chunks");
  bx_tokred_opts op = BX_TOKRED_OPTS_DEFAULT;
  op.struct_size = 3;
  CHECK_STATUS(bx_tokred_create(g, NT, 4, 10, &op, &s), BX_EINVAL, "struct_size");
  op = (bx_tokred_opts)BX_TOKRED_OPTS_DEFAULT;
  op.mode = (bx_tokred_mode)7;
  CHECK_STATUS(bx_tokred_create(g, NT, 4, 10, &op, &s), BX_EINVAL, "mode");
  g[1].dtype.bits = 64;
  CHECK_STATUS(bx_tokred_create(g, NT, 4, 10, NULL, &s), BX_EDTYPE, "fp64 gradient");
  CHECK(bx_last_error_location()->tensor == 1, "names tensor 1");
  g[1].dtype.bits = 32;
  g[2].device.device_type = kDLCUDA;
  CHECK_STATUS(bx_tokred_create(g, NT, 4, 10, NULL, &s), BX_EDEVICE, "CUDA gradient");
  g[2].device.device_type = kDLCPU;
  CHECK(s == keep, "out written on error");
  s = make_state(BX_TOKRED_GRID, 4, 10);
  float part[DIN * DOUT];
  for (int i = 0; i < DIN * DOUT; i++) part[i] = (float)(i + 1);
  DLTensor p = view(part, 0, 0);
  CHECK_STATUS(bx_tokred_add(s, 0, 0, &p), BX_EINVAL, "add before agree");
  CHECK_STATUS(bx_tokred_bound(s, 3, 0, &p), BX_EINVAL, "tensor 3");
  CHECK_STATUS(bx_tokred_bound(s, 0, 3, &p), BX_EINVAL, "chunk 3");
  CHECK_STATUS(bx_tokred_bound(s, 0, -1, &p), BX_EINVAL, "chunk -1");
  CHECK_STATUS(bx_tokred_bound(s, 0, 0, NULL), BX_EINVAL, "NULL partial");
  DLTensor bad = view(part, 1, 0);
  CHECK_STATUS(bx_tokred_bound(s, 0, 0, &bad), BX_ELAYOUT, "shape of tensor 1 for tensor 0");
  bad = view(part, 0, 1);
  CHECK_STATUS(bx_tokred_bound(s, 0, 0, &bad), BX_EDTYPE, "fp64 partial");
  bad = view(part, 0, 0);
  int64_t strides[2] = {1, DIN};
  bad.strides = strides;
  CHECK_STATUS(bx_tokred_bound(s, 0, 0, &bad), BX_ELAYOUT, "transposed partial");
  bad = view((char *)part + 1, 0, 0);
  CHECK_STATUS(bx_tokred_bound(s, 0, 0, &bad), BX_ELAYOUT, "misaligned partial");
  CHECK_STATUS(bx_tokred_bound_exp(s, 0, 129), BX_EINVAL, "exp 129");
  CHECK_STATUS(bx_tokred_bound_exp(s, 0, 6), BX_OK, "bound 2^6: elements up to 35 fit");
  CHECK_STATUS(bx_tokred_bound_exp(s, 1, 0), BX_OK, "bound 1 for tensor 1");
  int e;
  CHECK_STATUS(bx_tokred_grid_exp(s, 0, &e), BX_EINVAL, "grid before agree");
  int64_t *w;
  size_t nw;
  CHECK_STATUS(bx_tokred_words(s, &w, &nw), BX_EINVAL, "words before agree");
  bx_tokred *f = NULL;
  CHECK_STATUS(bx_tokred_fork(s, &f), BX_EINVAL, "fork before agree");
  bx_comm badcomm = BX_COMM_DEFAULT;
  badcomm.struct_size = 1;
  CHECK_STATUS(bx_tokred_agree(s, &badcomm), BX_EINVAL, "comm struct_size");
  CHECK_STATUS(bx_tokred_agree(s, NULL), BX_OK, "agree");
  CHECK_STATUS(bx_tokred_agree(s, NULL), BX_EINVAL, "agree twice");
  CHECK_STATUS(bx_tokred_bound(s, 0, 0, &p), BX_EINVAL, "bound after agree");
  CHECK_STATUS(bx_tokred_grid_exp(s, 0, &e), BX_OK, "grid");
  CHECK(e == 6 - 51, "grid 2^%d", e);
  CHECK_STATUS(bx_tokred_words(s, &w, &nw), BX_OK, "words");
  CHECK(nw == (size_t)(DIN * DOUT + 1 + DOUT + 1 + 1 + 1 + NT * 3), "%zu words", nw);
  /* a partial over the stated bound: refused, the words unchanged */
  CHECK_STATUS(bx_tokred_add(s, 0, 0, &p), BX_OK, "add");
  int64_t *copy = malloc(nw * sizeof *copy);
  memcpy(copy, w, nw * sizeof *copy);
  float big[DIN * DOUT];
  memcpy(big, part, sizeof big);
  big[17] = 64.0f;
  DLTensor pb = view(big, 0, 0);
  CHECK_STATUS(bx_tokred_add(s, 0, 1, &pb), BX_EINVAL, "|a| = 2^6 over the bound");
  CHECK(strstr(bx_last_error(), "element 17") != NULL, "message: %s", bx_last_error());
  CHECK(memcmp(copy, w, nw * sizeof *copy) == 0, "words changed by a refused add");
  /* non-finite addends: counted; finish refuses, nothing written */
  big[17] = NAN;
  big[3] = INFINITY;
  CHECK_STATUS(bx_tokred_add(s, 0, 1, &pb), BX_OK, "non-finite add");
  CHECK_STATUS(bx_tokred_add(s, 0, 2, &p), BX_OK, "add");
  float small[DOUT] = {0.5f};
  float loss[1] = {0.25f};
  for (int64_t c = 0; c < 3; c++) {
    DLTensor ps = view(small, 1, 0), pl = view(loss, 2, 0);
    CHECK_STATUS(bx_tokred_add(s, 1, c, &ps), BX_OK, "add 1");
    CHECK_STATUS(bx_tokred_add(s, 2, c, &pl), BX_EINVAL, "tensor 2's bound is 'all zero'");
  }
  static result out;
  memset(&out, 0x5a, sizeof out);
  result before = out;
  DLTensor o[NT];
  for (int k = 0; k < NT; k++) o[k] = view(out.sum[k], k, 0);
  CHECK_STATUS(bx_tokred_finish(s, o, NT, 1), BX_ENONFINITE, "tensor 0 (checked first) saw NaN/Inf");
  bx_tokred *s2 = make_state(BX_TOKRED_GRID, 4, 10);
  bx_tokred_bound_exp(s2, 0, 7);
  bx_tokred_bound_exp(s2, 1, 0);
  bx_tokred_bound_exp(s2, 2, 0);
  CHECK_STATUS(bx_tokred_agree(s2, NULL), BX_OK, "agree");
  for (int64_t c = 0; c < 3; c++) {
    DLTensor ps = view(small, 1, 0), pl = view(loss, 2, 0);
    CHECK_STATUS(bx_tokred_add(s2, 0, c, c == 1 ? &pb : &p), BX_OK, "add 0");
    CHECK_STATUS(bx_tokred_add(s2, 1, c, &ps), BX_OK, "add 1");
    CHECK_STATUS(bx_tokred_add(s2, 2, c, &pl), BX_OK, "add 2");
  }
  CHECK_STATUS(bx_tokred_finish(s2, o, NT, 1), BX_ENONFINITE, "NaN/Inf in tensor 0");
  CHECK(strstr(bx_last_error(), "tensor 0") && strstr(bx_last_error(), "2 NaN"), "message: %s",
        bx_last_error());
  CHECK(memcmp(&out, &before, sizeof out) == 0, "written on error");
  CHECK_STATUS(bx_tokred_merge(s, s2), BX_EMISMATCH, "different grids");
  CHECK_STATUS(bx_tokred_merge(s2, s2), BX_EINVAL, "merge into itself");
  CHECK_STATUS(bx_tokred_merge(s2, NULL), BX_EINVAL, "merge NULL");
  /* outputs: count, dtype, shape, overlap */
  bx_tokred *s3 = make_state(BX_TOKRED_GRID, 4, 10);
  CHECK_STATUS(bx_tokred_agree(s3, NULL), BX_OK, "agree");
  for (int64_t c = 0; c < 3; c++)
    for (int k = 0; k < NT; k++) {
      float z[DIN * DOUT] = {0};
      DLTensor pz = view(z, k, 0);
      CHECK_STATUS(bx_tokred_add(s3, (size_t)k, c, &pz), BX_OK, "zeros");
    }
  CHECK_STATUS(bx_tokred_finish(s3, o, NT - 1, 1), BX_EINVAL, "nout");
  CHECK_STATUS(bx_tokred_finish(s3, o, NT, 0), BX_EINVAL, "divisor 0");
  DLTensor o2[NT] = {o[0], o[1], o[2]};
  o2[1] = view(out.sum[0], 1, 0); /* overlaps output 0 */
  CHECK_STATUS(bx_tokred_finish(s3, o2, NT, 1), BX_ELAYOUT, "overlapping outputs");
  o2[1] = view(out.sum[1], 1, 0);
  o2[1].dtype.bits = 16;
  CHECK_STATUS(bx_tokred_finish(s3, o2, NT, 1), BX_EDTYPE, "fp16 output");
  CHECK(memcmp(&out, &before, sizeof out) == 0, "written on error");
  CHECK_STATUS(bx_tokred_finish(s3, o, NT, 1), BX_OK, "finish: %s", bx_last_error());
  CHECK(out.sum[0][0] == 0.0f && bxt_fbits(out.sum[2][0]) == 0, "zero sums");
  CHECK_STATUS(bx_tokred_finish(NULL, o, NT, 1), BX_EINVAL, "NULL state");
  bx_tokred *ord = make_state(BX_TOKRED_ORDINARY, 4, 10);
  bx_tokred_agree(ord, NULL);
  CHECK_STATUS(bx_tokred_words(ord, &w, &nw), BX_EINVAL, "ordinary words");
  CHECK_STATUS(bx_tokred_grid_exp(ord, 0, &e), BX_EINVAL, "ordinary grid");
  CHECK_STATUS(bx_tokred_merge(s3, ord), BX_EMISMATCH, "grid with ordinary");
  bx_tokred_destroy(NULL);
  bx_tokred_destroy(ord);
  bx_tokred_destroy(s3);
  bx_tokred_destroy(s2);
  bx_tokred_destroy(s);
  free(copy);
  /* no tensors at all: fine */
  bx_tokred *empty = NULL;
  CHECK_STATUS(bx_tokred_create(NULL, 0, 4, 0, NULL, &empty), BX_OK, "empty");
  CHECK_STATUS(bx_tokred_agree(empty, NULL), BX_OK, "agree empty");
  CHECK_STATUS(bx_tokred_finish(empty, NULL, 0, 1), BX_OK, "finish empty");
  bx_tokred_destroy(empty);
}
