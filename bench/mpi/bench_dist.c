/*
 * bench_dist.c — the cost of going distributed.
 *
 *   mpirun -np P build/bench/mpi/bench_dist collective [reps]
 *     per-call cost of the collective step: bx_total_norm on a tiny local
 *     tensor with the MPI communicator minus the same call with comm = NULL,
 *     measured in the same run (median over reps); and the bytes sent.
 *
 *   mpirun -np P build/bench/mpi/bench_dist clip THREADS [reps]
 *     end-to-end bx_clip_grad_norm on a GPT-2-small-like parameter set
 *     (124M fp32 parameters in 148 tensors), FSDP-style: each rank owns a
 *     contiguous 1/P of every tensor; THREADS worker threads per rank.
 *     Prints the median ms per call (rank 0).
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bitexact.h"
#include "bitexact_mpi.h"

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static DLTensor tensor_1d(float *data, int64_t *shape) {
  DLTensor t;
  memset(&t, 0, sizeof t);
  t.data = data;
  t.device.device_type = kDLCPU;
  t.ndim = 1;
  t.shape = shape;
  t.dtype.code = kDLFloat;
  t.dtype.bits = 32;
  t.dtype.lanes = 1;
  return t;
}

static int collective(int rank, int size, int reps) {
  bx_comm comm = bx_comm_mpi(MPI_COMM_WORLD);
  float x[16];
  for (int i = 0; i < 16; i++) x[i] = 0.25f * (float)(i + rank);
  int64_t shape = 16;
  DLTensor t = tensor_1d(x, &shape);
  const int ngroups_list[] = {1, 2, 8};
  for (int gi = 0; gi < 3; gi++) {
    int ng = ngroups_list[gi];
    bx_group g[8];
    for (int k = 0; k < ng; k++) g[k] = (bx_group){&t, 1};
    double *with = malloc(sizeof(double) * (size_t)reps), *without = malloc(sizeof(double) * (size_t)reps);
    double v;
    bx_norm_opts o = BX_NORM_OPTS_DEFAULT;
    o.num_threads = 1;
    for (int r = 0; r < reps; r++) { /* interleaved: local-only, then with the collective */
      MPI_Barrier(MPI_COMM_WORLD);
      double t0 = now();
      bx_total_norm(g, (size_t)ng, NULL, &o, &v, NULL);
      double t1 = now();
      MPI_Barrier(MPI_COMM_WORLD);
      double t2 = now();
      if (bx_total_norm(g, (size_t)ng, &comm, &o, &v, NULL) != BX_OK) {
        fprintf(stderr, "rank %d: %s\n", rank, bx_last_error());
        return 1;
      }
      double t3 = now();
      without[r] = t1 - t0;
      with[r] = t3 - t2;
    }
    double mw = median(with, reps), mo = median(without, reps);
    if (rank == 0)
      printf("collective  P=%d groups=%d  local-only %8.2f us  with MPI %8.2f us  "
             "collective step %8.2f us  bytes: agreement %d + norm %d (= %d per group)\n",
             size, ng, mo * 1e6, mw * 1e6, (mw - mo) * 1e6, (2 * 5 + 1) * 8,
             ng * BX_ACC_WORDS * 8, BX_ACC_WORDS * 8);
    free(with);
    free(without);
  }
  return 0;
}

/* GPT-2 small: wte, wpe, 12 x (ln_1 w/b, c_attn w/b, attn c_proj w/b,
 * ln_2 w/b, c_fc w/b, mlp c_proj w/b), ln_f w/b = 148 tensors, 124.4M. */
static int gpt2_shapes(size_t *n) {
  int k = 0;
  n[k++] = 50257 * 768;
  n[k++] = 1024 * 768;
  for (int l = 0; l < 12; l++) {
    n[k++] = 768; n[k++] = 768;
    n[k++] = 768 * 2304; n[k++] = 2304;
    n[k++] = 768 * 768; n[k++] = 768;
    n[k++] = 768; n[k++] = 768;
    n[k++] = 768 * 3072; n[k++] = 3072;
    n[k++] = 3072 * 768; n[k++] = 768;
  }
  n[k++] = 768;
  n[k++] = 768;
  return k;
}

static int clip(int rank, int size, int threads, int reps) {
  size_t n[160];
  int nt = gpt2_shapes(n);
  DLTensor t[160];
  int64_t shape[160];
  size_t total = 0, mine = 0;
  for (int i = 0; i < nt; i++) {
    size_t lo = n[i] * (size_t)rank / (size_t)size, hi = n[i] * (size_t)(rank + 1) / (size_t)size;
    float *d = aligned_alloc(64, ((hi - lo) * 4 + 64) / 64 * 64);
    unsigned s = 12345u + (unsigned)i * 7919u + (unsigned)lo;
    for (size_t k = 0; k < hi - lo; k++) { /* same values whatever the split */
      s = (unsigned)(lo + k) * 2654435761u + (unsigned)i * 40503u;
      d[k] = ((float)(s >> 8) * 0x1p-24f - 0.5f) * 1e-3f;
    }
    shape[i] = (int64_t)(hi - lo);
    t[i] = tensor_1d(d, &shape[i]);
    total += n[i];
    mine += hi - lo;
  }
  bx_group g = {t, (size_t)nt};
  bx_comm comm = bx_comm_mpi(MPI_COMM_WORLD);
  bx_clip_opts co = BX_CLIP_OPTS_DEFAULT;
  co.norm.num_threads = threads;
  co.scale.num_threads = threads;
  double *ms = malloc(sizeof(double) * (size_t)reps), norm = 0, coef = 0;
  const bx_comm *cp = size > 1 ? &comm : NULL;
  if (bx_total_norm(&g, 1, cp, &co.norm, &norm, NULL) != BX_OK) return 1;
  /* max_norm just below the norm: every call really scales (coef ~ 0.999),
   * and the values stay far from the subnormal range however many reps */
  double max_norm = 0.999 * norm;
  for (int r = -1; r < reps; r++) { /* r = -1: warm-up (page faults, pool) */
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = now();
    if (bx_clip_grad_norm(&g, 1, cp, max_norm, &co, &norm, &coef) != BX_OK) {
      fprintf(stderr, "rank %d: %s\n", rank, bx_last_error());
      return 1;
    }
    double dt = now() - t0, worst;
    MPI_Allreduce(&dt, &worst, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    if (r >= 0) ms[r] = worst * 1e3;
    if (!(coef < 1.0)) {
      fprintf(stderr, "rank %d: coef %g: nothing was scaled\n", rank, coef);
      return 1;
    }
    max_norm = 0.999 * norm;
  }
  if (rank == 0)
    printf("clip  P=%d threads/rank=%d  %zu params in %d tensors (%zu per rank)  median %.2f ms  "
           "(%.2f GB/s of gradients)\n",
           size, threads, total, nt, mine, median(ms, reps),
           (double)total * 4 / (median(ms, reps) * 1e-3) / 1e9);
  free(ms);
  for (int i = 0; i < nt; i++) free(t[i].data);
  return 0;
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  int rank, size, rc = 2;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (argc > 1 && strcmp(argv[1], "collective") == 0)
    rc = collective(rank, size, argc > 2 ? atoi(argv[2]) : 200);
  else if (argc > 2 && strcmp(argv[1], "clip") == 0)
    rc = clip(rank, size, atoi(argv[2]), argc > 3 ? atoi(argv[3]) : 7);
  else if (rank == 0)
    fprintf(stderr, "usage: bench_dist collective [reps] | clip THREADS [reps]\n");
  MPI_Finalize();
  return rc;
}
