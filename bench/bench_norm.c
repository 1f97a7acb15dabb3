/*
 * bench_norm.c — how fast is the exact norm, next to what the hardware and
 * the naive loops manage on the same data, in the same run?
 *
 * For each N (default 2^20, 2^24, 2^26) and each data set
 *   f32 gauss    N(0, 1e-3^2): gradient-like
 *   f32 spiky    0.1% of N(0, 1e3^2) among N(0, 1e-8^2): few huge, many tiny
 *   f32 wide40   exponents uniform over 40 binades (2^-30 .. 2^10)
 *   f32 wideall  exponents uniform over the whole finite fp32 range,
 *                subnormals included
 *   bf16 gauss, f16 gauss, f64 gauss   gradient-like in the other dtypes
 *   f64 wideall  exponents uniform over the fp64 range up to 2^1008
 *                (subnormals included; the norm stays finite)
 * it times, interleaved (every method once per repetition, repetitions
 * repeated, the median kept):
 *   read ceiling     the integer sum of every 64-bit word (AVX-512 if the CPU
 *                    has it): the fastest any pass over the data can go;
 *   naive fp32       SIMD sum of squares with fp32 accumulators;
 *   naive fp64-acc   the same widened to fp64 accumulators;
 *   bitexact         bx_total_norm with 1 and T threads (default T = 2), and
 *                    with 1 thread per ISA forced with bx_force_isa;
 * and, on separate copies of the gradient-like fp32 and bf16 data, bx_scale
 * (torch and exact-once modes) against a plain read-modify-write loop.
 * Data are allocated once per N, first touched by the benchmark's own T
 * threads, and every method is warmed up once before timing.
 *
 * Many groups: bx_total_norm over 10,000 per-tensor groups of 100 fp32
 * elements (1 M elements, per-group norms asked for) with 1, 2, 4 and 16
 * library threads: time per call, and the peak memory the calls add (the
 * growth of ru_maxrss from before the first call, each thread count in a
 * fresh process). The norms must be bitwise identical for every count.
 *
 * The header names the CPU (its model string), the kernel table the
 * library chose for it and why (bx_kernels_reason).
 *
 * It checks as it goes that every bitexact call on a data set returns the
 * same bits (whatever the threads or ISA) and that the norm agrees with the
 * fp64-accumulated one to 1e-6; it exits non-zero otherwise.
 *
 *   bench_norm [--quick] [--sizes 20,24,26] [--reps R] [--threads T]
 *              [--no-forced] [--no-groups] [--only S] [--json FILE]
 *
 * --only S: only the data sets whose name contains S (e.g. "bf16").
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <bitexact.h>

#include "baselines.h"
#include "bench_util.h"
#include "kernels.h" /* bx_force_isa, bx_kernels_reason: benchmark hooks */
#include "rng.h"

#define MAX_REPS 101
#define MAX_SIZES 8
#define MAX_RUNS 16
#define MAX_RECORDS 1024

static volatile uint64_t sink; /* keeps every baseline's result alive */

/* ------------------------------------------------------------ data sets */
typedef enum gen_kind { GEN_GAUSS, GEN_SPIKY, GEN_WIDE40, GEN_WIDEALL } gen_kind;

typedef struct dataset {
  const char *name;
  bench_dtype dt;
  gen_kind gen;
  int is_scale; /* a copy for the bx_scale races */
  void *data;
  size_t bytes;
} dataset;

static dataset sets[] = {
    {"f32 gauss", BT_F32, GEN_GAUSS, 0, NULL, 0},
    {"f32 spiky", BT_F32, GEN_SPIKY, 0, NULL, 0},
    {"f32 wide40", BT_F32, GEN_WIDE40, 0, NULL, 0},
    {"f32 wideall", BT_F32, GEN_WIDEALL, 0, NULL, 0},
    {"bf16 gauss", BT_BF16, GEN_GAUSS, 0, NULL, 0},
    {"f16 gauss", BT_F16, GEN_GAUSS, 0, NULL, 0},
    {"f64 gauss", BT_F64, GEN_GAUSS, 0, NULL, 0},
    {"f64 wideall", BT_F64, GEN_WIDEALL, 0, NULL, 0},
    {"f32 scale", BT_F32, GEN_GAUSS, 1, NULL, 0},
    {"bf16 scale", BT_BF16, GEN_GAUSS, 1, NULL, 0},
};
#define NSETS (sizeof sets / sizeof sets[0])

/* One element of data set d, as the bits of its dtype. */
static void generate_one(const dataset *d, bx_rng *r, void *out, size_t i) {
  double v;
  uint32_t b;
  uint64_t b64;
  switch (d->gen) {
    case GEN_SPIKY:
      v = bx_rng_uniform(r) < 1e-3 ? 1e3 * bx_rng_normal(r) : 1e-8 * bx_rng_normal(r);
      break;
    case GEN_WIDE40: /* sign | exponent -30..9 | random significand */
      b = (uint32_t)bx_rng_next(r);
      b = (b & 0x807FFFFFu) | ((uint32_t)(127 - 30 + (int)bx_rng_below(r, 40)) << 23);
      memcpy((float *)out + i, &b, 4);
      return;
    case GEN_WIDEALL: /* biased exponent 0..max finite: subnormals to the largest */
      if (d->dt == BT_F64) { /* up to 2^1008: the norm of 2^30 stays finite */
        b64 = bx_rng_next(r);
        b64 = (b64 & 0x800FFFFFFFFFFFFFull) | (bx_rng_below(r, 2031) << 52);
        memcpy((double *)out + i, &b64, 8);
        return;
      }
      b = (uint32_t)bx_rng_next(r);
      b = (b & 0x807FFFFFu) | ((uint32_t)bx_rng_below(r, 255) << 23);
      memcpy((float *)out + i, &b, 4);
      return;
    default:
      v = 1e-3 * bx_rng_normal(r);
  }
  switch (d->dt) {
    case BT_F64: ((double *)out)[i] = v; break;
    case BT_F32: ((float *)out)[i] = (float)v; break;
    case BT_BF16: ((uint16_t *)out)[i] = float_to_bf16_bits((float)v); break;
    case BT_F16: ((uint16_t *)out)[i] = float_to_f16_bits((float)v); break;
  }
}

typedef struct gen_job {
  dataset *d;
  size_t n;
  uint64_t seed;
} gen_job;

/* Blocks of 4096 elements, each from its own seed, shared among the threads
 * by whole blocks: the values do not depend on which thread made them. */
static void generate_task(void *ctx, int tid, int nthr) {
  gen_job *g = (gen_job *)ctx;
  size_t blocks = (g->n + 4095) / 4096;
  size_t b_lo = blocks * (size_t)tid / (size_t)nthr;
  size_t b_hi = blocks * (size_t)(tid + 1) / (size_t)nthr;
  for (size_t b = b_lo; b < b_hi; b++) {
    bx_rng r;
    bx_rng_seed(&r, bx_rng_hash64(g->seed, b));
    size_t end = (b + 1) * 4096 < g->n ? (b + 1) * 4096 : g->n;
    for (size_t i = b * 4096; i < end; i++) generate_one(g->d, &r, g->d->data, i);
  }
}

static int alloc_set(dataset *d, size_t n, int nthreads, uint64_t seed) {
  size_t align = (size_t)2 << 20;
  d->bytes = n * bench_dtype_size(d->dt);
  size_t padded = (d->bytes + align - 1) / align * align;
  if (posix_memalign(&d->data, align, padded) != 0) return -1;
#ifdef MADV_HUGEPAGE
  madvise(d->data, padded, MADV_HUGEPAGE);
#endif
  gen_job g = {d, n, seed};
  pool_run(generate_task, &g, nthreads); /* first touch by these threads */
  return 0;
}

/* ---------------------------------------------------------- the methods */
typedef enum method_kind { M_READ, M_NAIVE32, M_NAIVE64, M_BX, M_RMW, M_BXSCALE } method_kind;

typedef struct run {
  method_kind kind;
  int threads;
  const char *isa;    /* M_BX: forced ISA name, NULL = automatic choice */
  bx_scale_mode mode; /* M_BXSCALE */
  char label[48];
  double t[MAX_REPS]; /* seconds per pass, one per repetition */
} run;

typedef struct env {
  read_fn read;
  const char *read_isa;
  int simd; /* naive and RMW loops in AVX-512 */
  int threads;
  int forced_ok[4];
  int failures;
} env;

static const char *isa_names[4] = {"portable", "avx2", "avx512", "avx512-pf1"};

typedef struct base_job {
  const void *data;
  size_t n;
  bench_dtype dt;
  read_fn read;
  sumsq_fn sumsq;
  scale_fn scale;
  float coef;
  double part[MAX_THREADS * 8]; /* one slot per thread, 64 bytes apart */
} base_job;

static void base_task_read(void *ctx, int tid, int nthr) {
  base_job *j = (base_job *)ctx;
  size_t lo, hi, es = bench_dtype_size(j->dt);
  share(j->n, tid, nthr, &lo, &hi);
  j->part[tid * 8] = (double)j->read((const char *)j->data + lo * es, (hi - lo) * es);
}

static void base_task_sumsq(void *ctx, int tid, int nthr) {
  base_job *j = (base_job *)ctx;
  size_t lo, hi, es = bench_dtype_size(j->dt);
  share(j->n, tid, nthr, &lo, &hi);
  j->part[tid * 8] = j->sumsq((const char *)j->data + lo * es, hi - lo);
}

static void base_task_scale(void *ctx, int tid, int nthr) {
  base_job *j = (base_job *)ctx;
  size_t lo, hi, es = bench_dtype_size(j->dt);
  share(j->n, tid, nthr, &lo, &hi);
  j->scale((char *)j->data + lo * es, hi - lo, j->coef);
}

static void noop_task(void *ctx, int tid, int nthr) {
  (void)ctx, (void)tid, (void)nthr;
}

static DLTensor tensor_of(dataset *d, int64_t *shape) {
  DLTensor t;
  memset(&t, 0, sizeof t);
  t.data = d->data;
  t.device.device_type = kDLCPU;
  t.ndim = 1;
  t.shape = shape;
  t.dtype.lanes = 1;
  t.dtype.code = d->dt == BT_BF16 ? kDLBfloat : kDLFloat;
  t.dtype.bits = (uint8_t)(8 * bench_dtype_size(d->dt));
  return t;
}

static uint64_t bits64(double v) {
  uint64_t b;
  memcpy(&b, &v, 8);
  return b;
}

/* Per data set, the bits every bitexact call must reproduce. */
typedef struct check {
  int have;
  uint64_t bits;
  double naive64;
} check;

/* Seconds per pass of r over d (n elements), averaged over iters passes. */
static double time_run(env *e, run *r, dataset *d, size_t n, int iters,
                       check *ck) {
  static base_job job;
  int64_t shape = (int64_t)n;
  DLTensor t = tensor_of(d, &shape);
  bx_group group = {&t, 1};
  double t0 = 0, t1 = 0;
  bx_status st = BX_OK;

  memset(&job, 0, sizeof job);
  job.data = d->data;
  job.n = n;
  job.dt = d->dt;
  job.read = e->read;
  if (r->kind == M_NAIVE32) job.sumsq = pick_naive32(d->dt, e->simd);
  if (r->kind == M_NAIVE64) job.sumsq = pick_naive64(d->dt, e->simd);
  if (r->kind == M_RMW) job.scale = pick_rmw(d->dt, e->simd);
  if (r->kind == M_BX && r->isa && bx_force_isa(r->isa) != BX_OK) {
    fprintf(stderr, "bench_norm: cannot force ISA %s\n", r->isa);
    e->failures++;
    return NAN;
  }

  int baseline = r->kind == M_READ || r->kind == M_NAIVE32 ||
                 r->kind == M_NAIVE64 || r->kind == M_RMW;
  if (baseline && r->threads > 1) { /* workers awake and spinning */
    pool_spin(1);
    pool_run(noop_task, NULL, r->threads);
  }
  t0 = now();
  for (int it = 0; it < iters; it++) {
    /* alternate over all scale passes, so the data keep their scale */
    static unsigned scale_passes;
    double coef = (scale_passes++ & 1) ? 1.0 / 0.7 : 0.7;
    switch (r->kind) {
      case M_READ:
        pool_run(base_task_read, &job, r->threads);
        break;
      case M_NAIVE32:
      case M_NAIVE64:
        pool_run(base_task_sumsq, &job, r->threads);
        break;
      case M_RMW:
        job.coef = (float)coef;
        pool_run(base_task_scale, &job, r->threads);
        break;
      case M_BX: {
        bx_norm_opts opts = BX_NORM_OPTS_DEFAULT;
        double norm = NAN;
        opts.num_threads = r->threads;
        st = bx_total_norm(&group, 1, NULL, &opts, &norm, NULL);
        if (st == BX_OK && !ck->have) {
          ck->have = 1;
          ck->bits = bits64(norm);
        } else if (st == BX_OK && bits64(norm) != ck->bits) {
          fprintf(stderr, "bench_norm: %s, %s: norm bits 0x%016llx != 0x%016llx\n",
                  d->name, r->label, (unsigned long long)bits64(norm),
                  (unsigned long long)ck->bits);
          e->failures++;
        }
        break;
      }
      case M_BXSCALE: {
        bx_scale_opts opts = BX_SCALE_OPTS_DEFAULT;
        opts.mode = r->mode;
        opts.num_threads = r->threads;
        st = bx_scale(&t, 1, coef, &opts);
        break;
      }
    }
    if (st != BX_OK) break;
  }
  t1 = now();
  if (baseline && r->threads > 1) pool_spin(0);
  for (int k = 0; k < r->threads; k++) sink += bits64(job.part[k * 8]);
  if (r->kind == M_NAIVE64 && r->threads == 1) {
    double sum = 0;
    for (int k = 0; k < r->threads; k++) sum += job.part[k * 8];
    ck->naive64 = sqrt(sum);
  }
  if (r->kind == M_BX && r->isa) bx_force_isa(NULL);
  if (st != BX_OK) {
    fprintf(stderr, "bench_norm: %s, %s: %s: %s\n", d->name, r->label,
            bx_status_str(st), bx_last_error());
    e->failures++;
    return NAN;
  }
  return (t1 - t0) / iters;
}

/* The runs raced on one data set. */
static int plan_runs(const env *e, const dataset *d, run *runs) {
  int k = 0, tlist[2] = {1, e->threads};
  for (int ti = 0; ti < (e->threads > 1 ? 2 : 1); ti++) {
    int th = tlist[ti];
    if (d->is_scale) {
      runs[k++] = (run){M_RMW, th, NULL, BX_SCALE_TORCH, "", {0}};
      snprintf(runs[k - 1].label, 48, "plain RMW x*=c (%s)", e->simd ? "avx512" : "scalar");
      runs[k++] = (run){M_BXSCALE, th, NULL, BX_SCALE_TORCH, "bx_scale torch", {0}};
      runs[k++] = (run){M_BXSCALE, th, NULL, BX_SCALE_EXACT, "bx_scale exact-once", {0}};
      continue;
    }
    runs[k++] = (run){M_READ, th, NULL, BX_SCALE_TORCH, "", {0}};
    snprintf(runs[k - 1].label, 48, "read ceiling (%s)", e->read_isa);
    if (d->dt != BT_F64) {
      runs[k++] = (run){M_NAIVE32, th, NULL, BX_SCALE_TORCH, "", {0}};
      snprintf(runs[k - 1].label, 48, "naive fp32 sumsq (%s)", e->simd ? "avx512" : "scalar");
    }
    runs[k++] = (run){M_NAIVE64, th, NULL, BX_SCALE_TORCH, "", {0}};
    snprintf(runs[k - 1].label, 48, "naive fp64-acc sumsq (%s)", e->simd ? "avx512" : "scalar");
    runs[k++] = (run){M_BX, th, NULL, BX_SCALE_TORCH, "", {0}};
    snprintf(runs[k - 1].label, 48, "bitexact (auto: %s)", bx_isa_name());
  }
  if (!d->is_scale)
    for (int i = 0; i < 4; i++)
      if (e->forced_ok[i]) {
        runs[k++] = (run){M_BX, 1, isa_names[i], BX_SCALE_TORCH, "", {0}};
        snprintf(runs[k - 1].label, 48, "bitexact forced %s", isa_names[i]);
      }
  return k;
}

/* ------------------------------------------------------------ reporting */
typedef struct record {
  int log2n;
  const char *set;
  char label[48];
  method_kind kind;
  int threads;
  const char *isa;
  bx_scale_mode mode;
  double seconds, ns_per_elem, gbps, vs_read, vs_naive;
} record;

static record records[MAX_RECORDS];
static int nrecords;

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double median(const double *t, int n) {
  double s[MAX_REPS];
  memcpy(s, t, (size_t)n * sizeof *t);
  qsort(s, (size_t)n, sizeof *s, cmp_double);
  return n % 2 ? s[n / 2] : 0.5 * (s[n / 2 - 1] + s[n / 2]);
}

/* median time of the first run of `kind` with `threads` threads, or NAN */
static double find_time(const run *runs, const double *med, int nruns,
                        method_kind kind, int threads) {
  for (int i = 0; i < nruns; i++)
    if (runs[i].kind == kind && runs[i].threads == threads && !runs[i].isa)
      return med[i];
  return NAN;
}

static void report_set(int log2n, size_t n, const dataset *d, const run *runs,
                       int nruns, int reps) {
  double med[MAX_RUNS];
  for (int i = 0; i < nruns; i++) med[i] = median(runs[i].t, reps);
  for (int i = 0; i < nruns; i++) {
    const run *r = &runs[i];
    double t = med[i];
    double tread = find_time(runs, med, nruns, M_READ, r->threads);
    double tnaive = d->is_scale ? find_time(runs, med, nruns, M_RMW, r->threads)
                    : d->dt == BT_F64 ? find_time(runs, med, nruns, M_NAIVE64, r->threads)
                                      : find_time(runs, med, nruns, M_NAIVE32, r->threads);
    record *rec = &records[nrecords < MAX_RECORDS ? nrecords++ : MAX_RECORDS - 1];
    *rec = (record){log2n, d->name, "", r->kind, r->threads, r->isa, r->mode,
                    t, 1e9 * t / (double)n, (double)d->bytes / t / 1e9,
                    tread / t, tnaive / t};
    memcpy(rec->label, r->label, sizeof rec->label);
    char vs_read[16] = "", vs_naive[16] = "";
    if (!isnan(rec->vs_read)) snprintf(vs_read, sizeof vs_read, "%6.1f%%", 100 * rec->vs_read);
    if (!isnan(rec->vs_naive)) snprintf(vs_naive, sizeof vs_naive, "%6.2fx", rec->vs_naive);
    printf("%-12s %-30s %3d %9.4f %8.2f %8s %9s\n", i == 0 ? d->name : "",
           r->label, r->threads, rec->ns_per_elem, rec->gbps, vs_read, vs_naive);
  }
}

static const record *find_record(int log2n, const char *set, method_kind kind,
                                 int threads, const char *isa, bx_scale_mode mode) {
  for (int i = 0; i < nrecords; i++) {
    const record *r = &records[i];
    if (r->log2n == log2n && !strcmp(r->set, set) && r->kind == kind &&
        r->threads == threads && r->mode == mode &&
        ((!isa && !r->isa) || (isa && r->isa && !strcmp(isa, r->isa))))
      return r;
  }
  return NULL;
}

static void target_line(const char *what, const record *r, double value,
                        double goal, int at_least, const char *unit) {
  if (!r) {
    printf("  %-58s %12s\n", what, "not measured");
    return;
  }
  int ok = at_least ? value >= goal : value <= goal;
  if (!strcmp(unit, "%")) value *= 100, goal *= 100;
  printf("  %-58s %8.2f %-5s (target %s %g)  %s\n", what, value, unit,
         at_least ? ">=" : "<=", goal, ok ? "PASS" : "MISS");
}

static void report_targets(int log2n, int threads) {
  char what[96];
  const record *r;
  printf("\nTargets at N = 2^%d, %d threads (1-thread figures above):\n", log2n, threads);
  r = find_record(log2n, "f32 gauss", M_BX, threads, NULL, BX_SCALE_TORCH);
  snprintf(what, sizeof what, "f32 gauss: share of the read ceiling");
  target_line(what, r, r ? r->vs_read : 0, 0.95, 1, "%");
  snprintf(what, sizeof what, "f32 gauss: time / naive fp32 loop's time");
  target_line(what, r, r ? 1 / r->vs_naive : 0, 1.05, 0, "x");
  const char *sets90[3] = {"f16 gauss", "bf16 gauss", "f64 gauss"};
  for (int i = 0; i < 3; i++) {
    r = find_record(log2n, sets90[i], M_BX, threads, NULL, BX_SCALE_TORCH);
    snprintf(what, sizeof what, "%s: share of the read ceiling", sets90[i]);
    target_line(what, r, r ? r->vs_read : 0, 0.90, 1, "%");
  }
  r = find_record(log2n, "f32 wideall", M_BX, threads, NULL, BX_SCALE_TORCH);
  target_line("f32 wideall: share of the read ceiling", r, r ? r->vs_read : 0, 0.50, 1, "%");
  const char *sc[2] = {"f32 scale", "bf16 scale"};
  for (int i = 0; i < 2; i++) {
    r = find_record(log2n, sc[i], M_BXSCALE, threads, NULL, BX_SCALE_TORCH);
    snprintf(what, sizeof what, "bx_scale torch, %s: vs plain RMW", sc[i]);
    target_line(what, r, r ? r->vs_naive : 0, 0.85, 1, "%");
  }
}

/* ---------------------------------------------------------- many groups
 * Each thread count runs in a fresh process (this program, re-executed
 * with --groups-child T REPS), so the peak memory it reports is that of
 * the calls alone, and no library thread pool crosses a fork. */
#define GROUPS_N 10000
#define GROUPS_EACH 100

static int groups_child(int threads, int reps) {
  size_t n = (size_t)GROUPS_N * GROUPS_EACH;
  float *data = malloc(n * sizeof *data);
  DLTensor *ts = calloc(GROUPS_N, sizeof *ts);
  int64_t *shapes = calloc(GROUPS_N, sizeof *shapes);
  bx_group *gs = calloc(GROUPS_N, sizeof *gs);
  double *gnorms = calloc(GROUPS_N, sizeof *gnorms);
  double t[MAX_REPS], first = 0, norm = NAN;
  if (!data || !ts || !shapes || !gs || !gnorms || reps < 1 || reps > MAX_REPS) return 1;
  bx_rng r;
  bx_rng_seed(&r, 12345);
  for (size_t i = 0; i < n; i++) data[i] = (float)(1e-3 * bx_rng_normal(&r));
  for (int g = 0; g < GROUPS_N; g++) {
    shapes[g] = GROUPS_EACH;
    ts[g].data = data + (size_t)g * GROUPS_EACH;
    ts[g].device.device_type = kDLCPU;
    ts[g].ndim = 1;
    ts[g].shape = &shapes[g];
    ts[g].dtype.code = kDLFloat;
    ts[g].dtype.bits = 32;
    ts[g].dtype.lanes = 1;
    gs[g].tensors = &ts[g];
    gs[g].count = 1;
  }
  struct rusage ru0, ru1;
  getrusage(RUSAGE_SELF, &ru0);
  bx_norm_opts opts = BX_NORM_OPTS_DEFAULT;
  opts.num_threads = threads;
  uint64_t hash = 0;
  for (int k = -1; k < reps; k++) {
    double t0 = now();
    bx_status st = bx_total_norm(gs, GROUPS_N, NULL, &opts, &norm, gnorms);
    double dt = now() - t0;
    if (st != BX_OK) {
      fprintf(stderr, "bench_norm: many groups, %d threads: %s: %s\n", threads, bx_status_str(st),
              bx_last_error());
      return 1;
    }
    if (k < 0) first = dt;
    else t[k] = dt;
  }
  getrusage(RUSAGE_SELF, &ru1);
  for (int g = 0; g < GROUPS_N; g++) hash = (hash ^ bits64(gnorms[g])) * 0x100000001B3ull;
  printf("%d %.9e %.9e %ld %ld %016llx %016llx\n", threads, first, median(t, reps), ru0.ru_maxrss,
         ru1.ru_maxrss, (unsigned long long)bits64(norm), (unsigned long long)hash);
  return 0;
}

static int many_groups(int reps) {
  static const int counts[4] = {1, 2, 4, 16};
  unsigned long long norm0 = 0, hash0 = 0;
  int failures = 0;
  printf("\n== many groups: %d per-tensor groups of %d fp32 elements (%d elements), per-group "
         "norms, median of %d calls ==\n", GROUPS_N, GROUPS_EACH, GROUPS_N * GROUPS_EACH, reps);
  printf("%8s %14s %14s %12s %16s\n", "threads", "first call ms", "per call ms", "ns/elem",
         "peak added KiB");
  char self[512];
  ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
  if (len <= 0 || memchr(self, '\'', (size_t)len)) {
    fprintf(stderr, "bench_norm: many groups: cannot find this program's path\n");
    return 1;
  }
  self[len] = 0;
  for (int i = 0; i < 4; i++) {
    char cmd[600];
    snprintf(cmd, sizeof cmd, "'%s' --groups-child %d %d", self, counts[i], reps);
    FILE *p = popen(cmd, "r");
    int th = 0;
    double first = 0, per = 0;
    long rss0 = 0, rss1 = 0;
    unsigned long long norm = 0, hash = 0;
    if (!p || fscanf(p, "%d %lf %lf %ld %ld %llx %llx", &th, &first, &per, &rss0, &rss1, &norm, &hash) != 7) {
      fprintf(stderr, "bench_norm: many groups, %d threads: no result\n", counts[i]);
      if (p) pclose(p);
      failures++;
      continue;
    }
    pclose(p);
    printf("%8d %14.3f %14.3f %12.3f %16ld\n", th, 1e3 * first, 1e3 * per,
           1e9 * per / (GROUPS_N * GROUPS_EACH), rss1 - rss0);
    if (i == 0) norm0 = norm, hash0 = hash;
    else if (norm != norm0 || hash != hash0) {
      fprintf(stderr, "bench_norm: many groups, %d threads: norms differ from 1 thread\n", counts[i]);
      failures++;
    }
  }
  return failures;
}

static void write_json(const char *path, int reps, const env *e) {
  FILE *f = fopen(path, "w");
  if (!f) {
    perror(path);
    return;
  }
  fprintf(f, "{\"library_version\": %u, \"auto_isa\": \"%s\", \"auto_reason\": \"%s\", "
             "\"reps\": %d, \"threads\": %d, \"read_isa\": \"%s\",\n \"results\": [\n",
          bx_version(), bx_isa_name(), bx_kernels_reason(), reps, e->threads, e->read_isa);
  for (int i = 0; i < nrecords; i++) {
    const record *r = &records[i];
    const char *kinds[] = {"read", "naive_fp32", "naive_fp64acc", "bitexact", "rmw", "bx_scale"};
    fprintf(f, "  {\"n\": %lld, \"log2n\": %d, \"data\": \"%s\", \"method\": \"%s\", "
               "\"label\": \"%s\", \"threads\": %d, \"isa\": \"%s\", "
               "\"median_s\": %.6e, \"ns_per_elem\": %.5f, \"gbps\": %.3f",
            1LL << r->log2n, r->log2n, r->set, kinds[r->kind], r->label,
            r->threads, r->isa ? r->isa : "auto", r->seconds, r->ns_per_elem, r->gbps);
    if (!isnan(r->vs_read)) fprintf(f, ", \"vs_read\": %.4f", r->vs_read);
    if (!isnan(r->vs_naive)) fprintf(f, ", \"vs_naive\": %.4f", r->vs_naive);
    fprintf(f, "}%s\n", i + 1 < nrecords ? "," : "");
  }
  fprintf(f, "]}\n");
  fclose(f);
}

/* ------------------------------------------------------------------ main */
static void usage(FILE *f) {
  fprintf(f,
          "usage: bench_norm [--quick] [--sizes 20,24,26] [--reps R] "
          "[--threads T] [--no-forced] [--no-groups] [--only S] [--json FILE]\n");
}

static void cpu_model(char *buf, size_t len) {
  FILE *f = fopen("/proc/cpuinfo", "r");
  char line[256];
  snprintf(buf, len, "unknown CPU");
  while (f && fgets(line, sizeof line, f))
    if (!strncmp(line, "model name", 10) && strchr(line, ':')) {
      snprintf(buf, len, "%s", strchr(line, ':') + 2);
      buf[strcspn(buf, "\n")] = 0;
      break;
    }
  if (f) fclose(f);
}

int main(int argc, char **argv) {
  int sizes[MAX_SIZES] = {20, 24, 26}, nsizes = 3, reps = 7, forced = 1, groups = 1;
  double worst_busy = 0;
  double contended = 5; /* % of one CPU used by others that voids a repetition */
  size_t min_elems = (size_t)1 << 25; /* elements per timed measurement */
  const char *json = NULL, *only = NULL;
  env e;
  memset(&e, 0, sizeof e);
  e.threads = 2;

  if (argc == 4 && !strcmp(argv[1], "--groups-child")) return groups_child(atoi(argv[2]), atoi(argv[3]));
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--quick")) {
      sizes[0] = 16, sizes[1] = 18, nsizes = 2, reps = 5;
      min_elems = (size_t)1 << 20;
    } else if (!strcmp(argv[i], "--sizes") && i + 1 < argc) {
      char *p = argv[++i];
      for (nsizes = 0; *p && nsizes < MAX_SIZES; nsizes++) {
        sizes[nsizes] = (int)strtol(p, &p, 10);
        if (sizes[nsizes] < 10 || sizes[nsizes] > 30) {
          fprintf(stderr, "bench_norm: sizes are log2 N in 10..30\n");
          return 2;
        }
        if (*p == ',') p++;
      }
    } else if (!strcmp(argv[i], "--reps") && i + 1 < argc) {
      reps = atoi(argv[++i]);
    } else if (!strcmp(argv[i], "--threads") && i + 1 < argc) {
      e.threads = atoi(argv[++i]);
    } else if (!strcmp(argv[i], "--no-forced")) {
      forced = 0;
    } else if (!strcmp(argv[i], "--no-groups")) {
      groups = 0;
    } else if (!strcmp(argv[i], "--only") && i + 1 < argc) {
      only = argv[++i];
    } else if (!strcmp(argv[i], "--json") && i + 1 < argc) {
      json = argv[++i];
    } else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
      usage(stdout);
      return 0;
    } else {
      usage(stderr);
      return 2;
    }
  }
  if (reps < 1 || reps > MAX_REPS || e.threads < 1 || e.threads > MAX_THREADS) {
    usage(stderr);
    return 2;
  }

  e.read = pick_read(&e.read_isa);
  e.simd = bench_have_avx512();
  { /* make the library pick its kernels (lazily chosen at first use) */
    double norm;
    bx_total_norm(NULL, 0, NULL, NULL, &norm, NULL);
  }
  const char *auto_isa = bx_isa_name();
  for (int i = 0; i < 4 && forced; i++) {
    e.forced_ok[i] = bx_force_isa(isa_names[i]) == BX_OK;
    bx_force_isa(NULL);
  }
  if (pool_start(e.threads) != 0) {
    fprintf(stderr, "bench_norm: cannot start %d threads\n", e.threads);
    return 1;
  }

  char cpu[128];
  cpu_model(cpu, sizeof cpu);
  printf("bench_norm: bitexact %u, %s, %ld online CPUs\n", bx_version(), cpu,
         sysconf(_SC_NPROCESSORS_ONLN));
  printf("kernel table chosen: %s, because: %s\n", auto_isa, bx_kernels_reason());
  printf("kernels: automatic choice %s; forced:%s%s%s%s%s; baselines: read %s, "
         "naive and RMW %s\n",
         auto_isa, e.forced_ok[0] ? " portable" : "", e.forced_ok[1] ? " avx2" : "",
         e.forced_ok[2] ? " avx512" : "", e.forced_ok[3] ? " avx512-pf1" : "",
         e.forced_ok[0] || e.forced_ok[1] || e.forced_ok[2] || e.forced_ok[3] ? "" : " none",
         e.read_isa, e.simd ? "avx512" : "scalar");
  printf("median of %d interleaved repetitions; ns/elem and GB/s (bytes of the "
         "tensor; a scale pass moves twice that);\nvs read = read ceiling's time / "
         "this time, same threads; vs naive = naive fp32 loop's time / this time "
         "(fp64-acc loop for fp64 data, plain RMW for scaling)\n",
         reps);

  for (int si = 0; si < nsizes; si++) {
    double kept_busy = 0, kept_wall = 0;
    int discarded = 0;
    size_t n = (size_t)1 << sizes[si];
    int iters = n >= min_elems ? 1 : (int)(min_elems / n);
    printf("\n== N = 2^%d = %zu elements, %d pass%s per measurement ==\n", sizes[si],
           n, iters, iters > 1 ? "es" : "");
    printf("%-12s %-30s %3s %9s %8s %8s %9s\n", "data", "method", "thr",
           "ns/elem", "GB/s", "vs read", "vs naive");
    for (size_t d = 0; d < NSETS; d++)
      if ((!only || strstr(sets[d].name, only)) &&
          alloc_set(&sets[d], n, e.threads, 1000 * (uint64_t)sizes[si] + d) != 0) {
        fprintf(stderr, "bench_norm: out of memory at N = 2^%d\n", sizes[si]);
        return 1;
      }
    for (size_t d = 0; d < NSETS; d++) {
      if (only && !strstr(sets[d].name, only)) continue;
      static run runs[MAX_RUNS];
      check ck = {0, 0, NAN};
      int nruns = plan_runs(&e, &sets[d], runs);
      for (int i = 0; i < nruns; i++) time_run(&e, &runs[i], &sets[d], n, 1, &ck);
      /* A repetition during which other programs took CPU time is done
       * again (up to 3 * reps times per data set): the benchmark shares
       * its machine with builds and tests more often than not. */
      for (int rep = 0, redo = 0; rep < reps;) {
        cpu_sample a = cpu_now();
        for (int i = 0; i < nruns; i++)
          runs[i].t[rep] = time_run(&e, &runs[i], &sets[d], n, iters, &ck);
        cpu_sample b = cpu_now();
        double busy = others_percent(a, b);
        /* more than 2 ticks: the two /proc counters are sampled apart */
        if (busy > contended && others_ticks(a, b) > 2 && redo < 3 * reps) {
          redo++, discarded++;
          continue;
        }
        kept_busy += busy * (b.wall - a.wall), kept_wall += b.wall - a.wall;
        rep++;
      }
      report_set(sizes[si], n, &sets[d], runs, nruns, reps);
      if (!sets[d].is_scale && ck.have) {
        double exact;
        memcpy(&exact, &ck.bits, 8);
        /* (the fp64-accumulated loop overflows where x^2 does) */
        if (isfinite(ck.naive64) && !(fabs(exact - ck.naive64) <= 1e-6 * exact)) {
          fprintf(stderr, "bench_norm: %s: bitexact norm %.17g vs fp64-acc %.17g\n",
                  sets[d].name, exact, ck.naive64);
          e.failures++;
        }
      }
    }
    for (size_t d = 0; d < NSETS; d++) {
      free(sets[d].data);
      sets[d].data = NULL;
    }
    double busy = kept_wall > 0 ? kept_busy / kept_wall : 0;
    worst_busy = busy > worst_busy ? busy : worst_busy;
    printf("other programs used %.0f%% of one CPU during the repetitions kept "
           "(%d repeated for that)%s\n", busy, discarded,
           busy > 10 ? ": WARNING, these numbers are unreliable" : "");
  }
  if (groups) e.failures += many_groups(reps);
  report_targets(sizes[nsizes - 1], e.threads);
  if (worst_busy > 10)
    printf("\nWARNING: other programs used up to %.0f%% of one CPU during the run; "
           "rerun on an idle machine\n", worst_busy);
  if (json) write_json(json, reps, &e);
  pool_stop();
  printf("\nbitexact results bitwise identical across threads and ISAs, and "
         "within 1e-6 of fp64: %s\n",
         e.failures ? "NO" : "yes");
  return e.failures ? 1 : 0;
}
