/*
 * bench_train_gemm.c — the training GEMM on the GPU (issue 30, S4's speed
 * probe): bx_gemm on kDLCUDA tensors (src/cuda/train/gemm.cu: a 64x64 SIMT
 * tile per block, every output one fmaf chain over k ascending, no split-K,
 * no tensor cores) against bx_gemm on the host (all cores) over the same
 * shapes: the products of one step of the "34M" GLM config
 * (bench/configs/glm-34m.json, 8 x 256 tokens) and one square 4096^3.
 *
 * Times: wall clock around the blocking call (it launches and waits), after
 * warm-up, median of --reps runs (default 10); GFLOP/s = 2 m n k / time.
 * The device result is compared with the host's, bit for bit (same
 * contract, so it must be equal). Without a GPU it prints "no GPU: not run"
 * and exits 0.
 *
 *   bench_train_gemm [--reps N] [--quick]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime.h>

#include "bitexact.h"
#include "bitexact_train.h"

#define MAX_REPS 100

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static DLTensor view(void *p, int64_t *shape, DLDeviceType dev) {
  DLTensor t;
  memset(&t, 0, sizeof t);
  t.data = p;
  t.device.device_type = dev;
  t.ndim = 2;
  t.dtype.code = kDLFloat;
  t.dtype.bits = 32;
  t.dtype.lanes = 1;
  t.shape = shape;
  return t;
}

typedef struct shape {
  const char *what;
  int layout; /* BX_GEMM_NT (forward), BX_GEMM_NN (input gradient), BX_GEMM_TN (weight gradient) */
  int64_t m, n, k;
} shape;

/* median seconds of reps calls of bx_gemm on these tensors */
static double time_gemm(const DLTensor *a, const DLTensor *b, int layout, DLTensor *c, int reps,
                        bx_status *st) {
  double t[MAX_REPS];
  *st = bx_gemm(a, b, (bx_gemm_layout)layout, c, NULL); /* warm-up */
  for (int r = 0; r < reps && *st == BX_OK; r++) {
    double t0 = now_s();
    *st = bx_gemm(a, b, (bx_gemm_layout)layout, c, NULL);
    t[r] = now_s() - t0;
  }
  if (*st != BX_OK) return 0;
  qsort(t, (size_t)reps, sizeof *t, cmp_double);
  return reps % 2 ? t[reps / 2] : 0.5 * (t[reps / 2 - 1] + t[reps / 2]);
}

int main(int argc, char **argv) {
  int reps = 10, quick = 0;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--quick")) quick = 1;
    else {
      fprintf(stderr, "usage: bench_train_gemm [--reps N] [--quick]\n");
      return 2;
    }
  }
  if (reps < 3) reps = 3;
  if (reps > MAX_REPS) reps = MAX_REPS;
  if (bx_cuda_available() != BX_OK) {
    printf("bench_train_gemm: no GPU: not run (%s)\n", bx_last_error());
    return 0;
  }
  /* 34M config, T = 2048 tokens: H 512, q 8x64, kv 4x64, dense I 1536, expert I 256, V 8192 */
  static const shape shapes[] = {
      {"qkv forward [T,H]x[H,1024]^T", 0, 2048, 1024, 512},
      {"dense gate_up forward", 0, 2048, 3072, 512},
      {"dense down forward", 0, 2048, 512, 1536},
      {"expert gate_up (128 rows)", 0, 128, 512, 512},
      {"lm_head forward", 0, 2048, 8192, 512},
      {"lm_head input grad [T,V]x[V,H]", 1, 2048, 512, 8192},
      {"lm_head weight grad (one 256-token chunk)", 2, 8192, 512, 256},
      {"square 4096^3", 0, 4096, 4096, 4096},
  };
  size_t ns = sizeof shapes / sizeof shapes[0] - (quick ? 1 : 0);
  printf("bench_train_gemm: median of %d calls, wall clock around the blocking call\n", reps);
  printf("%-44s %6s %6s %6s %12s %12s %9s %s\n", "product", "M", "N", "K", "GPU GFLOP/s",
         "host GFLOP/s", "GPU/host", "bits");
  int bad = 0;
  for (size_t s = 0; s < ns; s++) {
    const shape *q = &shapes[s];
    int64_t m = q->m, n = q->n, k = q->k;
    int64_t sa[2] = {q->layout == 2 ? k : m, q->layout == 2 ? m : k};
    int64_t sb[2] = {q->layout == 0 ? n : k, q->layout == 0 ? k : n};
    int64_t sc[2] = {m, n};
    size_t na = (size_t)(m * k), nb = (size_t)(n * k), nc = (size_t)(m * n);
    float *ha = malloc(na * 4), *hb = malloc(nb * 4), *hc = malloc(nc * 4), *gc = malloc(nc * 4);
    float *da = NULL, *db = NULL, *dc = NULL;
    if (!ha || !hb || !hc || !gc || cudaMalloc((void **)&da, na * 4) != cudaSuccess ||
        cudaMalloc((void **)&db, nb * 4) != cudaSuccess || cudaMalloc((void **)&dc, nc * 4) != cudaSuccess) {
      fprintf(stderr, "bench_train_gemm: out of memory at %s\n", q->what);
      return 1;
    }
    uint64_t x = 88172645463325252ull;
    for (size_t i = 0; i < na + nb; i++) {
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      float v = (float)((int64_t)(x >> 40) - (1 << 23)) / (float)(1 << 23);
      if (i < na) ha[i] = v;
      else hb[i - na] = v;
    }
    cudaMemcpy(da, ha, na * 4, cudaMemcpyHostToDevice);
    cudaMemcpy(db, hb, nb * 4, cudaMemcpyHostToDevice);
    DLTensor ta = view(ha, sa, kDLCPU), tb = view(hb, sb, kDLCPU), tc = view(hc, sc, kDLCPU);
    DLTensor ua = view(da, sa, kDLCUDA), ub = view(db, sb, kDLCUDA), uc = view(dc, sc, kDLCUDA);
    bx_status sh, sd;
    double th = time_gemm(&ta, &tb, q->layout, &tc, reps, &sh);
    double td = time_gemm(&ua, &ub, q->layout, &uc, reps, &sd);
    const char *bits = "?";
    if (sh != BX_OK || sd != BX_OK) {
      printf("%-44s error: %s\n", q->what, bx_last_error());
      bad = 1;
    } else {
      cudaMemcpy(gc, dc, nc * 4, cudaMemcpyDeviceToHost);
      bits = memcmp(gc, hc, nc * 4) ? "DIFFER" : "equal";
      if (memcmp(gc, hc, nc * 4)) bad = 1;
      double fl = 2.0 * (double)m * (double)n * (double)k;
      printf("%-44s %6lld %6lld %6lld %12.1f %12.1f %9.2f %s\n", q->what, (long long)m,
             (long long)n, (long long)k, fl / td * 1e-9, fl / th * 1e-9, th / td, bits);
    }
    cudaFree(da), cudaFree(db), cudaFree(dc);
    free(ha), free(hb), free(hc), free(gc);
  }
  return bad;
}
