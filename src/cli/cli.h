/*
 * cli.h — what the parts of the bitexact command share: exit codes, the
 * one-line error, the buffered standard output (a command's results are
 * written only once they are complete), options common to the commands,
 * the progress bar and a tiny worker pool.
 */
#ifndef BX_CLI_H
#define BX_CLI_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "safetensors.h"

/* Exit statuses of every command. */
enum { CLI_OK = 0, CLI_DIFFER = 1, CLI_ERROR = 2 };

/* "bitexact: MESSAGE\n" on stderr (one line: newlines are replaced). */
void cli_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* "bitexact: note: MESSAGE\n" on stderr. */
void cli_note(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* The stream a command prints its results to: memory, copied to stdout by
 * main() only when the command did not fail (status 0 or 1). */
FILE *cli_out(void);

/* Options shared by the commands. */
typedef struct cli_opts {
  int json;         /* --json */
  int threads;      /* --threads N; 0 = BX_NUM_THREADS or the online CPUs */
  int progress;     /* -1 auto (a terminal and a large input), 0 never, 1 always */
  int quiet;        /* -q: totals only */
} cli_opts;

/* Parses one common option at argv[*i] (advancing *i past a value).
 * 1: consumed; 0: not a common option; -1: bad value (error printed). */
int cli_common_opt(int argc, char **argv, int *i, cli_opts *o);

/* Worker threads to use for o (>= 1). */
int cli_threads(const cli_opts *o);

/* Opens and checks every file; on the first failure prints
 * "bitexact: PATH: REASON", closes what was opened and returns -1. */
int cli_open_files(char **paths, size_t n, st_file *files);
void cli_close_files(st_file *files, size_t n);

/* Progress on stderr: a bar redrawn in place, only if enabled. */
typedef struct cli_progress {
  int enabled;
  const char *what;
  uint64_t total;        /* bytes */
  atomic_uint_fast64_t done;
  double start;
} cli_progress;

#define CLI_PROGRESS_MIN_BYTES ((uint64_t)256 << 20)

/* Enabled per o->progress: auto = stderr is a terminal and total >= 256 MiB. */
void cli_progress_init(cli_progress *p, const cli_opts *o, const char *what, uint64_t total);
void cli_progress_add(cli_progress *p, uint64_t bytes);

/* Runs fn(ctx, worker) on nthreads threads (the workers claim their work
 * from ctx themselves) and waits for them; while waiting, the calling
 * thread redraws p (if enabled; else it is worker 0 itself). 0, or -1 if
 * no thread could be started (then nothing ran). */
typedef void (*cli_worker_fn)(void *ctx, int worker);
int cli_parallel(int nthreads, cli_worker_fn fn, void *ctx, cli_progress *p);

double cli_now(void);

/* data itself when it is aligned to align bytes; otherwise a copy of its
 * bytes in *scratch (grown with malloc: to cap bytes if cap > 0, else to
 * exactly bytes; the caller frees *scratch). NULL if out of memory. */
const void *cli_aligned(const void *data, uint64_t bytes, size_t align, void **scratch,
                        uint64_t cap);

/* Bit patterns and ordering of binary floats. */
uint64_t cli_bits_f64(double d);
/* "%a" of d, or "nan", "inf", "-inf". */
void cli_hex(double d, char *buf, size_t len);

/* The commands. argv[0] is the command name. Return an exit status. */
int cmd_norm(int argc, char **argv);
int cmd_hash(int argc, char **argv);
int cmd_diff(int argc, char **argv);
int cmd_demo(int argc, char **argv);
int cmd_train(int argc, char **argv);
int cmd_plot(int argc, char **argv);
/* diff of two run-record (JSON Lines) files; called by cmd_diff. */
int diff_records(const char *a, const char *b, const cli_opts *o);
/* trace_diff.c: two bitexact traces (docs/trace.md); 0 identical, 1 differ, CLI_ERROR. */
int diff_trace(const char *a, const char *b, const cli_opts *o);

#endif /* BX_CLI_H */
