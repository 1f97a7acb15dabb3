/*
 * bench_tokred.c — the cost of the layout-invariant token reduction
 * (bitexact_train.h, "Token reduction") next to what a framework does with
 * the same partials (a plain fp32 add, grad += partial), in the same run.
 *
 * One gradient of N fp32 elements (default 2^22, 16 MiB; --n), K chunk
 * partials (default 8; --chunks, >= 2; the first partial of each method is
 * added untimed, so that first-touch page faults are not counted) of gradient-like values (N(0, 1e-3^2)).
 * Timed, interleaved, each repetition once per method, the median kept
 * (--reps, default 9):
 *   fp32 add        acc[i] += p[i] in fp32 (the baseline; -O2, the
 *                   compiler's vectorisation)
 *   bound           bx_tokred_bound of one partial (max |a|)
 *   add             bx_tokred_add of one partial (round onto the grid,
 *                   int64 add, coverage word)
 *   ordinary add    bx_tokred_add in BX_TOKRED_ORDINARY (fp32, same API)
 *   finish          bx_tokred_finish into fp32, divisor 1 (a sum)
 *   finish mean     bx_tokred_finish into fp32, divisor = tokens (a mean)
 * in ns per element, and add's overhead relative to the fp32 add. The
 * header names the CPU. It checks that the grid result is within the
 * documented bound of an fp64 sum of the same partials and exits non-zero
 * otherwise.
 *
 *   bench_tokred [--n N] [--chunks K] [--reps R]
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bitexact_train.h"
#include "rng.h"

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void cpu_model(char *buf, size_t len) {
  snprintf(buf, len, "unknown CPU");
  FILE *f = fopen("/proc/cpuinfo", "r");
  if (!f) return;
  char line[512];
  while (fgets(line, sizeof line, f)) {
    char *c = strchr(line, ':');
    if (!strncmp(line, "model name", 10) && c) {
      c += 2;
      c[strcspn(c, "\n")] = 0;
      snprintf(buf, len, "%s", c);
      break;
    }
  }
  fclose(f);
}

static int cmp_d(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_d);
  return v[n / 2];
}

/* the baseline, kept out of line so it is timed as written */
static void __attribute__((noinline)) plain_add(float *acc, const float *p, size_t n) {
  for (size_t i = 0; i < n; i++) acc[i] += p[i];
}

static DLTensor view(void *data, int64_t *shape, int bits) {
  DLTensor t;
  memset(&t, 0, sizeof t);
  t.data = data;
  t.device.device_type = kDLCPU;
  t.ndim = 1;
  t.shape = shape;
  t.dtype.code = kDLFloat;
  t.dtype.bits = (uint8_t)bits;
  t.dtype.lanes = 1;
  return t;
}

#define NMETHODS 6
static const char *names[NMETHODS] = {"fp32 add", "bound", "add", "ordinary add", "finish",
                                      "finish mean"};

static int fail(const char *what, bx_status st) {
  fprintf(stderr, "bench_tokred: %s failed: %s\n", what, st == BX_OK ? "" : bx_last_error());
  return 1;
}

int main(int argc, char **argv) {
  size_t n = (size_t)1 << 22;
  int K = 8, reps = 9;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "--n")) n = (size_t)strtoull(argv[i + 1], NULL, 0);
    else if (!strcmp(argv[i], "--chunks")) K = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--reps")) reps = atoi(argv[i + 1]);
  }
  if (K < 2 || reps < 1 || reps > 99 || n < 1) {
    fprintf(stderr, "usage: bench_tokred [--n N] [--chunks K] [--reps R<=99]\n");
    return 2;
  }
  char cpu[256];
  cpu_model(cpu, sizeof cpu);
  printf("bench_tokred: %s; bitexact %s; N = %zu fp32 elements, %d chunk partials, median of "
         "%d\n", cpu, bx_version_string(), n, K, reps);
  float **part = malloc((size_t)K * sizeof *part);
  float *acc = malloc(n * sizeof *acc), *out = malloc(n * sizeof *out);
  if (!part || !acc || !out) return fail("malloc", BX_OK);
  bx_rng r;
  bx_rng_seed(&r, 12345);
  for (int k = 0; k < K; k++) {
    part[k] = malloc(n * sizeof **part);
    if (!part[k]) return fail("malloc", BX_OK);
    for (size_t i = 0; i < n; i++) {
      double u = ((double)(bx_rng_next(&r) >> 11) + 0.5) * 0x1p-53;
      double v = ((double)(bx_rng_next(&r) >> 11) + 0.5) * 0x1p-53;
      part[k][i] = (float)(1e-3 * sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v));
    }
  }
  int64_t shape[1] = {(int64_t)n};
  DLTensor g = view(NULL, shape, 32);
  int64_t C = 512, T = (int64_t)K * C;
  double t[NMETHODS][99];
  int bad = 0;
  for (int rep = 0; rep < reps + 1; rep++) { /* rep 0 warms up */
    bx_tokred *s = NULL, *o = NULL;
    bx_tokred_opts oo = BX_TOKRED_OPTS_DEFAULT;
    oo.mode = BX_TOKRED_ORDINARY;
    bx_status st = bx_tokred_create(&g, 1, C, T, NULL, &s);
    if (st == BX_OK) st = bx_tokred_create(&g, 1, C, T, &oo, &o);
    if (st != BX_OK) return fail("create", st);
    double t0 = now();
    memset(acc, 0, n * sizeof *acc);
    double tz = now() - t0;
    plain_add(acc, part[0], n); /* chunk 0 untimed everywhere: first touch */
    t0 = now();
    for (int k = 1; k < K; k++) plain_add(acc, part[k], n);
    double ta = now() - t0;
    (void)tz;
    t0 = now();
    for (int k = 0; k < K && st == BX_OK; k++) {
      DLTensor p = view(part[k], shape, 32);
      st = bx_tokred_bound(s, 0, k, &p);
    }
    double tb = now() - t0;
    if (st == BX_OK) st = bx_tokred_agree(s, NULL);
    if (st == BX_OK) st = bx_tokred_agree(o, NULL);
    DLTensor p0 = view(part[0], shape, 32);
    if (st == BX_OK) st = bx_tokred_add(s, 0, 0, &p0);
    if (st == BX_OK) st = bx_tokred_add(o, 0, 0, &p0);
    t0 = now();
    for (int k = 1; k < K && st == BX_OK; k++) {
      DLTensor p = view(part[k], shape, 32);
      st = bx_tokred_add(s, 0, k, &p);
    }
    double tg = now() - t0;
    t0 = now();
    for (int k = 1; k < K && st == BX_OK; k++) {
      DLTensor p = view(part[k], shape, 32);
      st = bx_tokred_add(o, 0, k, &p);
    }
    double to = now() - t0;
    DLTensor y = view(out, shape, 32);
    t0 = now();
    if (st == BX_OK) st = bx_tokred_finish(s, &y, 1, 1);
    double tf = now() - t0;
    if (st != BX_OK) return fail("the grid calls", st);
    /* check against an fp64 sum: within N 2^(e-1) + half an fp32 ulp */
    int e = 0;
    bx_tokred_grid_exp(s, 0, &e);
    for (size_t i = 0; i < n; i += 997) {
      double ref = 0.0;
      for (int k = 0; k < K; k++) ref += (double)part[k][i];
      double tol = K * ldexp(1.0, e - 1) + fabs(ref) * 0x1p-24 + fabs(ref) * 1e-15;
      if (!(fabs((double)out[i] - ref) <= tol)) {
        if (!bad) fprintf(stderr, "bench_tokred: element %zu: %a, fp64 sum %a\n", i, (double)out[i], ref);
        bad = 1;
      }
    }
    t0 = now();
    st = bx_tokred_finish(s, &y, 1, T);
    double tm = now() - t0;
    if (st != BX_OK) return fail("finish mean", st);
    if (rep > 0) {
      double per = 1e9 / ((double)n * (K - 1)), per1 = 1e9 / (double)n;
      t[0][rep - 1] = ta * per;
      t[1][rep - 1] = tb * 1e9 / ((double)n * K);
      t[2][rep - 1] = tg * per;
      t[3][rep - 1] = to * per;
      t[4][rep - 1] = tf * per1;
      t[5][rep - 1] = tm * per1;
    }
    bx_tokred_destroy(s);
    bx_tokred_destroy(o);
  }
  double med[NMETHODS];
  for (int m = 0; m < NMETHODS; m++) {
    med[m] = median(t[m], reps);
    printf("  %-13s %8.3f ns/element%s\n", names[m], med[m],
           m <= 3 ? " (per partial element)" : " (per gradient element, once per step)");
  }
  printf("  add / fp32 add: %.2fx; bound + add / fp32 add: %.2fx\n", med[2] / med[0],
         (med[1] + med[2]) / med[0]);
  for (int k = 0; k < K; k++) free(part[k]);
  free(part);
  free(acc);
  free(out);
  if (bad) fprintf(stderr, "bench_tokred: the grid result is outside its bound\n");
  return bad;
}
