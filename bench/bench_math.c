/*
 * bench/bench_math.c — throughput of the elementwise calls of
 * bitexact_train.h (bx_exp ... bx_cos, and bx_adamw_step) against a plain
 * glibc loop (expf, logf, 1/(1+expf(-x)), x/(1+expf(-x)), 1/sqrtf, sinf,
 * cosf) in the same run, at 1 and 2 threads (bx_math_opts.num_threads),
 * interleaved (one glibc run, one bx run at 1 thread, one at 2, and so
 * on). ns/element: the median of 9 runs over N elements of typical inputs
 * (activations ~N(0, 4); log/rsqrt: |x|; sin/cos: RoPE angles up to
 * 2^17); "bx/glibc": the median over runs of glibc's time / bx's 1-thread
 * time (bx's throughput as a multiple of glibc's). 1-thread times are the
 * thread's CPU time, 2-thread times wall time. The kernel table used
 * is printed (BX_ISA=portable|avx2|avx512 forces one). torch: see
 * bench/bench_math_torch.py.
 *
 *   build/bench/bench_math [N]        (default N = 2^20)
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bitexact.h"
#include "bitexact_train.h"
#include "rng.h"

#define RUNS 9

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* this thread's CPU time: the 1-thread figures (glibc, bx with 1 thread
 * computes on the calling thread), so that other programs sharing the
 * machine do not count */
static double cpu_now(void) {
  struct timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int cmp_d(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double median(double *v) {
  qsort(v, RUNS, sizeof v[0], cmp_d);
  return v[RUNS / 2];
}

enum { F_EXP, F_LOG, F_SIGMOID, F_SILU, F_RSQRT, F_SIN, F_COS, NFUNC };
static const char *const NAMES[NFUNC] = {"exp", "log", "sigmoid", "silu", "rsqrt", "sin", "cos"};
typedef bx_status (*tensor_fn)(const DLTensor *, DLTensor *, const bx_math_opts *);
static const tensor_fn FNS[NFUNC] = {bx_exp, bx_log, bx_sigmoid, bx_silu, bx_rsqrt, bx_sin, bx_cos};

static float sink;

static void glibc_loop(int f, const float *x, float *y, size_t n) {
  switch (f) {
  case F_EXP: for (size_t i = 0; i < n; i++) y[i] = expf(x[i]); break;
  case F_LOG: for (size_t i = 0; i < n; i++) y[i] = logf(x[i]); break;
  case F_SIGMOID: for (size_t i = 0; i < n; i++) y[i] = 1.0f / (1.0f + expf(-x[i])); break;
  case F_SILU: for (size_t i = 0; i < n; i++) y[i] = x[i] / (1.0f + expf(-x[i])); break;
  case F_RSQRT: for (size_t i = 0; i < n; i++) y[i] = 1.0f / sqrtf(x[i]); break;
  case F_SIN: for (size_t i = 0; i < n; i++) y[i] = sinf(x[i]); break;
  default: for (size_t i = 0; i < n; i++) y[i] = cosf(x[i]); break;
  }
}

static DLTensor view(float *data, int64_t *shape) {
  DLTensor t;
  memset(&t, 0, sizeof t);
  t.data = data;
  t.device.device_type = kDLCPU;
  t.ndim = 1;
  t.dtype.code = kDLFloat;
  t.dtype.bits = 32;
  t.dtype.lanes = 1;
  t.shape = shape;
  return t;
}

int main(int argc, char **argv) {
  size_t n = argc > 1 ? (size_t)strtoull(argv[1], NULL, 0) : (size_t)1 << 20;
  if (n == 0) return 2;
  float *x = malloc(n * 4), *y = malloc(n * 4), *g = malloc(n * 4), *m = malloc(n * 4),
        *v = malloc(n * 4);
  if (!x || !y || !g || !m || !v) return 1;
  int64_t shape[1] = {(int64_t)n};
  bx_rng r;
  bx_rng_seed(&r, 42);
  printf("bench_math: N = %zu elements, median of %d runs, ns/element, kernels %s\n", n, RUNS,
         bx_isa_name());
  printf("%-8s %12s %12s %12s %10s\n", "function", "glibc 1 thr", "bx 1 thr", "bx 2 thr",
         "bx/glibc");
  for (int f = 0; f < NFUNC; f++) {
    for (size_t i = 0; i < n; i++) {
      double u1 = ((double)(bx_rng_next(&r) >> 11) + 0.5) * 0x1p-53;
      double u2 = ((double)(bx_rng_next(&r) >> 11) + 0.5) * 0x1p-53;
      double z = sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
      float a = (float)(2.0 * z);
      if (f == F_LOG || f == F_RSQRT) a = fabsf(a);
      if (f == F_SIN || f == F_COS) a = (float)(u1 * 131072.0);
      x[i] = a;
    }
    DLTensor xt = view(x, shape), yt = view(y, shape);
    double tg[RUNS], t1[RUNS], td[RUNS], ratio[RUNS];
    bx_math_opts one = BX_MATH_OPTS_DEFAULT, two = BX_MATH_OPTS_DEFAULT;
    one.num_threads = 1;
    two.num_threads = 2;
    for (int k = 0; k < RUNS; k++) {
      double t0 = cpu_now();
      glibc_loop(f, x, y, n);
      tg[k] = cpu_now() - t0;
      sink += y[n / 2];
      t0 = cpu_now();
      if (FNS[f](&xt, &yt, &one) != BX_OK) return 1;
      t1[k] = cpu_now() - t0;
      t0 = now();
      if (FNS[f](&xt, &yt, &two) != BX_OK) return 1;
      td[k] = now() - t0;
      ratio[k] = tg[k] / t1[k];
    }
    double a = median(tg) * 1e9 / (double)n, b = median(t1) * 1e9 / (double)n,
           c = median(td) * 1e9 / (double)n;
    printf("%-8s %12.3f %12.3f %12.3f %10.2f\n", NAMES[f], a, b, c, median(ratio));
  }
  /* AdamW: one step over n parameters */
  for (size_t i = 0; i < n; i++) {
    x[i] = (float)i * 1e-6f;
    g[i] = 1e-3f * (float)(i % 97);
    m[i] = v[i] = 0.0f;
  }
  DLTensor pt = view(x, shape), gt = view(g, shape), mt = view(m, shape), vt = view(v, shape);
  double ta[RUNS], tb[RUNS];
  bx_adamw_opts o1 = BX_ADAMW_OPTS_DEFAULT;
  o1.num_threads = 1;
  for (int k = 0; k < RUNS; k++) {
    double t0 = now();
    if (bx_adamw_step(&pt, &gt, &mt, &vt, k + 1, &o1) != BX_OK) return 1;
    ta[k] = now() - t0;
    t0 = now();
    if (bx_adamw_step(&pt, &gt, &mt, &vt, k + 1, NULL) != BX_OK) return 1;
    tb[k] = now() - t0;
  }
  printf("%-8s %12s %12.3f %12.3f\n", "adamw", "-", median(ta) * 1e9 / (double)n,
         median(tb) * 1e9 / (double)n);
  printf("(sink %g)\n", (double)sink);
  free(x);
  free(y);
  free(g);
  free(m);
  free(v);
  return 0;
}
