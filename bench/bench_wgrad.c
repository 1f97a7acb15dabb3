/*
 * bench_wgrad.c — the layout-invariant weight gradient against the plain
 * fixed-order one, in the same run.
 *
 *   plain      bx_gemm(BX_GEMM_TN) over all M tokens: dW = dYᵀ X, one
 *              chain per element over the M tokens (batch-dependent bits
 *              under another split, the baseline of the overhead)
 *   inv C      the invariant weight gradient with chunks of C tokens, the
 *              whole one-pass flow of one step on one rank:
 *              bx_tokred_create, bx_linear_wgrad_bound (maxima of dY and X
 *              per chunk), bx_tokred_agree (no communicator),
 *              bx_linear_wgrad (per chunk the TN GEMM, each finished block
 *              rounded onto the grid in the GEMM's epilogue),
 *              bx_tokred_finish into fp32, bx_tokred_destroy
 *   (add C)    of which bx_linear_wgrad alone
 *
 * Shapes (dW [N,K] of Y = X Wᵀ, M tokens), fp32:
 *   glm-tiny (hidden 256, dense intermediate 512, MoE-like):
 *     gate+up  N 1024 K 256   M 4096
 *     down     N 256  K 512   M 4096
 *     attn o   N 256  K 256   M 4096
 *   gpt2-small:
 *     fc       N 3072 K 768   M 8192
 *     proj     N 768  K 768   M 8192
 * 1 and 2 threads (--threads LIST). Every variant of a shape is timed once
 * per repetition, interleaved (plain, inv 256, inv 1024, plain, ...), so a
 * shared machine slows them alike; a time is the median of --reps
 * repetitions (default 5), each the mean of back-to-back calls filling 50
 * ms after a warm-up. Prints the plain ms and GFLOP/s (2·M·N·K), per
 * invariant variant its whole step (ms), of which the bound and the
 * bx_linear_wgrad part (ms), and "ratio": the median over repetitions of
 * (invariant step / plain GEMM of the same repetition) and "-bound" the
 * same without the bound pass (a caller that has the maxima of dY and X
 * from elsewhere and calls bx_wgrad_bound_exp + bx_tokred_bound_exp).
 *
 * With --cpu-time the times are the process's CPU time (CLOCK_PROCESS_CPUTIME_ID,
 * all threads summed): on a machine shared with other jobs that is the
 * steadier measure of the work (1 thread: the time it would take alone).
 *
 *   bench_wgrad [--threads 1,2] [--reps R] [--quick] [--shape NAME] [--cpu-time]
 *
 * Checks that 1 and T threads give the same invariant bits and that the
 * invariant result is within 2^-20 relative (to Σ|terms|) of the plain
 * one; exit status 1 if not.
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_common.h"
#include "bitexact_train.h"
#include "../tests/dl_view.h"
#include "kernels.h"
#include "rng.h"

typedef struct shape {
  const char *model, *name;
  int n, k, m;
} shape;

static const shape SHAPES[] = {
    {"glm-tiny", "gate+up", 1024, 256, 4096},  {"glm-tiny", "down", 256, 512, 4096},
    {"glm-tiny", "attn o", 256, 256, 4096},    {"gpt2-small", "fc", 3072, 768, 8192},
    {"gpt2-small", "proj", 768, 768, 8192},
};
#define NSHAPES (sizeof SHAPES / sizeof SHAPES[0])
#define MAXT 8
#define NV 3
static const int64_t CHUNKS[NV] = {0, 256, 1024}; /* 0: plain */

static int use_cpu_time; /* --cpu-time: the process's CPU time instead of the wall clock */

/* the clock of the measurements */
static double clock_s(void) { return use_cpu_time ? process_cpu_now() : now(); }

typedef struct ctx {
  DLTensor dy, x, dw;
  int64_t sdy[2], sx[2], sdw[2];
  int threads;
  double add_s;   /* seconds in bx_linear_wgrad of the last call */
  double bound_s; /* seconds in bx_linear_wgrad_bound */
} ctx;

static void die(const char *what) {
  fprintf(stderr, "bench_wgrad: %s failed: %s\n", what, bx_last_error());
  exit(1);
}

/* one step of variant v (0 = plain) into c->dw */
static void step(ctx *c, int64_t chunk) {
  if (!chunk) {
    bx_gemm_opts o = BX_GEMM_OPTS_DEFAULT;
    o.num_threads = c->threads;
    if (bx_gemm(&c->dy, &c->x, BX_GEMM_TN, &c->dw, &o) != BX_OK) die("bx_gemm");
    return;
  }
  bx_tokred *s;
  DLTensor g = c->dw;
  if (bx_tokred_create(&g, 1, chunk, c->sdy[0], NULL, &s) != BX_OK) die("bx_tokred_create");
  bx_wgrad_opts o = BX_WGRAD_OPTS_DEFAULT;
  o.num_threads = c->threads;
  double tb = clock_s();
  if (bx_linear_wgrad_bound(s, 0, BX_WGRAD_NONE, &c->dy, &c->x, 0, &o) != BX_OK) die("bound");
  c->bound_s = clock_s() - tb;
  if (bx_tokred_agree(s, NULL) != BX_OK) die("agree");
  double t0 = clock_s();
  if (bx_linear_wgrad(s, 0, BX_WGRAD_NONE, &c->dy, &c->x, 0, &o) != BX_OK) die("bx_linear_wgrad");
  c->add_s = clock_s() - t0;
  if (bx_tokred_finish(s, &c->dw, 1, 1) != BX_OK) die("finish");
  bx_tokred_destroy(s);
}

/* mean seconds per step over >= 50 ms (and of the add part) */
static double time_step(ctx *c, int64_t chunk, double *add, double *bound) {
  int calls = 0;
  double t0 = clock_s(), t1, a = 0, b = 0;
  do {
    step(c, chunk);
    a += c->add_s;
    b += c->bound_s;
    calls++;
    t1 = clock_s();
  } while (t1 - t0 < 0.05);
  *add = a / calls;
  *bound = b / calls;
  return (t1 - t0) / calls;
}

int main(int argc, char **argv) {
  int threads[MAXT] = {1, 2}, nthreads = 2, reps = 5;
  const char *only = NULL;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--quick")) reps = 3;
    else if (!strcmp(argv[i], "--cpu-time")) use_cpu_time = 1;
    else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--shape") && i + 1 < argc) only = argv[++i];
    else if (!strcmp(argv[i], "--threads") && i + 1 < argc) {
      nthreads = parse_threads(argv[++i], threads, MAXT);
    } else {
      fprintf(stderr, "usage: bench_wgrad [--threads 1,2] [--reps R] [--quick] [--shape NAME] [--cpu-time]\n");
      return 2;
    }
  }
  if (reps < 1) reps = 1;
  if (reps > 31) reps = 31;
  char cpu[256];
  cpu_model(cpu, sizeof cpu);
  printf("bench_wgrad: %s\nkernels: %s (GEMM %s %zux%zu, grid add %s); median of %d interleaved reps; %s\n",
         cpu, bx_kernels_reason(), bx_gemm_kernel_active()->name, bx_gemm_kernel_active()->mr,
         bx_gemm_kernel_active()->nr, bx_tokred_kernels_active()->name, reps,
         use_cpu_time ? "process CPU time (all threads summed)" : "wall clock");
  printf("%-10s %-8s %5s %5s %5s %3s %9s %8s | %9s %7s %8s %6s %6s | %9s %7s %8s %6s %6s\n",
         "model", "dW", "N", "K", "M", "thr", "plain ms", "GFLOP/s", "inv256 ms", "bound", "wgrad",
         "ratio", "-bound", "inv1024", "bound", "wgrad", "ratio", "-bound");
  int bad = 0;
  bx_rng r;
  bx_rng_seed(&r, 7);
  for (size_t si = 0; si < NSHAPES; si++) {
    const shape *sh = &SHAPES[si];
    if (only && strcmp(only, sh->name) != 0) continue;
    size_t n = (size_t)sh->n, k = (size_t)sh->k, m = (size_t)sh->m;
    float *dy = aligned_alloc(64, m * n * 4), *x = aligned_alloc(64, m * k * 4);
    float *dw = aligned_alloc(64, n * k * 4), *first[NV], *plain = malloc(n * k * 4);
    for (int v = 0; v < NV; v++) first[v] = malloc(n * k * 4);
    for (size_t i = 0; i < m * n; i++) dy[i] = (float)((bx_rng_uniform(&r) * 2 - 1) * 1e-3);
    for (size_t i = 0; i < m * k; i++) x[i] = (float)(bx_rng_uniform(&r) * 2 - 1);
    ctx c;
    c.sdy[0] = c.sx[0] = (int64_t)m;
    c.sdy[1] = c.sdw[0] = (int64_t)n;
    c.sx[1] = c.sdw[1] = (int64_t)k;
    c.dy = bxt_f32_view(dy, 2, c.sdy);
    c.x = bxt_f32_view(x, 2, c.sx);
    c.dw = bxt_f32_view(dw, 2, c.sdw);
    double gfl = 2.0 * (double)m * (double)n * (double)k * 1e-9;
    for (int ti = 0; ti < nthreads; ti++) {
      c.threads = threads[ti];
      double t[NV][32], a[NV][32], b[NV][32];
      for (int v = 0; v < NV; v++) { /* warm-up and bits */
        step(&c, CHUNKS[v]);
        if (ti == 0) memcpy(first[v], dw, n * k * 4);
        else if (memcmp(first[v], dw, n * k * 4) != 0) {
          printf("MISMATCH: %s %s chunk %lld: %d threads differ from %d\n", sh->model, sh->name,
                 (long long)CHUNKS[v], threads[ti], threads[0]);
          bad = 1;
        }
        if (v == 0) memcpy(plain, dw, n * k * 4);
        else
          for (size_t i = 0; i < n * k; i++) /* |terms| <= 1e-3 each, M terms */
            if (fabsf(dw[i] - plain[i]) > 1e-3f * (float)m * 0x1p-20f) {
              printf("INACCURATE: %s %s chunk %lld element %zu: %g vs plain %g\n", sh->model,
                     sh->name, (long long)CHUNKS[v], i, (double)dw[i], (double)plain[i]);
              bad = 1;
              break;
            }
      }
      for (int rep = 0; rep < reps; rep++)
        for (int v = 0; v < NV; v++) t[v][rep] = time_step(&c, CHUNKS[v], &a[v][rep], &b[v][rep]);
      double med[NV], amed[NV], bmed[NV], ratio[NV][32], rnb[NV][32];
      for (int v = 0; v < NV; v++) /* the ratio within each repetition, then its median */
        for (int rep = 0; rep < reps; rep++) {
          ratio[v][rep] = t[v][rep] / t[0][rep];
          rnb[v][rep] = (t[v][rep] - b[v][rep]) / t[0][rep];
        }
      for (int v = 0; v < NV; v++) {
        qsort(t[v], (size_t)reps, sizeof t[v][0], cmp_d);
        qsort(a[v], (size_t)reps, sizeof a[v][0], cmp_d);
        qsort(b[v], (size_t)reps, sizeof b[v][0], cmp_d);
        qsort(ratio[v], (size_t)reps, sizeof ratio[v][0], cmp_d);
        qsort(rnb[v], (size_t)reps, sizeof rnb[v][0], cmp_d);
        med[v] = t[v][reps / 2];
        amed[v] = a[v][reps / 2];
        bmed[v] = b[v][reps / 2];
      }
      printf("%-10s %-8s %5zu %5zu %5zu %3d %9.2f %8.1f | %9.2f %7.2f %8.2f %6.3f %6.3f | %9.2f %7.2f "
             "%8.2f %6.3f %6.3f\n",
             sh->model, sh->name, n, k, m, c.threads, med[0] * 1e3, gfl / med[0], med[1] * 1e3,
             bmed[1] * 1e3, amed[1] * 1e3, ratio[1][reps / 2], rnb[1][reps / 2], med[2] * 1e3,
             bmed[2] * 1e3, amed[2] * 1e3, ratio[2][reps / 2], rnb[2][reps / 2]);
      fflush(stdout);
    }
    free(dy);
    free(x);
    free(dw);
    free(plain);
    for (int v = 0; v < NV; v++) free(first[v]);
  }
  return bad;
}
