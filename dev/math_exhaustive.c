/*
 * dev/math_exhaustive.c — every fp32 input of every function of
 * src/common/math_det.h against a correctly rounded reference.
 *
 *   build/dev/math_exhaustive [FUNC ...] [-t THREADS] [-s STEP] [--vector [--no-portable]]
 *     FUNC: exp log sigmoid silu rsqrt sin cos (default: all)
 *     -s STEP: only every STEP-th bit pattern (a quick look; default 1 =
 *              all 2^32). Prints per function: inputs checked, max error
 *              in ulp and its input, results not correctly rounded, how
 *              many went to MPFR; exit status 1 if any was not.
 *
 * The reference, and why it is correctly rounded. For an input x, yd is
 * the function evaluated in binary64 with glibc (exp, log, sin, cos,
 * sqrt) and at most three more basic operations: 1/(1+exp(-x)),
 * x/(1+exp(-x)), 1/sqrt(x). glibc documents these double functions within
 * 1 ulp (sqrt exact), so |yd - f(x)| < 5 2^-53 |f(x)|. If the floats
 * nearest to yd(1 - 2^-40) and yd(1 + 2^-40) are the same, every value
 * within 2^-41 of yd — f(x) among them, with a margin of ~2^9 beyond the
 * bound — rounds to that float (rounding is monotonic), so it is f(x)
 * correctly rounded. Otherwise (about 2^-15 of the inputs) f(x) is
 * computed by MPFR at 200 bits and rounded to float by ref_round_f
 * (correct unless f(x) is within 2^-200 of a midpoint: no fp32 input
 * comes anywhere near, these values being transcendental or, for rsqrt,
 * never midpoints). The error in ulp is |got - f(x)| / ulp, with f(x)
 * taken as yd or the MPFR value (either is within 2^-16 ulp of f(x)) and
 * ulp that of f(x)'s float binade (2^-149 below 2^-126; 2^104 above
 * FLT_MAX).
 *
 * The special values and the MPFR evaluation are tests/math_ref.h's, the
 * reference the C suite's tests/test_math.c uses too (MPFR at 200 bits,
 * rounded by tests/mpfr_ref.c's ref_round_f); this program is linked with
 * MPFR and tests/mpfr_ref.c (cmake/BitexactPrograms.cmake).
 *
 * --vector: instead, every kernel table this CPU runs (kernels.h's
 * bx_math_kernels: portable, avx2, avx512) on all 2^32 inputs against the
 * scalar function, bit for bit (the scalar functions being correctly
 * rounded, the vector kernels must give their bits: vmath_body.h); blocks
 * of 2^16 consecutive bit patterns, out of place (--no-portable: the vector
 * tables only; the portable one is the scalar loop itself, and the
 * slowest part). Prints per function and
 * table the inputs checked and the mismatches (the first one); exit
 * status 1 on any.
 *
 * Special values are checked bit for bit against the rules stated in
 * math_det.h (math_ref_special: 0x7fc00000 for a NaN input and for invalid
 * operations, silu(-Inf) = -0; sin/cos: NaN outside |x| < 2^28, those
 * inputs are counted apart).
 */
#include <float.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <mpfr.h>

#include "kernels.h"
#include "math_det.h"
#include "math_ref.h"

/* ---- the functions ----------------------------------------------------------- */
enum {
  F_EXP = MREF_EXP, F_LOG = MREF_LOG, F_SIGMOID = MREF_SIGMOID, F_SILU = MREF_SILU,
  F_RSQRT = MREF_RSQRT, F_SIN = MREF_SIN, F_COS = MREF_COS, NFUNC = MREF_NFUNC
};
#define NAMES MREF_NAMES

static double ref_double(int f, double x) {
  switch (f) {
  case F_EXP: return exp(x);
  case F_LOG: return log(x);
  case F_SIGMOID: return 1.0 / (1.0 + exp(-x));
  case F_SILU: return x / (1.0 + exp(-x));
  case F_RSQRT: return 1.0 / sqrt(x);
  case F_SIN: return sin(x);
  default: return cos(x);
  }
}

static uint32_t fbits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}
static float bitsf(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

/* ulp of the float binade of |v| (v finite) */
static double ulp_of(double v) {
  v = fabs(v);
  if (v < 0x1p-126) return 0x1p-149;
  if (v >= 0x1p128) return 0x1p104;
  int e;
  frexp(v, &e); /* v in [2^(e-1), 2^e) */
  return ldexp(1.0, e - 1 - 23);
}

typedef struct job {
  int f, tid, nthreads;
  uint64_t step;
  /* results */
  uint64_t checked, wrong, to_mpfr, outside;
  double max_ulp;
  uint32_t worst, first_wrong;
} job;

static void *run(void *arg) {
  job *j = arg;
  uint64_t lo = ((uint64_t)1 << 32) * (uint64_t)j->tid / (uint64_t)j->nthreads;
  uint64_t hi = ((uint64_t)1 << 32) * (uint64_t)(j->tid + 1) / (uint64_t)j->nthreads;
  lo = (lo + j->step - 1) / j->step * j->step;
  for (uint64_t u = lo; u < hi; u += j->step) {
    float x = bitsf((uint32_t)u);
    float got = mref_det(j->f, x);
    uint32_t want;
    double exact = 0.0;
    int finite_case = 0;
    float special;
    if (math_ref_special(j->f, x, &special)) {
      want = fbits(special);
      if (x == x && (j->f == F_SIN || j->f == F_COS) && !(fabsf(x) < 0x1p28f)) j->outside++;
    } else {
      double yd = ref_double(j->f, (double)x);
      if (yd != yd) {
        want = BX_MD_QNAN;
      } else if (isinf(yd) || yd == 0.0) {
        want = fbits((float)yd);
      } else {
        double d = yd * 0x1p-40;
        float a = (float)(yd - d), b = (float)(yd + d);
        if (fbits(a) == fbits(b)) {
          want = fbits(a);
          exact = yd;
        } else {
          want = fbits(math_ref(j->f, x, &exact));
          j->to_mpfr++;
        }
        finite_case = 1;
      }
    }
    j->checked++;
    uint32_t gb = fbits(got);
    double err = 0.0;
    if (finite_case) {
      if (isinf(got) && isinf(bitsf(want)) && gb == want) err = 0.0;
      else if (isnan(got) || isinf(got)) err = INFINITY;
      else err = fabs((double)got - exact) / ulp_of(exact);
    } else if (gb != want) {
      err = INFINITY;
    }
    if (gb != want) {
      if (j->wrong == 0) j->first_wrong = (uint32_t)u;
      j->wrong++;
    }
    if (err > j->max_ulp) {
      j->max_ulp = err;
      j->worst = (uint32_t)u;
    }
  }
  mpfr_free_cache();
  return NULL;
}

/* ---- --vector: the kernel tables against the scalar functions ---------------- */

#define VBLOCK ((size_t)1 << 16)

static bx_math_fn table_fn(const bx_math_kernels *k, int f) {
  switch (f) {
  case F_EXP: return k->exp;
  case F_LOG: return k->log;
  case F_SIGMOID: return k->sigmoid;
  case F_SILU: return k->silu;
  case F_RSQRT: return k->rsqrt;
  case F_SIN: return k->sin;
  default: return k->cos;
  }
}

typedef struct vjob {
  int f, tid, nthreads, ntables;
  const bx_math_kernels *tables[3];
  uint64_t checked, wrong[3];
  uint32_t first_wrong[3];
} vjob;

static void *vrun(void *arg) {
  vjob *j = arg;
  float *x = malloc(VBLOCK * 4), *want = malloc(VBLOCK * 4), *got = malloc(VBLOCK * 4);
  if (!x || !want || !got) abort();
  uint64_t nblocks = ((uint64_t)1 << 32) / VBLOCK;
  for (uint64_t blk = (uint64_t)j->tid; blk < nblocks; blk += (uint64_t)j->nthreads) {
    for (size_t i = 0; i < VBLOCK; i++) {
      x[i] = bitsf((uint32_t)(blk * VBLOCK + i));
      want[i] = mref_det(j->f, x[i]);
    }
    for (int t = 0; t < j->ntables; t++) {
      table_fn(j->tables[t], j->f)(x, got, VBLOCK);
      for (size_t i = 0; i < VBLOCK; i++)
        if (fbits(got[i]) != fbits(want[i])) {
          if (j->wrong[t] == 0) j->first_wrong[t] = fbits(x[i]);
          j->wrong[t]++;
        }
    }
    j->checked += VBLOCK;
  }
  free(x);
  free(want);
  free(got);
  return NULL;
}

static int vector_mode(const int *want, int any, int nthreads, int no_portable) {
  const bx_math_kernels *tables[3];
  int ntables = 0;
  if (!no_portable) tables[ntables++] = &bx_math_portable;
#ifdef BX_HAVE_X86
  if (bx_force_isa("avx2") == BX_OK) tables[ntables++] = &bx_math_avx2;
  if (bx_force_isa("avx512") == BX_OK) tables[ntables++] = &bx_math_avx512;
  bx_force_isa(NULL);
#endif
  int bad = 0;
  for (int f = 0; f < NFUNC; f++) {
    if (any && !want[f]) continue;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    vjob jobs[64];
    pthread_t th[64];
    for (int t = 0; t < nthreads; t++) {
      memset(&jobs[t], 0, sizeof jobs[t]);
      jobs[t].f = f;
      jobs[t].tid = t;
      jobs[t].nthreads = nthreads;
      jobs[t].ntables = ntables;
      memcpy(jobs[t].tables, tables, sizeof tables);
      pthread_create(&th[t], NULL, vrun, &jobs[t]);
    }
    uint64_t checked = 0, wrong[3] = {0, 0, 0};
    uint32_t first[3] = {0, 0, 0};
    for (int t = 0; t < nthreads; t++) {
      pthread_join(th[t], NULL);
      checked += jobs[t].checked;
      for (int k = 0; k < ntables; k++) {
        if (jobs[t].wrong[k] && !wrong[k]) first[k] = jobs[t].first_wrong[k];
        wrong[k] += jobs[t].wrong[k];
      }
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double secs = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    printf("%-8s %llu inputs:", NAMES[f], (unsigned long long)checked);
    for (int k = 0; k < ntables; k++) {
      printf(" %s %llu differ", tables[k]->name, (unsigned long long)wrong[k]);
      if (wrong[k]) printf(" (first 0x%08x)", first[k]);
      printf(k + 1 < ntables ? "," : "");
      if (wrong[k]) bad = 1;
    }
    printf(" from the scalar function, %.1f s\n", secs);
    fflush(stdout);
  }
  return bad;
}

int main(int argc, char **argv) {
  int want[NFUNC] = {0}, any = 0, nthreads = 2, vector = 0, no_portable = 0;
  uint64_t step = 1;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "-t") && i + 1 < argc) {
      nthreads = atoi(argv[++i]);
      continue;
    }
    if (!strcmp(argv[i], "--vector")) {
      vector = 1;
      continue;
    }
    if (!strcmp(argv[i], "--no-portable")) {
      no_portable = 1;
      continue;
    }
    if (!strcmp(argv[i], "-s") && i + 1 < argc) {
      step = strtoull(argv[++i], NULL, 0);
      continue;
    }
    int found = 0;
    for (int f = 0; f < NFUNC; f++)
      if (!strcmp(argv[i], NAMES[f])) want[f] = found = any = 1;
    if (!found) {
      fprintf(stderr, "usage: %s [exp|log|sigmoid|silu|rsqrt|sin|cos ...] [-t N] [-s STEP] [--vector [--no-portable]]\n",
              argv[0]);
      return 2;
    }
  }
  if (nthreads < 1 || nthreads > 64 || step < 1) return 2;
  if (vector) return vector_mode(want, any, nthreads, no_portable);
  int bad = 0;
  for (int f = 0; f < NFUNC; f++) {
    if (any && !want[f]) continue;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    job jobs[64];
    pthread_t th[64];
    for (int t = 0; t < nthreads; t++) {
      memset(&jobs[t], 0, sizeof jobs[t]);
      jobs[t].f = f;
      jobs[t].tid = t;
      jobs[t].nthreads = nthreads;
      jobs[t].step = step;
      pthread_create(&th[t], NULL, run, &jobs[t]);
    }
    job tot;
    memset(&tot, 0, sizeof tot);
    for (int t = 0; t < nthreads; t++) {
      pthread_join(th[t], NULL);
      tot.checked += jobs[t].checked;
      tot.to_mpfr += jobs[t].to_mpfr;
      tot.outside += jobs[t].outside;
      if (jobs[t].wrong && !tot.wrong) tot.first_wrong = jobs[t].first_wrong;
      tot.wrong += jobs[t].wrong;
      if (jobs[t].max_ulp > tot.max_ulp || t == 0) {
        tot.max_ulp = jobs[t].max_ulp;
        tot.worst = jobs[t].worst;
      }
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double secs = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    float wx = bitsf(tot.worst);
    printf("%-8s %llu inputs (%llu outside the domain), max error %.6f ulp at x = %a "
           "(0x%08x), %llu not correctly rounded",
           NAMES[f], (unsigned long long)tot.checked, (unsigned long long)tot.outside,
           tot.max_ulp, (double)wx, tot.worst, (unsigned long long)tot.wrong);
    if (tot.wrong) printf(" (first 0x%08x)", tot.first_wrong);
    printf(", %llu via MPFR, %.1f s\n", (unsigned long long)tot.to_mpfr, secs);
    fflush(stdout);
    if (tot.wrong) bad = 1;
  }
  return bad;
}
