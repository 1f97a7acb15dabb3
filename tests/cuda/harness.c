/*
 * harness.c — checks, counters, seeds and small helpers of the GPU test
 * runner (see ct.h). Checks run on the main thread only.
 */
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ct.h"

#define MAX_PRINTED_FAILURES 12 /* per test; the rest are only counted */

static const char *g_test;
static int g_failures, g_skipped;
static uint64_t g_seed = 20240917u;

void ct_begin(const char *name) {
  g_test = name;
  g_failures = 0;
  g_skipped = 0;
}

int ct_skipped(void) { return g_skipped; }
int ct_failures(void) { return g_failures; }
void ct_set_seed(uint64_t seed) { g_seed = seed; }
uint64_t ct_seed(void) { return g_seed; }

double ct_now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void report(const char *file, int line, const char *what, const char *fmt, va_list ap) {
  g_failures++;
  if (g_failures > MAX_PRINTED_FAILURES) return;
  printf("  FAIL %s:%d: ", file, line);
  vprintf(fmt, ap);
  if (what && *what) printf(": %s", what);
  printf("\n");
  if (g_failures == MAX_PRINTED_FAILURES) printf("  (further failures of this test not printed)\n");
}

int ct_check(int ok, const char *file, int line, const char *fmt, ...) {
  if (ok) return 1;
  va_list ap;
  va_start(ap, fmt);
  report(file, line, "", fmt, ap);
  va_end(ap);
  return 0;
}

int ct_check_bits(double got, double want, const char *file, int line, const char *fmt, ...) {
  if (memcmp(&got, &want, sizeof got) == 0) return 1;
  uint64_t g, w;
  memcpy(&g, &got, 8);
  memcpy(&w, &want, 8);
  char what[200];
  snprintf(what, sizeof what, "GPU %a (0x%016" PRIx64 ") CPU %a (0x%016" PRIx64 ")", got, g,
           want, w);
  va_list ap;
  va_start(ap, fmt);
  report(file, line, what, fmt, ap);
  va_end(ap);
  return 0;
}

int ct_check_status(bx_status got, bx_status want, const char *file, int line,
                    const char *fmt, ...) {
  if (got == want) return 1;
  char what[600];
  snprintf(what, sizeof what, "status %d (%s), expected %d (%s); last error \"%s\"", (int)got,
           bx_status_str(got), (int)want, bx_status_str(want), bx_last_error());
  va_list ap;
  va_start(ap, fmt);
  report(file, line, what, fmt, ap);
  va_end(ap);
  return 0;
}

int ct_check_cuda(cudaError_t err, const char *expr, const char *file, int line) {
  if (err == cudaSuccess) return 1;
  g_failures++;
  if (g_failures <= MAX_PRINTED_FAILURES)
    printf("  FAIL %s:%d: %s: CUDA error %d (%s)\n", file, line, expr, (int)err,
           cudaGetErrorString(err));
  return 0;
}

void ct_skip(const char *fmt, ...) {
  if (!g_skipped) {
    printf("  skip: ");
    va_list ap;
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    printf("\n");
  }
  g_skipped = 1;
}

void ct_note(const char *fmt, ...) {
  printf("  note: ");
  va_list ap;
  va_start(ap, fmt);
  vprintf(fmt, ap);
  va_end(ap);
  printf("\n");
}

/* ---- random numbers --------------------------------------------------- */
void ct_rng_seed(ct_rng *r, uint64_t seed) { bx_rng_seed(r, seed); }
void ct_rng_init(ct_rng *r) { bx_rng_named(r, g_seed, g_test); }
uint64_t ct_next(ct_rng *r) { return bx_rng_next(r); }
uint64_t ct_below(ct_rng *r, uint64_t n) { return bx_rng_below(r, n); }
double ct_uniform(ct_rng *r) { return bx_rng_uniform(r); }
double ct_normal(ct_rng *r) { return bx_rng_normal(r); }

/* ---- norms ------------------------------------------------------------ */
bx_norm_opts ct_norm_opts(int k) {
  bx_norm_opts o = BX_NORM_OPTS_DEFAULT;
  static const double p[CT_NNORMS] = {2.0, 1.0, 0.0, INFINITY, -INFINITY, 2.0};
  o.norm_type = p[k];
  if (k == 5) o.flavor = BX_MEGATRON_FP32;
  return o;
}

const char *ct_norm_name(int k) {
  static const char *names[CT_NNORMS] = {"p=2", "p=1", "p=0", "p=inf", "p=-inf", "megatron"};
  return names[k];
}

const char *ct_tensor_ref(const char *msg) {
  static char buf[96];
  buf[0] = 0;
  const char *g = msg ? strstr(msg, "group ") : NULL;
  if (!g) return buf;
  size_t i = 0;
  /* "group G, tensor T": up to the first character after T's digits */
  const char *t = strstr(g, "tensor ");
  if (!t) return buf;
  const char *e = t + 7;
  while (*e >= '0' && *e <= '9') e++;
  for (const char *c = g; c < e && i + 1 < sizeof buf; c++) buf[i++] = *c;
  buf[i] = 0;
  return buf;
}
