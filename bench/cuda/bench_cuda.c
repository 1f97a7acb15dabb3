/*
 * bench_cuda.c — the CUDA backend against the memory system, in one run:
 *
 *   - exact L2 norm (bx_cuda_norm_async) of 1 GiB of fp32 and of bf16
 *     gradients, as one tensor and as ~1000 tensors of varied sizes, vs a
 *     plain read kernel over the same bytes (baseline.cu: 16-byte loads
 *     summed as integers — the bandwidth bound of any norm);
 *   - the whole clip (bx_cuda_clip_async with clipping active: the norm,
 *     then every gradient rewritten) vs the read kernel plus a plain
 *     in-place multiply (torch's grad.mul_(coef)), i.e. the bytes any clip
 *     must move: read, read, write;
 *   - kernel launches per call, counted from a captured CUDA graph, and
 *     the GPU and host-enqueue times for 10 vs 10000 tensors of the same
 *     total size: bitexact_cuda.h promises a constant number of launches,
 *     so both should stay flat.
 *
 * Times: CUDA events around each call on one stream, after warm-up; the
 * median of --reps runs (default 20, at least 10). Gradients are restored
 * from a copy before each timed clip, outside the events, so every run
 * clips the same data. Without a GPU it prints "no GPU: not run" and
 * exits 0.
 *
 *   bench_cuda [--quick] [--reps N] [--mib M]
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "baseline.h"
#include "bitexact.h"
#include "bitexact_cuda.h"
#include "rng.h"

#define MAX_REPS 200

static int g_reps = 20, g_warm = 3;

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

#define CK(call)                                                                          \
  do {                                                                                    \
    cudaError_t e_ = (call);                                                              \
    if (e_ != cudaSuccess) {                                                              \
      fprintf(stderr, "bench_cuda: %s:%d: %s: %s\n", __FILE__, __LINE__, #call,           \
              cudaGetErrorString(e_));                                                    \
      exit(1);                                                                            \
    }                                                                                     \
  } while (0)

#define BX(call)                                                                          \
  do {                                                                                    \
    bx_status s_ = (call);                                                                \
    if (s_ != BX_OK) {                                                                    \
      fprintf(stderr, "bench_cuda: %s:%d: %s: %s (%s)\n", __FILE__, __LINE__, #call,      \
              bx_status_str(s_), bx_last_error());                                        \
      exit(1);                                                                            \
    }                                                                                     \
  } while (0)

/* ---- what is timed ------------------------------------------------------ */
enum op_kind { OP_READ, OP_SCALE, OP_NORM, OP_CLIP };

typedef struct op {
  enum op_kind kind;
  int bf16;
  void *buf;           /* the gradients */
  const void *backup;  /* restored before each run when non-NULL */
  size_t bytes;
  unsigned long long *d_sink;
  bx_cuda_plan *plan;
  double max_norm;
  double *d_out; /* norm, coef */
  int32_t *d_status;
} op;

static void run_op(const op *o, cudaStream_t s) {
  switch (o->kind) {
    case OP_READ: CK((cudaError_t)bxb_read(o->buf, o->bytes, o->d_sink, s)); break;
    case OP_SCALE:
      if (o->bf16) CK((cudaError_t)bxb_scale_bf16(o->buf, o->bytes / 2, 0.999f, s));
      else CK((cudaError_t)bxb_scale_f32(o->buf, o->bytes / 4, 0.999f, s));
      break;
    case OP_NORM: BX(bx_cuda_norm_async(o->plan, s, o->d_out, NULL, o->d_status)); break;
    case OP_CLIP: BX(bx_cuda_clip_async(o->plan, s, o->max_norm, o->d_out, o->d_out + 1, o->d_status)); break;
  }
}

typedef struct timing {
  double gpu_ms;  /* median, CUDA events */
  double host_us; /* median host time of the enqueueing call */
} timing;

static timing time_op(const op *o, cudaStream_t s) {
  cudaEvent_t ev[2 * MAX_REPS];
  double gpu[MAX_REPS], host[MAX_REPS];
  for (int i = 0; i < 2 * g_reps; i++) CK(cudaEventCreate(&ev[i]));
  for (int i = 0; i < g_warm; i++) {
    if (o->backup) CK(cudaMemcpyAsync(o->buf, o->backup, o->bytes, cudaMemcpyDeviceToDevice, s));
    run_op(o, s);
  }
  CK(cudaStreamSynchronize(s));
  for (int i = 0; i < g_reps; i++) {
    if (o->backup) CK(cudaMemcpyAsync(o->buf, o->backup, o->bytes, cudaMemcpyDeviceToDevice, s));
    CK(cudaEventRecord(ev[2 * i], s));
    double t0 = now_s();
    run_op(o, s);
    host[i] = 1e6 * (now_s() - t0);
    CK(cudaEventRecord(ev[2 * i + 1], s));
  }
  CK(cudaStreamSynchronize(s));
  for (int i = 0; i < g_reps; i++) {
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, ev[2 * i], ev[2 * i + 1]));
    gpu[i] = ms;
  }
  for (int i = 0; i < 2 * g_reps; i++) cudaEventDestroy(ev[i]);
  timing t = {median(gpu, g_reps), median(host, g_reps)};
  return t;
}

/* ---- tensors carved out of one buffer ----------------------------------- */
typedef struct layout {
  size_t count;
  DLTensor *t;
  int64_t *n;
} layout;


/* count tensors of log-uniform sizes (multiples of 128 elements, 512-byte
 * aligned as torch's caching allocator gives) covering `elems` elements. */
static layout make_layout(void *buf, size_t elems, size_t count, int bf16, uint64_t seed) {
  layout l;
  l.count = count;
  l.t = calloc(count, sizeof *l.t);
  l.n = calloc(count, sizeof *l.n);
  double *w = calloc(count, sizeof *w), sum = 0;
  if (!l.t || !l.n || !w) exit(1);
  for (size_t i = 0; i < count; i++) sum += w[i] = exp(log(1024.0) + (double)(bx_rng_splitmix64(&seed) >> 11) * 0x1p-53 * log(4096.0));
  size_t es = bf16 ? 2 : 4, at = 0, blocks = elems / 128;
  for (size_t i = 0; i < count; i++) {
    size_t b = i + 1 == count ? blocks - at / 128 : (size_t)(w[i] / sum * (double)blocks);
    if (at / 128 + b > blocks) b = blocks - at / 128;
    l.n[i] = (int64_t)(b * 128);
    l.t[i].data = (char *)buf + at * es;
    l.t[i].device.device_type = kDLCUDA;
    cudaGetDevice(&l.t[i].device.device_id);
    l.t[i].ndim = 1;
    l.t[i].dtype.code = bf16 ? kDLBfloat : kDLFloat;
    l.t[i].dtype.bits = bf16 ? 16 : 32;
    l.t[i].dtype.lanes = 1;
    l.t[i].shape = &l.n[i];
    at += b * 128;
  }
  free(w);
  return l;
}

static void free_layout(layout *l) {
  free(l->t);
  free(l->n);
}

static bx_cuda_plan *plan_of(const layout *l) {
  bx_group g = {l->t, l->count};
  bx_cuda_plan *p = NULL;
  BX(bx_cuda_plan_create(&g, 1, NULL, NULL, &p));
  return p;
}

/* Kernel launches of one enqueued call, from a captured graph. */
static int count_nodes(const op *o, cudaStream_t s) {
  cudaGraph_t g;
  size_t n = 0;
  CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  run_op(o, s);
  CK(cudaStreamEndCapture(s, &g));
  CK(cudaGraphGetNodes(g, NULL, &n));
  cudaGraphDestroy(g);
  return (int)n;
}

static void row(const char *what, const char *dt, size_t count, double mib, double ms, double gbs,
                const char *vs, double ratio) {
  printf("%-26s %-5s %8zu %8.0f %10.3f %9.0f   %-10s %6.2f\n", what, dt, count, mib, ms, gbs, vs, ratio);
}

int main(int argc, char **argv) {
  double mib = 1024;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--quick") == 0) {
      mib = 256;
      g_reps = 10;
    } else if (strcmp(argv[i], "--reps") == 0 && i + 1 < argc) {
      g_reps = atoi(argv[++i]);
    } else if (strcmp(argv[i], "--mib") == 0 && i + 1 < argc) {
      mib = atof(argv[++i]);
    } else {
      fprintf(stderr, "usage: bench_cuda [--quick] [--reps N] [--mib M]\n");
      return 2;
    }
  }
  if (g_reps < 10) g_reps = 10;
  if (g_reps > MAX_REPS) g_reps = MAX_REPS;
  setvbuf(stdout, NULL, _IOLBF, 0);
  int ndev = 0;
  if (bx_cuda_available() != BX_OK) {
    printf("bench_cuda: no GPU: not run (%s)\n", bx_last_error());
    return 0;
  }
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev < 1) {
    printf("bench_cuda: no GPU: not run (cudaGetDeviceCount found none)\n");
    return 0;
  }
  struct cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  printf("bench_cuda: %s, %d SMs, %.0f GiB; %.0f MiB of gradients; median of %d runs after %d "
         "warm-up; GB = 1e9 bytes\n",
         prop.name, prop.multiProcessorCount, (double)prop.totalGlobalMem / (1u << 30), mib, g_reps,
         g_warm);
  size_t bytes = (size_t)(mib * 1048576.0) / 4096 * 4096;
  void *buf = NULL, *backup = NULL;
  unsigned long long *sink = NULL;
  double *d_out = NULL;
  int32_t *d_status = NULL;
  cudaStream_t s;
  CK(cudaMalloc(&buf, bytes));
  CK(cudaMalloc(&backup, bytes));
  CK(cudaMalloc((void **)&sink, 8));
  CK(cudaMalloc((void **)&d_out, 16));
  CK(cudaMalloc((void **)&d_status, 4));
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));

  printf("\n%-26s %-5s %8s %8s %10s %9s   %-10s %6s\n", "case", "dtype", "tensors", "MiB", "median ms",
         "GB/s", "vs", "ratio");
  int layouts_agree = 1;
  for (int bf16 = 0; bf16 < 2; bf16++) {
    const char *dt = bf16 ? "bf16" : "fp32";
    size_t elems = bytes / (bf16 ? 2 : 4);
    if (bf16) CK((cudaError_t)bxb_fill_bf16(buf, elems, 42, s));
    else CK((cudaError_t)bxb_fill_f32(buf, elems, 42, s));
    CK(cudaMemcpyAsync(backup, buf, bytes, cudaMemcpyDeviceToDevice, s));
    CK(cudaStreamSynchronize(s));
    op rd = {OP_READ, bf16, buf, NULL, bytes, sink, NULL, 0, NULL, NULL};
    op sc = {OP_SCALE, bf16, buf, backup, bytes, sink, NULL, 0, NULL, NULL};
    timing tr = time_op(&rd, s), ts = time_op(&sc, s);
    double gb = (double)bytes / 1e9;
    row("read kernel (baseline)", dt, 1, mib, tr.gpu_ms, gb / tr.gpu_ms * 1e3, "read", 1.0);
    row("read+write mul_ (baseline)", dt, 1, mib, ts.gpu_ms, 2 * gb / ts.gpu_ms * 1e3, "read", 2 * tr.gpu_ms / ts.gpu_ms);
    double first_norm = 0;
    static const size_t counts[2] = {1, 1000};
    for (int c = 0; c < 2; c++) {
      CK(cudaMemcpyAsync(buf, backup, bytes, cudaMemcpyDeviceToDevice, s)); /* the baselines wrote */
      layout l = make_layout(buf, elems, counts[c], bf16, 7 + (uint64_t)c);
      bx_cuda_plan *p = plan_of(&l);
      op nm = {OP_NORM, bf16, buf, NULL, bytes, sink, p, 0, d_out, d_status};
      timing tn = time_op(&nm, s);
      double norm = 0;
      CK(cudaMemcpy(&norm, d_out, 8, cudaMemcpyDeviceToHost));
      if (c == 0) first_norm = norm;
      else if (memcmp(&norm, &first_norm, 8) != 0) layouts_agree = 0;
      op cl = {OP_CLIP, bf16, buf, backup, bytes, sink, p, norm / 2, d_out, d_status};
      timing tc = time_op(&cl, s);
      row("exact L2 norm", dt, l.count, mib, tn.gpu_ms, gb / tn.gpu_ms * 1e3, "read", tr.gpu_ms / tn.gpu_ms);
      row("clip (norm + scale)", dt, l.count, mib, tc.gpu_ms, 3 * gb / tc.gpu_ms * 1e3, "read+rw",
          (tr.gpu_ms + ts.gpu_ms) / tc.gpu_ms);
      bx_cuda_plan_destroy(p);
      free_layout(&l);
      CK(cudaMemcpyAsync(buf, backup, bytes, cudaMemcpyDeviceToDevice, s));
    }
  }
  printf("\nratio: the baseline's time / this case's time (1.00 = as fast as the plain kernel(s) on "
         "the same bytes);\nclip GB/s counts 3 passes over the gradients (norm read, scale read, "
         "scale write).\nlayout check: the norm of 1 tensor and of ~1000 tensors over the same bytes "
         "%s\n", layouts_agree ? "has the same bits" : "DIFFERS (a bug)");

  /* ---- launches per call: 10 vs 10000 tensors, same bytes ----------------- */
  size_t lbytes = bytes < ((size_t)256 << 20) ? bytes : (size_t)256 << 20;
  printf("\nlaunches per call (graph nodes of one captured call) and times, fp32, %.0f MiB:\n",
         (double)lbytes / 1048576.0);
  printf("%8s %12s %12s %14s %14s %16s\n", "tensors", "norm nodes", "clip nodes", "norm GPU ms",
         "clip GPU ms", "clip enqueue us");
  CK((cudaError_t)bxb_fill_f32(buf, lbytes / 4, 43, s));
  CK(cudaMemcpyAsync(backup, buf, lbytes, cudaMemcpyDeviceToDevice, s));
  CK(cudaStreamSynchronize(s));
  int nodes[2][2];
  static const size_t lcounts[2] = {10, 10000};
  for (int c = 0; c < 2; c++) {
    layout l = make_layout(buf, lbytes / 4, lcounts[c], 0, 11);
    bx_cuda_plan *p = plan_of(&l);
    op nm = {OP_NORM, 0, buf, NULL, lbytes, sink, p, 0, d_out, d_status};
    timing tn = time_op(&nm, s);
    double norm = 0;
    CK(cudaMemcpy(&norm, d_out, 8, cudaMemcpyDeviceToHost));
    op cl = {OP_CLIP, 0, buf, backup, lbytes, sink, p, norm / 2, d_out, d_status};
    timing tc = time_op(&cl, s);
    nodes[c][0] = count_nodes(&nm, s);
    cl.backup = NULL; /* no restore inside the capture */
    nodes[c][1] = count_nodes(&cl, s);
    printf("%8zu %12d %12d %14.3f %14.3f %16.1f\n", l.count, nodes[c][0], nodes[c][1], tn.gpu_ms,
           tc.gpu_ms, tc.host_us);
    bx_cuda_plan_destroy(p);
    free_layout(&l);
    CK(cudaMemcpyAsync(buf, backup, lbytes, cudaMemcpyDeviceToDevice, s));
    CK(cudaStreamSynchronize(s));
  }
  printf("launch count %s with the tensor count\n",
         nodes[0][0] == nodes[1][0] && nodes[0][1] == nodes[1][1] ? "constant" : "NOT constant");

  /* ---- fixed cost: a norm and a clip of 4096 elements ---------------------
   * (launch latencies, the single-thread finishing kernel): what a 1 GiB
   * call pays on top of streaming its bytes */
  {
    layout l = make_layout(buf, 4096, 1, 0, 13);
    bx_cuda_plan *p = plan_of(&l);
    op nm = {OP_NORM, 0, buf, NULL, 4096 * 4, sink, p, 0, d_out, d_status};
    timing tn = time_op(&nm, s);
    double norm = 0;
    CK(cudaMemcpy(&norm, d_out, 8, cudaMemcpyDeviceToHost));
    op cl = {OP_CLIP, 0, buf, backup, 4096 * 4, sink, p, norm / 2, d_out, d_status};
    timing tc = time_op(&cl, s);
    printf("\nfixed cost (1 tensor of 4096 fp32): norm %.1f us GPU (%.1f us to enqueue), clip %.1f "
           "us GPU\n", 1e3 * tn.gpu_ms, tn.host_us, 1e3 * tc.gpu_ms);
    bx_cuda_plan_destroy(p);
    free_layout(&l);
  }
  cudaStreamDestroy(s);
  cudaFree(buf);
  cudaFree(backup);
  cudaFree(sink);
  cudaFree(d_out);
  cudaFree(d_status);
  return layouts_agree ? 0 : 1;
}
