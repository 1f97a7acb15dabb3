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
#include <unistd.h>

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

/* The flags of a benchmark next to torch: --torch, --quick (3 reps),
 * --torch-script PATH, --reps R (clamped to 1..31), --threads LIST. */
#define BENCH_MAX_THREADS 16
typedef struct bench_args {
  int threads[BENCH_MAX_THREADS], nthreads, reps, torch, quick;
  const char *script; /* NULL: bench/NAME_torch.py */
} bench_args;

/* argv[1..argc) into a (defaults: threads 1,2, 5 reps); every thread count
 * must be in 1..maxt (<= BENCH_MAX_THREADS). 0, or 2 after a message
 * naming prog (the usage line on an unknown flag). */
static inline int bench_parse(bench_args *a, int argc, char **argv, const char *prog, int maxt) {
  *a = (bench_args){{1, 2}, 2, 5, 0, 0, NULL};
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--torch")) a->torch = 1;
    else if (!strcmp(argv[i], "--quick")) a->quick = 1;
    else if (!strcmp(argv[i], "--torch-script") && i + 1 < argc) a->script = argv[++i];
    else if (!strcmp(argv[i], "--reps") && i + 1 < argc) a->reps = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--threads") && i + 1 < argc)
      a->nthreads = parse_threads(argv[++i], a->threads, maxt);
    else {
      fprintf(stderr, "usage: %s [--torch] [--torch-script PATH] [--threads 1,2] [--reps R] [--quick]\n",
              prog);
      return 2;
    }
  }
  if (a->quick) a->reps = 3;
  if (a->reps < 1) a->reps = 1;
  if (a->reps > 31) a->reps = 31;
  for (int i = 0; i < a->nthreads; i++)
    if (a->threads[i] < 1 || a->threads[i] > maxt) {
      fprintf(stderr, "%s: thread counts 1..%d\n", prog, maxt);
      return 2;
    }
  return 0;
}

/* The torch script bench/NAME: from the source tree's root, else beside
 * build/bench/PROGRAM (argv0); into path. */
static inline const char *torch_script(char *path, size_t len, const char *argv0, const char *name) {
  snprintf(path, len, "bench/%s", name);
  if (access(path, R_OK) != 0) {
    const char *slash = strrchr(argv0, '/');
    int dl = slash ? (int)(slash - argv0) : 1;
    snprintf(path, len, "%.*s/../../bench/%s", dl, slash ? argv0 : ".", name);
  }
  return path;
}

/* "python3 'SCRIPT' --reps R --threads 1,2 --shapes " into cmd: its length
 * (the caller appends the shapes). */
static inline int torch_command(char *cmd, size_t size, const char *script, int reps,
                                const int *threads, int nthreads) {
  int len = snprintf(cmd, size, "python3 '%s' --reps %d --threads ", script, reps);
  for (int i = 0; i < nthreads; i++)
    len += snprintf(cmd + len, size - (size_t)len, "%s%d", i ? "," : "", threads[i]);
  len += snprintf(cmd + len, size - (size_t)len, " --shapes ");
  return len;
}

#endif /* BX_BENCH_COMMON_H */
