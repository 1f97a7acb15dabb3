/*
 * bench_gemm.c — bx_gemm's speed on a transformer's shapes, next to
 * torch.matmul's fp32 in the same run (--torch).
 *
 * Shapes (M tokens, K, N; NT = forward X·Wᵀ with W [N,K], NN = input
 * gradient dY·W):
 *   tiny GLM-4.5-like MoE (hidden 256, dense intermediate 512, expert
 *   intermediate 128, vocab 1024, 1024 tokens, 128 tokens per expert):
 *     attn qkv/o     NT  1024 x 256  -> 256
 *     dense gate+up  NT  1024 x 256  -> 1024
 *     dense down     NT  1024 x 512  -> 256
 *     expert gate+up NT   128 x 256  -> 256
 *     expert down    NT   128 x 128  -> 256
 *     lm head        NT  1024 x 256  -> 1024
 *     lm head dX     NN  1024 x 1024 -> 256
 *   GPT-2 small (1024 tokens, hidden 768):
 *     fc             NT  1024 x 768  -> 3072
 *     attn proj      NT  1024 x 768  -> 768
 *     fc dX          NN  1024 x 3072 -> 768
 * each with fp32 and bf16 inputs (fp32 output), 1 and 2 threads (--threads
 * LIST). A time is the median of --reps runs (default 5), each run at least
 * 20 ms of back-to-back calls after one warm-up call; GFLOP/s counts
 * 2·M·N·K. With --torch, bench/bench_gemm_torch.py (python3, next to this
 * file in the source tree, or --torch-script PATH) times torch.matmul in
 * fp32 on the same shapes and thread counts (torch.set_num_threads), and
 * the ratio bitexact / torch is printed.
 *
 *   bench_gemm [--torch] [--torch-script PATH] [--threads 1,2] [--reps R] [--quick]
 *
 * It checks that 1 and T threads give the same bits; exit status 1 if not.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bench_common.h"
#include "bitexact_train.h"
#include "kernels.h"
#include "rng.h"

typedef struct shape {
  const char *model, *name;
  bx_gemm_layout layout;
  int m, k, n;
} shape;

static const shape SHAPES[] = {
    {"glm-tiny", "attn qkv/o", BX_GEMM_NT, 1024, 256, 256},
    {"glm-tiny", "dense gate+up", BX_GEMM_NT, 1024, 256, 1024},
    {"glm-tiny", "dense down", BX_GEMM_NT, 1024, 512, 256},
    {"glm-tiny", "expert gate+up", BX_GEMM_NT, 128, 256, 256},
    {"glm-tiny", "expert down", BX_GEMM_NT, 128, 128, 256},
    {"glm-tiny", "lm head", BX_GEMM_NT, 1024, 256, 1024},
    {"glm-tiny", "lm head dX", BX_GEMM_NN, 1024, 1024, 256},
    {"gpt2-small", "fc", BX_GEMM_NT, 1024, 768, 3072},
    {"gpt2-small", "attn proj", BX_GEMM_NT, 1024, 768, 768},
    {"gpt2-small", "fc dX", BX_GEMM_NN, 1024, 3072, 768},
};
#define NSHAPES (sizeof SHAPES / sizeof SHAPES[0])
#define MAXT 8

static void make_tensor(DLTensor *t, int64_t *shp, void *data, int bf16, int64_t r, int64_t c) {
  memset(t, 0, sizeof *t);
  shp[0] = r;
  shp[1] = c;
  t->data = data;
  t->device.device_type = kDLCPU;
  t->ndim = 2;
  t->dtype.code = bf16 ? kDLBfloat : kDLFloat;
  t->dtype.bits = bf16 ? 16 : 32;
  t->dtype.lanes = 1;
  t->shape = shp;
}

static void fill(bx_rng *r, void *p, size_t n, int bf16) {
  for (size_t i = 0; i < n; i++) {
    float f = (float)(bx_rng_uniform(r) * 2 - 1);
    if (bf16) {
      uint32_t u;
      memcpy(&u, &f, 4);
      ((uint16_t *)p)[i] = (uint16_t)(u >> 16);
    } else {
      ((float *)p)[i] = f;
    }
  }
}

/* median seconds per call */
static double time_gemm(const DLTensor *a, const DLTensor *b, bx_gemm_layout l, DLTensor *c,
                        int threads, int reps) {
  bx_gemm_opts o = BX_GEMM_OPTS_DEFAULT;
  o.num_threads = threads;
  if (bx_gemm(a, b, l, c, &o) != BX_OK) {
    fprintf(stderr, "bench_gemm: bx_gemm failed: %s\n", bx_last_error());
    exit(1);
  }
  double t[32];
  for (int r = 0; r < reps; r++) {
    int calls = 0;
    double t0 = now(), t1;
    do {
      bx_gemm(a, b, l, c, &o);
      calls++;
      t1 = now();
    } while (t1 - t0 < 0.02);
    t[r] = (t1 - t0) / calls;
  }
  qsort(t, (size_t)reps, sizeof t[0], cmp_d);
  return t[reps / 2];
}

/* torch's fp32 GFLOP/s per (shape, thread count), -1 where unknown */
static double torch_gf[NSHAPES][MAXT + 1];

static int run_torch(const char *script, const int *threads, int nthreads, int reps) {
  char cmd[4096];
  int len = torch_command(cmd, sizeof cmd, script, reps, threads, nthreads);
  for (size_t s = 0; s < NSHAPES; s++)
    len += snprintf(cmd + len, sizeof cmd - (size_t)len, "%s%s:%d:%d:%d", s ? "," : "",
                    SHAPES[s].layout == BX_GEMM_NT ? "NT" : "NN", SHAPES[s].m, SHAPES[s].k, SHAPES[s].n);
  FILE *p = popen(cmd, "r");
  if (!p) return -1;
  char line[512];
  int got = 0;
  while (fgets(line, sizeof line, p)) {
    int s, t;
    double gf;
    if (sscanf(line, "torch %d %d %lf", &s, &t, &gf) == 3 && s >= 0 && s < (int)NSHAPES && t >= 1 && t <= MAXT) {
      torch_gf[s][t] = gf;
      got++;
    } else {
      fputs(line, stdout); /* the script's header (torch version, MKL) */
    }
  }
  return pclose(p) == 0 && got ? 0 : -1;
}

int main(int argc, char **argv) {
  bench_args args;
  int rc = bench_parse(&args, argc, argv, "bench_gemm", MAXT);
  if (rc) return rc;
  int *threads = args.threads, nthreads = args.nthreads, reps = args.reps;
  const char *script = args.script;
  char cpu[256];
  cpu_model(cpu, sizeof cpu);
  printf("bench_gemm: %s\nkernels: %s (GEMM micro-kernel %s %zux%zu)\n", cpu, bx_kernels_reason(),
         bx_gemm_kernel_active()->name, bx_gemm_kernel_active()->mr, bx_gemm_kernel_active()->nr);
  for (size_t s = 0; s < NSHAPES; s++)
    for (int t = 0; t <= MAXT; t++) torch_gf[s][t] = -1;
  if (args.torch) {
    char path[1024];
    if (!script) script = torch_script(path, sizeof path, argv[0], "bench_gemm_torch.py");
    if (run_torch(script, threads, nthreads, reps) != 0) {
      fprintf(stderr, "bench_gemm: %s did not give torch's times\n", script);
      return 1;
    }
  }
  printf("%-10s %-15s %-3s %5s %5s %5s %-4s %3s %9s %9s %8s %7s\n", "model", "gemm", "lay", "M", "K", "N",
         "in", "thr", "ms", "GFLOP/s", "torch32", "ratio");
  int bad = 0;
  bx_rng r;
  bx_rng_seed(&r, 12345);
  for (size_t s = 0; s < NSHAPES; s++) {
    const shape *sh = &SHAPES[s];
    size_t m = (size_t)sh->m, k = (size_t)sh->k, n = (size_t)sh->n;
    for (int bf = 0; bf < 2; bf++) {
      size_t es = bf ? 2 : 4;
      void *a = aligned_alloc(64, (m * k * es + 63) / 64 * 64), *b = aligned_alloc(64, (k * n * es + 63) / 64 * 64);
      float *c = aligned_alloc(64, (m * n * 4 + 63) / 64 * 64), *c1 = malloc(m * n * 4);
      fill(&r, a, m * k, bf);
      fill(&r, b, k * n, bf);
      DLTensor ta, tb, tc;
      int64_t sa[2], sb[2], sc[2];
      make_tensor(&ta, sa, a, bf, (int64_t)m, (int64_t)k);
      if (sh->layout == BX_GEMM_NT) make_tensor(&tb, sb, b, bf, (int64_t)n, (int64_t)k);
      else make_tensor(&tb, sb, b, bf, (int64_t)k, (int64_t)n);
      make_tensor(&tc, sc, c, 0, (int64_t)m, (int64_t)n);
      for (int ti = 0; ti < nthreads; ti++) {
        int th = threads[ti];
        double sec = time_gemm(&ta, &tb, sh->layout, &tc, th, reps);
        if (ti == 0) memcpy(c1, c, m * n * 4);
        else if (memcmp(c1, c, m * n * 4) != 0) {
          printf("MISMATCH: %s %s: %d threads differ from %d\n", sh->model, sh->name, th, threads[0]);
          bad = 1;
        }
        double gf = 2.0 * (double)m * (double)n * (double)k / sec * 1e-9;
        double tg = torch_gf[s][th];
        char tgs[16] = "-", rs[16] = "-";
        if (tg > 0) {
          snprintf(tgs, sizeof tgs, "%.1f", tg);
          snprintf(rs, sizeof rs, "%.2f", gf / tg);
        }
        printf("%-10s %-15s %-3s %5zu %5zu %5zu %-4s %3d %9.3f %9.1f %8s %7s\n", sh->model, sh->name,
               sh->layout == BX_GEMM_NT ? "NT" : "NN", m, k, n, bf ? "bf16" : "f32", th, sec * 1e3, gf, tgs, rs);
        fflush(stdout);
      }
      free(a);
      free(b);
      free(c);
      free(c1);
    }
  }
  return bad;
}
