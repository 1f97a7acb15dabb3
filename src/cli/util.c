/*
 * util.c — errors, buffered output, common options, opening files, the
 * progress bar and the worker pool of the bitexact command.
 */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"

static void vline(const char *prefix, const char *fmt, va_list ap) {
  char msg[2048];
  vsnprintf(msg, sizeof msg, fmt, ap);
  for (char *c = msg; *c; c++)
    if (*c == '\n' || *c == '\r') *c = ' ';
  fprintf(stderr, "bitexact: %s%s\n", prefix, msg);
}

void cli_error(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vline("", fmt, ap);
  va_end(ap);
}

void cli_note(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vline("note: ", fmt, ap);
  va_end(ap);
}

static FILE *out_stream;
static char *out_buf;
static size_t out_len;

FILE *cli_out(void) {
  if (!out_stream) {
    out_stream = open_memstream(&out_buf, &out_len);
    if (!out_stream) { /* no memory even for that: print directly */
      out_stream = stdout;
    }
  }
  return out_stream;
}

/* Called by main: writes the buffered results to stdout (keep != 0) or
 * drops them. Returns 0, or -1 if stdout could not take them. */
int cli_out_finish(int keep);
int cli_out_finish(int keep) {
  int rc = 0;
  if (out_stream && out_stream != stdout) {
    if (fclose(out_stream) != 0) rc = -1;
    if (keep && rc == 0 && out_len && fwrite(out_buf, 1, out_len, stdout) != out_len) rc = -1;
    free(out_buf);
    out_buf = NULL;
  }
  out_stream = NULL;
  if (fflush(stdout) != 0 || ferror(stdout)) rc = -1;
  return rc;
}

int cli_common_opt(int argc, char **argv, int *i, cli_opts *o) {
  const char *a = argv[*i];
  if (strcmp(a, "--json") == 0) return o->json = 1, 1;
  if (strcmp(a, "-q") == 0 || strcmp(a, "--quiet") == 0) return o->quiet = 1, 1;
  if (strcmp(a, "--progress") == 0) return o->progress = 1, 1;
  if (strcmp(a, "--no-progress") == 0) return o->progress = 0, 1;
  const char *val = NULL;
  if (strcmp(a, "--threads") == 0 || strcmp(a, "-j") == 0) {
    if (*i + 1 >= argc) {
      cli_error("%s needs a value", a);
      return -1;
    }
    val = argv[++*i];
  } else if (strncmp(a, "--threads=", 10) == 0) {
    val = a + 10;
  } else {
    return 0;
  }
  char *end;
  errno = 0;
  long n = strtol(val, &end, 10);
  if (errno || *end || end == val || n < 0 || n > 256) {
    cli_error("--threads: '%s' is not a number of threads in 0..256", val);
    return -1;
  }
  o->threads = (int)n;
  return 1;
}

int cli_threads(const cli_opts *o) {
  long n = o->threads;
  if (n <= 0) {
    const char *env = getenv("BX_NUM_THREADS");
    n = env ? strtol(env, NULL, 10) : 0;
  }
  if (n <= 0) n = sysconf(_SC_NPROCESSORS_ONLN);
  if (n < 1) n = 1;
  if (n > 256) n = 256;
  return (int)n;
}

int cli_open_files(char **paths, size_t n, st_file *files) {
  char err[1024];
  for (size_t i = 0; i < n; i++) {
    if (st_open(paths[i], &files[i], err, sizeof err) != 0) {
      cli_error("%s: %s", paths[i], err);
      cli_close_files(files, i);
      return -1;
    }
  }
  return 0;
}

void cli_close_files(st_file *files, size_t n) {
  for (size_t i = 0; i < n; i++) st_close(&files[i]);
}

double cli_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void cli_progress_init(cli_progress *p, const cli_opts *o, const char *what, uint64_t total) {
  p->what = what;
  p->total = total;
  atomic_init(&p->done, 0);
  p->start = cli_now();
  if (o->progress >= 0) p->enabled = o->progress && total > 0;
  else p->enabled = isatty(STDERR_FILENO) && total >= CLI_PROGRESS_MIN_BYTES;
}

void cli_progress_add(cli_progress *p, uint64_t bytes) {
  if (p) atomic_fetch_add(&p->done, bytes);
}

static void progress_draw(cli_progress *p, int final) {
  uint64_t done = atomic_load(&p->done);
  double frac = p->total ? (double)done / (double)p->total : 1.0;
  if (frac > 1) frac = 1;
  double t = cli_now() - p->start;
  char bar[31];
  int fill = (int)(frac * 30);
  for (int i = 0; i < 30; i++) bar[i] = i < fill ? '#' : '.';
  bar[30] = 0;
  fprintf(stderr, "\r%s [%s] %3.0f%%  %.2f / %.2f GiB  %.2f GB/s", p->what, bar, 100 * frac,
          (double)done / 1073741824.0, (double)p->total / 1073741824.0,
          t > 0 ? (double)done / t / 1e9 : 0.0);
  if (final) fputs("\r\033[K", stderr);
  fflush(stderr);
}

typedef struct runner {
  cli_worker_fn fn;
  void *ctx;
  int id;
  atomic_int *finished;
} runner;

static void *runner_main(void *arg) {
  runner *r = arg;
  r->fn(r->ctx, r->id);
  atomic_fetch_add(r->finished, 1);
  return NULL;
}

int cli_parallel(int nthreads, cli_worker_fn fn, void *ctx, cli_progress *p) {
  if (nthreads < 1) nthreads = 1;
  int draw = p && p->enabled;
  pthread_t tid[256];
  runner run[256];
  atomic_int finished;
  atomic_init(&finished, 0);
  int first = draw ? 0 : 1, started = 0;
  for (int w = first; w < nthreads && w < 256; w++) {
    run[w] = (runner){fn, ctx, w, &finished};
    if (pthread_create(&tid[w], NULL, runner_main, &run[w]) != 0) break;
    started++;
  }
  if (!draw || started == 0) {
    /* the workers claim work dynamically: whatever did not start, the
     * calling thread covers */
    fn(ctx, 0);
  } else {
    struct timespec tick = {0, 100 * 1000 * 1000};
    while (atomic_load(&finished) < started) {
      progress_draw(p, 0);
      nanosleep(&tick, NULL);
    }
  }
  for (int w = first; w < first + started; w++) pthread_join(tid[w], NULL);
  if (draw) progress_draw(p, 1);
  return 0;
}

uint64_t cli_bits_f64(double d) {
  uint64_t b;
  memcpy(&b, &d, 8);
  return b;
}

void cli_hex(double d, char *buf, size_t len) {
  if (isnan(d)) snprintf(buf, len, "nan");
  else if (isinf(d)) snprintf(buf, len, d > 0 ? "inf" : "-inf");
  else snprintf(buf, len, "%a", d);
}

const void *cli_aligned(const void *data, uint64_t bytes, size_t align, void **scratch,
                        uint64_t cap) {
  if ((uintptr_t)data % align == 0) return data;
  if (!*scratch) *scratch = malloc(cap ? cap : (bytes ? bytes : 1));
  if (!*scratch || (cap && bytes > cap)) return NULL;
  memcpy(*scratch, data, bytes);
  return *scratch;
}
