/*
 * dev/math_exhaustive.c — every fp32 input of every function of
 * src/common/math_det.h against a correctly rounded reference.
 *
 *   build/dev/math_exhaustive [FUNC ...] [-t THREADS] [-s STEP]
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
 * computed by MPFR at 200 bits and rounded to float by mpfr_get_flt
 * (correct unless f(x) is within 2^-200 of a midpoint: no fp32 input
 * comes anywhere near, these values being transcendental or, for rsqrt,
 * never midpoints). The error in ulp is |got - f(x)| / ulp, with f(x)
 * taken as yd or the MPFR value (either is within 2^-16 ulp of f(x)) and
 * ulp that of f(x)'s float binade (2^-149 below 2^-126; 2^104 above
 * FLT_MAX).
 *
 * MPFR is loaded with dlopen (libmpfr.so.6): the dev programs are linked
 * with the library only.
 *
 * Special values are checked bit for bit against the rules stated in
 * math_det.h (quieted input NaN, 0x7fc00000 for invalid operations,
 * silu(-Inf) = -0; sin/cos: NaN outside |x| < 2^28, those inputs are
 * counted apart).
 */
#include <dlfcn.h>
#include <float.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <mpfr.h>

#include "math_det.h"

/* ---- MPFR through dlopen ---------------------------------------------------- */
static void (*m_init2)(mpfr_ptr, mpfr_prec_t);
static void (*m_clear)(mpfr_ptr);
static int (*m_set_d)(mpfr_ptr, double, mpfr_rnd_t);
static int (*m_exp)(mpfr_ptr, mpfr_srcptr, mpfr_rnd_t);
static int (*m_log)(mpfr_ptr, mpfr_srcptr, mpfr_rnd_t);
static int (*m_sin)(mpfr_ptr, mpfr_srcptr, mpfr_rnd_t);
static int (*m_cos)(mpfr_ptr, mpfr_srcptr, mpfr_rnd_t);
static int (*m_rec_sqrt)(mpfr_ptr, mpfr_srcptr, mpfr_rnd_t);
static int (*m_neg)(mpfr_ptr, mpfr_srcptr, mpfr_rnd_t);
static int (*m_add_ui)(mpfr_ptr, mpfr_srcptr, unsigned long, mpfr_rnd_t);
static int (*m_ui_div)(mpfr_ptr, unsigned long, mpfr_srcptr, mpfr_rnd_t);
static int (*m_mul)(mpfr_ptr, mpfr_srcptr, mpfr_srcptr, mpfr_rnd_t);
static float (*m_get_flt)(mpfr_srcptr, mpfr_rnd_t);
static double (*m_get_d)(mpfr_srcptr, mpfr_rnd_t);

static int load_mpfr(void) {
  void *h = dlopen("libmpfr.so.6", RTLD_NOW);
  if (!h) h = dlopen("libmpfr.so", RTLD_NOW);
  if (!h) {
    fprintf(stderr, "math_exhaustive: cannot load MPFR: %s\n", dlerror());
    return 0;
  }
#define LOAD(var, name)                                              \
  do {                                                               \
    *(void **)(&var) = dlsym(h, name);                               \
    if (!var) {                                                      \
      fprintf(stderr, "math_exhaustive: MPFR lacks %s\n", name);     \
      return 0;                                                      \
    }                                                                \
  } while (0)
  LOAD(m_init2, "mpfr_init2");
  LOAD(m_clear, "mpfr_clear");
  LOAD(m_set_d, "mpfr_set_d");
  LOAD(m_exp, "mpfr_exp");
  LOAD(m_log, "mpfr_log");
  LOAD(m_sin, "mpfr_sin");
  LOAD(m_cos, "mpfr_cos");
  LOAD(m_rec_sqrt, "mpfr_rec_sqrt");
  LOAD(m_neg, "mpfr_neg");
  LOAD(m_add_ui, "mpfr_add_ui");
  LOAD(m_ui_div, "mpfr_ui_div");
  LOAD(m_mul, "mpfr_mul");
  LOAD(m_get_flt, "mpfr_get_flt");
  LOAD(m_get_d, "mpfr_get_d");
#undef LOAD
  return 1;
}

/* ---- the functions ----------------------------------------------------------- */
enum { F_EXP, F_LOG, F_SIGMOID, F_SILU, F_RSQRT, F_SIN, F_COS, NFUNC };
static const char *const NAMES[NFUNC] = {"exp", "log", "sigmoid", "silu", "rsqrt", "sin", "cos"};

static float det(int f, float x) {
  switch (f) {
  case F_EXP: return bx_expf_det(x);
  case F_LOG: return bx_logf_det(x);
  case F_SIGMOID: return bx_sigmoidf_det(x);
  case F_SILU: return bx_siluf_det(x);
  case F_RSQRT: return bx_rsqrtf_det(x);
  case F_SIN: return bx_sinf_det(x);
  default: return bx_cosf_det(x);
  }
}

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

/* f(x) at 200 bits into y (finite, non-zero cases only). */
static void ref_mpfr(int f, double x, mpfr_ptr y) {
  mpfr_t X, t;
  m_init2(X, 53);
  m_init2(t, 200);
  m_set_d(X, x, MPFR_RNDN);
  switch (f) {
  case F_EXP: m_exp(y, X, MPFR_RNDN); break;
  case F_LOG: m_log(y, X, MPFR_RNDN); break;
  case F_SIGMOID:
  case F_SILU:
    m_neg(t, X, MPFR_RNDN);
    m_exp(t, t, MPFR_RNDN);
    m_add_ui(t, t, 1, MPFR_RNDN);
    m_ui_div(y, 1, t, MPFR_RNDN);
    if (f == F_SILU) m_mul(y, y, X, MPFR_RNDN);
    break;
  case F_RSQRT: m_rec_sqrt(y, X, MPFR_RNDN); break;
  case F_SIN: m_sin(y, X, MPFR_RNDN); break;
  default: m_cos(y, X, MPFR_RNDN); break;
  }
  m_clear(X);
  m_clear(t);
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
  mpfr_t big;
  m_init2(big, 200);
  uint64_t lo = ((uint64_t)1 << 32) * (uint64_t)j->tid / (uint64_t)j->nthreads;
  uint64_t hi = ((uint64_t)1 << 32) * (uint64_t)(j->tid + 1) / (uint64_t)j->nthreads;
  lo = (lo + j->step - 1) / j->step * j->step;
  for (uint64_t u = lo; u < hi; u += j->step) {
    float x = bitsf((uint32_t)u);
    float got = det(j->f, x);
    uint32_t want;
    double exact = 0.0;
    int finite_case = 0;
    if (x != x) {
      want = (uint32_t)u | 0x00400000u;
    } else if ((j->f == F_SIN || j->f == F_COS) && !(fabsf(x) < 0x1p28f)) {
      want = BX_MD_QNAN;
      j->outside++;
    } else if (j->f == F_SILU && isinf(x) && x < 0) {
      want = 0x80000000u;
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
          ref_mpfr(j->f, (double)x, big);
          want = fbits(m_get_flt(big, MPFR_RNDN));
          exact = m_get_d(big, MPFR_RNDN);
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
  m_clear(big);
  return NULL;
}

int main(int argc, char **argv) {
  int want[NFUNC] = {0}, any = 0, nthreads = 2;
  uint64_t step = 1;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "-t") && i + 1 < argc) {
      nthreads = atoi(argv[++i]);
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
      fprintf(stderr, "usage: %s [exp|log|sigmoid|silu|rsqrt|sin|cos ...] [-t N] [-s STEP]\n",
              argv[0]);
      return 2;
    }
  }
  if (nthreads < 1 || nthreads > 64 || step < 1) return 2;
  if (!load_mpfr()) return 2;
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
