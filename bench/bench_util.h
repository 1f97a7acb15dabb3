/*
 * bench_util.h — the plumbing of bench_norm.c: a small thread pool that can
 * spin or sleep between jobs, a clock, a check that nothing else was
 * running, and float -> fp16 bits for the test values (drawn with the one
 * generator, src/common/rng.h). Header-only, included by bench_norm.c
 * alone (every bench/ *.c is its own program).
 */
#ifndef BX_BENCH_UTIL_H
#define BX_BENCH_UTIL_H

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MAX_THREADS 64

/* ------------------------------------------------------------ the pool
 * The benchmark's own threads, for the baselines and for first touch.
 * While a baseline is timed they spin between jobs (waking a sleeping
 * thread costs more than a pass over 2^16 elements); otherwise they sleep
 * on a condition variable, so they take no CPU from the library's threads
 * while bitexact is timed. */
typedef void (*task_fn)(void *ctx, int tid, int nthr);

static struct {
  pthread_t thread[MAX_THREADS];
  pthread_mutex_t mu;
  pthread_cond_t cv;
  atomic_uint gen;      /* bumped once per job */
  atomic_int remaining; /* workers still in the current job */
  atomic_int spin;      /* 1: workers spin between jobs, 0: they sleep */
  int nworkers;
  task_fn fn;
  void *ctx;
  int nthr;
  int quit;
} pool = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

static void *pool_worker(void *arg) {
  int tid = (int)(intptr_t)arg;
  unsigned seen = 0;
  for (;;) {
    while (atomic_load(&pool.gen) == seen) {
      if (atomic_load(&pool.spin)) {
        cpu_relax();
        continue;
      }
      pthread_mutex_lock(&pool.mu);
      while (atomic_load(&pool.gen) == seen && !atomic_load(&pool.spin))
        pthread_cond_wait(&pool.cv, &pool.mu);
      pthread_mutex_unlock(&pool.mu);
    }
    seen = atomic_load(&pool.gen);
    if (pool.quit) break;
    if (tid < pool.nthr) pool.fn(pool.ctx, tid, pool.nthr);
    atomic_fetch_sub(&pool.remaining, 1);
  }
  return NULL;
}

static int pool_start(int nthreads) {
  pool.nworkers = nthreads - 1;
  for (int t = 1; t < nthreads; t++)
    if (pthread_create(&pool.thread[t], NULL, pool_worker, (void *)(intptr_t)t))
      return -1;
  return 0;
}

static void pool_bump(void) {
  pthread_mutex_lock(&pool.mu);
  atomic_fetch_add(&pool.gen, 1);
  pthread_cond_broadcast(&pool.cv);
  pthread_mutex_unlock(&pool.mu);
}

static void pool_stop(void) {
  pool.quit = 1;
  atomic_store(&pool.remaining, pool.nworkers);
  pool_bump();
  for (int t = 1; t <= pool.nworkers; t++) pthread_join(pool.thread[t], NULL);
}

/* on = 1: workers spin between jobs; 0: they go to sleep. */
static void pool_spin(int on) {
  pthread_mutex_lock(&pool.mu);
  atomic_store(&pool.spin, on);
  pthread_cond_broadcast(&pool.cv);
  pthread_mutex_unlock(&pool.mu);
}

/* fn(ctx, tid, nthr) on nthr threads, the caller being thread 0. */
static void pool_run(task_fn fn, void *ctx, int nthr) {
  if (nthr <= 1) {
    fn(ctx, 0, 1);
    return;
  }
  pool.fn = fn;
  pool.ctx = ctx;
  pool.nthr = nthr;
  atomic_store(&pool.remaining, pool.nworkers);
  pool_bump();
  fn(ctx, 0, nthr);
  while (atomic_load(&pool.remaining) > 0) cpu_relax();
}

/* Thread tid's share of n elements, cut at multiples of 1024 elements so
 * every share starts on a cache line (and a page, for 4-byte elements). */
static void share(size_t n, int tid, int nthr, size_t *lo, size_t *hi) {
  size_t blocks = (n + 1023) / 1024;
  *lo = blocks * (size_t)tid / (size_t)nthr * 1024;
  *hi = blocks * (size_t)(tid + 1) / (size_t)nthr * 1024;
  if (*lo > n) *lo = n;
  if (*hi > n) *hi = n;
}

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ------------------------------------------------- is anyone else running?
 * CPU time the whole machine spent busy (steal included) minus what this
 * process used, from /proc: other programs running during a measurement
 * make its numbers meaningless, so the report says how much there was. */
typedef struct cpu_sample {
  double wall;
  unsigned long long busy, self; /* clock ticks */
} cpu_sample;

static cpu_sample cpu_now(void) {
  cpu_sample c = {now(), 0, 0};
  unsigned long long v[8] = {0};
  FILE *f = fopen("/proc/stat", "r");
  if (f && fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1],
                  &v[2], &v[3], &v[4], &v[5], &v[6], &v[7]) == 8)
    c.busy = v[0] + v[1] + v[2] + v[5] + v[6] + v[7]; /* all but idle, iowait */
  if (f) fclose(f);
  char buf[1024];
  f = fopen("/proc/self/stat", "r");
  if (f && fgets(buf, sizeof buf, f)) {
    char *p = strrchr(buf, ')');
    unsigned long long ut = 0, st = 0;
    /* fields after the command: state is 3rd, utime 14th, stime 15th */
    if (p && sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu",
                    &ut, &st) == 2)
      c.self = ut + st;
  }
  if (f) fclose(f);
  return c;
}

/* Other programs' CPU time between a and b, in clock ticks. */
static double others_ticks(cpu_sample a, cpu_sample b) {
  double other = (double)(b.busy - a.busy) - (double)(b.self - a.self);
  return other > 0 ? other : 0.0;
}

/* Other programs' CPU use between a and b, in % of one CPU. */
static double others_percent(cpu_sample a, cpu_sample b) {
  double ticks = (double)sysconf(_SC_CLK_TCK) * (b.wall - a.wall);
  double other = (double)(b.busy - a.busy) - (double)(b.self - a.self);
  return ticks > 0 && other > 0 ? 100.0 * other / ticks : 0.0;
}

/* ---------------------------------------------------------- test values */
static uint16_t float_to_f16_bits(float f) { /* nearest even */
  uint32_t x, sign;
  memcpy(&x, &f, 4);
  sign = (x >> 16) & 0x8000u;
  x &= 0x7FFFFFFFu;
  if (x >= 0x477FF000u) return (uint16_t)(sign | 0x7C00u); /* rounds to Inf */
  if (x < 0x38800000u) { /* below 2^-14: a subnormal half, m * 2^-24 */
    float a;
    memcpy(&a, &x, 4);
    return (uint16_t)(sign | (uint32_t)nearbyintf(a * 0x1p24f));
  }
  x -= 112u << 23; /* rebias 127 -> 15 */
  x += 0xFFFu + ((x >> 13) & 1u);
  return (uint16_t)(sign | (x >> 13));
}

#endif /* BX_BENCH_UTIL_H */
