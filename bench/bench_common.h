/*
 * bench_common.h — the plumbing every training-kernel benchmark repeats
 * (bench_attention.c, bench_gemm.c, bench_wgrad.c, bench_moe.c, and the
 * clock of bench_util.h): the wall and CPU clocks, the median of a run of
 * times, the CPU's model name and a --threads list. Header-only, static
 * inline (each bench/ *.c is its own program); needs _POSIX_C_SOURCE
 * 200809L defined before the first system header.
 */
#ifndef BX_BENCH_COMMON_H
#define BX_BENCH_COMMON_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Seconds on the monotonic clock. */
static inline double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* This process's CPU seconds, all threads. */
static inline double process_cpu_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* qsort order of doubles, ascending. */
static inline int cmp_d(const void *x, const void *y) {
  double a = *(const double *)x, b = *(const double *)y;
  return a < b ? -1 : a > b;
}

/* The median of v[0..n) (n >= 1), sorting v. */
static inline double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_d);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* /proc/cpuinfo's "model name", or "unknown CPU". */
static inline void cpu_model(char *buf, size_t len) {
  snprintf(buf, len, "unknown CPU");
  FILE *f = fopen("/proc/cpuinfo", "r");
  if (!f) return;
  char line[512];
  while (fgets(line, sizeof line, f))
    if (!strncmp(line, "model name", 10) && strchr(line, ':')) {
      char *p = strchr(line, ':') + 2;
      p[strcspn(p, "\n")] = 0;
      snprintf(buf, len, "%s", p);
      break;
    }
  fclose(f);
}

/* A --threads list "1,2,8" (cut in place) into threads[0..max): the count. */
static inline int parse_threads(char *list, int *threads, int max) {
  int n = 0;
  for (char *tok = strtok(list, ","); tok && n < max; tok = strtok(NULL, ",")) threads[n++] = atoi(tok);
  return n;
}

#endif /* BX_BENCH_COMMON_H */
