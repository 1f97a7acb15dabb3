/*
 * bench_attention.c — bx_attention_forward / bx_attention_backward speed,
 * next to torch eager attention (transformers' eager_attention_forward
 * written out in torch, fp32, CPU) in the same run (--torch).
 *
 * Shapes (B sequences, L positions, Hq query heads, Hkv kv heads, D):
 *   glm-like   1 x 512, 8 / 2 heads, D 128
 *   tiny model 8 x 128, 4 / 2 heads, D 64
 * at 1 and 2 threads (--threads LIST). A time is the median of --reps runs
 * (default 5), each run at least 50 ms of back-to-back calls (at least one
 * call) after one warm-up call; "cpu" is the median of the process's CPU
 * time per call over the same runs (all threads: on a shared machine, the
 * time not spent waiting for a core). GFLOP/s counts the causal multiply-adds as
 * 2 flops: forward 2 products (q·kᵀ, p·v), backward 5 (q·kᵀ, dout·vᵀ,
 * dq, dk, dv), each Hq·B·L(L+1)/2·D multiply-adds. With --torch,
 * bench/bench_attention_torch.py (python3; beside this file in the source
 * tree, or --torch-script PATH) times torch's forward and forward+backward
 * on the same shapes and thread counts (torch.set_num_threads), and the
 * ratios bitexact / torch are printed (torch's backward time is its
 * forward+backward minus its forward).
 *
 *   bench_attention [--torch] [--torch-script PATH] [--threads 1,2] [--reps R] [--quick]
 *
 * It checks that every thread count gives the bits of the first; exit
 * status 1 if not.
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
#include "../tests/dl_view.h"
#include "kernels.h"
#include "rng.h"

typedef struct shape {
  const char *name;
  int B, L, Hq, Hkv, D;
} shape;

static const shape SHAPES[] = {
    {"glm-like", 1, 512, 8, 2, 128},
    {"tiny", 8, 128, 4, 2, 64},
};
#define NSHAPES (sizeof SHAPES / sizeof SHAPES[0])
#define MAXT 8

static void view(DLTensor *t, int64_t *shp, float *data, int ndim, int64_t a, int64_t b, int64_t c) {
  shp[0] = a;
  shp[1] = b;
  shp[2] = c;
  *t = bxt_f32_view(data, ndim, shp);
}

typedef struct prob {
  const shape *s;
  size_t nq, nk, nst;
  float *q, *k, *v, *dout, *o, *st, *dq, *dk, *dv;
  int64_t shq[3], shk[3], shs[3];
  DLTensor tq, tk, tv, tdo, to, tst, tdq, tdk, tdv;
} prob;

static float *falloc(size_t n) { return aligned_alloc(64, (n * 4 + 63) / 64 * 64); }

static void prob_make(prob *p, const shape *s, bx_rng *r) {
  memset(p, 0, sizeof *p);
  p->s = s;
  size_t T = (size_t)s->B * (size_t)s->L;
  p->nq = T * (size_t)(s->Hq * s->D);
  p->nk = T * (size_t)(s->Hkv * s->D);
  p->nst = T * (size_t)s->Hq * 2;
  float **bufs[9] = {&p->q, &p->k, &p->v, &p->dout, &p->o, &p->st, &p->dq, &p->dk, &p->dv};
  size_t ns[9] = {p->nq, p->nk, p->nk, p->nq, p->nq, p->nst, p->nq, p->nk, p->nk};
  for (int i = 0; i < 9; i++) {
    *bufs[i] = falloc(ns[i]);
    for (size_t e = 0; e < ns[i]; e++) (*bufs[i])[e] = i < 4 ? (float)(bx_rng_uniform(r) * 2 - 1) : 0.0f;
  }
  view(&p->tq, p->shq, p->q, 2, (int64_t)T, s->Hq * s->D, 0);
  view(&p->tk, p->shk, p->k, 2, (int64_t)T, s->Hkv * s->D, 0);
  p->tv = p->tk;
  p->tv.data = p->v;
  p->tdo = p->tq;
  p->tdo.data = p->dout;
  p->to = p->tq;
  p->to.data = p->o;
  p->tdq = p->tq;
  p->tdq.data = p->dq;
  p->tdk = p->tk;
  p->tdk.data = p->dk;
  p->tdv = p->tk;
  p->tdv.data = p->dv;
  view(&p->tst, p->shs, p->st, 3, (int64_t)T, s->Hq, 2);
}

static void prob_free(prob *p) {
  float *bufs[9] = {p->q, p->k, p->v, p->dout, p->o, p->st, p->dq, p->dk, p->dv};
  for (int i = 0; i < 9; i++) free(bufs[i]);
}

static bx_status call(prob *p, int bwd, int threads) {
  const shape *s = p->s;
  bx_attention_opts o = BX_ATTENTION_OPTS_DEFAULT;
  o.num_threads = threads;
  if (bwd)
    return bx_attention_backward(&p->tdo, &p->tq, &p->tk, &p->tv, &p->tst, s->L, s->Hq, s->Hkv, s->D,
                                 &p->tdq, &p->tdk, &p->tdv, &o);
  return bx_attention_forward(&p->tq, &p->tk, &p->tv, s->L, s->Hq, s->Hkv, s->D, &p->to, &p->tst, &o);
}

/* median seconds per call; *cpu: the median CPU seconds per call (all
 * threads: on a shared machine, the time the calls were not waiting) */
static double time_call(prob *p, int bwd, int threads, int reps, double *cpu) {
  if (call(p, bwd, threads) != BX_OK) {
    fprintf(stderr, "bench_attention: %s\n", bx_last_error());
    exit(1);
  }
  double t[32], c[32];
  for (int r = 0; r < reps; r++) {
    int calls = 0;
    double t0 = now(), c0 = process_cpu_now(), t1;
    do {
      call(p, bwd, threads);
      calls++;
      t1 = now();
    } while (t1 - t0 < 0.05);
    t[r] = (t1 - t0) / calls;
    c[r] = (process_cpu_now() - c0) / calls;
  }
  qsort(t, (size_t)reps, sizeof t[0], cmp_d);
  qsort(c, (size_t)reps, sizeof c[0], cmp_d);
  *cpu = c[reps / 2];
  return t[reps / 2];
}

/* torch's seconds per (shape, threads): [0] forward, [1] forward+backward; -1 unknown */
static double torch_s[NSHAPES][MAXT + 1][2];

static int run_torch(const char *script, const int *threads, int nthreads, int reps) {
  char cmd[4096];
  int len = torch_command(cmd, sizeof cmd, script, reps, threads, nthreads);
  for (size_t s = 0; s < NSHAPES; s++)
    len += snprintf(cmd + len, sizeof cmd - (size_t)len, "%s%d:%d:%d:%d:%d", s ? "," : "", SHAPES[s].B,
                    SHAPES[s].L, SHAPES[s].Hq, SHAPES[s].Hkv, SHAPES[s].D);
  FILE *p = popen(cmd, "r");
  if (!p) return -1;
  char line[512];
  int got = 0;
  while (fgets(line, sizeof line, p)) {
    int s, t;
    double f, fb;
    if (sscanf(line, "torch %d %d %lf %lf", &s, &t, &f, &fb) == 4 && s >= 0 && s < (int)NSHAPES &&
        t >= 1 && t <= MAXT) {
      torch_s[s][t][0] = f;
      torch_s[s][t][1] = fb;
      got++;
    } else {
      fputs(line, stdout); /* the script's header */
    }
  }
  return pclose(p) == 0 && got ? 0 : -1;
}

static void fmt(char *buf, size_t n, double v, const char *f) {
  if (v > 0) snprintf(buf, n, f, v);
  else snprintf(buf, n, "-");
}

int main(int argc, char **argv) {
  bench_args args;
  int rc = bench_parse(&args, argc, argv, "bench_attention", MAXT);
  if (rc) return rc;
  int *threads = args.threads, nthreads = args.nthreads, reps = args.reps;
  const char *script = args.script;
  char cpu[256];
  cpu_model(cpu, sizeof cpu);
  printf("bench_attention: %s\nkernels: %s (GEMM micro-kernel %s %zux%zu)\n", cpu, bx_kernels_reason(),
         bx_gemm_kernel_active()->name, bx_gemm_kernel_active()->mr, bx_gemm_kernel_active()->nr);
  for (size_t s = 0; s < NSHAPES; s++)
    for (int t = 0; t <= MAXT; t++) torch_s[s][t][0] = torch_s[s][t][1] = -1;
  if (args.torch) {
    char path[1024];
    if (!script) script = torch_script(path, sizeof path, argv[0], "bench_attention_torch.py");
    if (run_torch(script, threads, nthreads, reps) != 0) {
      fprintf(stderr, "bench_attention: %s did not give torch's times\n", script);
      return 1;
    }
  }
  printf("%-9s %2s %4s %3s %3s %4s %3s | %9s %7s %9s %7s %9s %9s | %9s %9s %7s %7s\n", "shape", "B", "L",
         "Hq", "Hkv", "D", "thr", "fwd ms", "GF/s", "bwd ms", "GF/s", "fwd cpu", "bwd cpu", "torch fwd",
         "torch bwd", "fwd x", "bwd x");
  int bad = 0;
  bx_rng r;
  bx_rng_seed(&r, 12345);
  for (size_t s = 0; s < NSHAPES; s++) {
    const shape *sh = &SHAPES[s];
    prob p;
    prob_make(&p, sh, &r);
    float *ref[5] = {NULL};
    const float *outs[5] = {p.o, p.st, p.dq, p.dk, p.dv};
    size_t ns[5] = {p.nq, p.nst, p.nq, p.nk, p.nk};
    double macs = (double)sh->Hq * sh->B * sh->L * (sh->L + 1) / 2.0 * sh->D;
    for (int ti = 0; ti < nthreads; ti++) {
      int th = threads[ti];
      double cf, cb, tf = time_call(&p, 0, th, reps, &cf), tb = time_call(&p, 1, th, reps, &cb);
      for (int o = 0; o < 5; o++) {
        if (ti == 0) {
          ref[o] = malloc(ns[o] * 4);
          memcpy(ref[o], outs[o], ns[o] * 4);
        } else if (memcmp(ref[o], outs[o], ns[o] * 4) != 0) {
          printf("MISMATCH: %s: output %d with %d threads differs from %d threads\n", sh->name, o, th,
                 threads[0]);
          bad = 1;
        }
      }
      double tof = torch_s[s][th][0], tofb = torch_s[s][th][1];
      double tob = tofb > 0 && tof > 0 ? tofb - tof : -1;
      char a[16], b[16], c[16], d[16];
      fmt(a, sizeof a, tof * 1e3, "%.3f");
      fmt(b, sizeof b, tob * 1e3, "%.3f");
      fmt(c, sizeof c, tof > 0 ? tf / tof : -1, "%.2f");
      fmt(d, sizeof d, tob > 0 ? tb / tob : -1, "%.2f");
      printf("%-9s %2d %4d %3d %3d %4d %3d | %9.3f %7.1f %9.3f %7.1f %9.3f %9.3f | %9s %9s %7s %7s\n",
             sh->name, sh->B, sh->L, sh->Hq, sh->Hkv, sh->D, th, tf * 1e3, 4 * macs / tf * 1e-9, tb * 1e3,
             10 * macs / tb * 1e-9, cf * 1e3, cb * 1e3, a, b, c, d);
      fflush(stdout);
    }
    for (int o = 0; o < 5; o++) free(ref[o]);
    prob_free(&p);
  }
  return bad;
}
