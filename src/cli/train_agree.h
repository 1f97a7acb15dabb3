/*
 * train_agree.h — what the ranks of `bitexact train` agree on before they
 * go on (docs/faults.md): the run-wide settings at start-up, each rank's
 * view compared in one MAX all-reduce, a mismatch named in one line; and
 * the test-only fault injection (BITEXACT_FAULT) that proves a failure on
 * one rank reaches every rank.
 */
#ifndef BX_CLI_TRAIN_AGREE_H
#define BX_CLI_TRAIN_AGREE_H

#include <stddef.h>
#include <stdint.h>

#include <bitexact.h>

/* ---- start-up settings ---------------------------------------------------- */

typedef enum ta_kind {
  TA_INT,   /* an integer (printed in decimal) */
  TA_UINT,  /* an unsigned 64-bit integer stored in value (--seed) */
  TA_F64,   /* a double's bit pattern (printed with %g) */
  TA_HASH,  /* a 64-bit hash (printed "xxh3:" + 16 hex digits) */
  TA_ENUM   /* an index into names */
} ta_kind;

typedef struct ta_setting {
  const char *name;         /* as the line names it: "--compute-dtype", "config", ... */
  ta_kind kind;
  int64_t value;            /* this rank's view */
  const char *const *names; /* TA_ENUM: the value's names */
} ta_setting;

/* One agreement over the ranks (every rank calls it, failed or not): one
 * MAX all-reduce of the status word (nonzero: this rank failed locally
 * before; the word names the level and rank as train.c's status words do),
 * a "some rank is fine" word, and (value, -value) per setting. *status :=
 * the agreed status word (0: no rank failed), *all_failed := every rank
 * failed. With no failure and a setting that differs, one SUM all-reduce
 * of nranks words gives every rank each rank's value, and err gets the
 * line "ranks disagree on NAME: rank 0 A, rank 1 B, ..." (the first such
 * setting; the others that differ are named after it); -1 then (the same
 * on every rank). 0 otherwise; -1 with err on a transport error. comm NULL
 * (one process): nothing compared. */
int ta_agree(const bx_comm *comm, int rank, int nranks, int64_t status, const ta_setting *s,
             size_t n, int64_t *agreed_status, int *all_failed, char *err, size_t errlen);

/* A cheap fingerprint of a token file's bytes: XXH3-64 of its size (8
 * bytes, little-endian), its first MiB and its last MiB (the whole file
 * when it is at most 2 MiB). */
uint64_t ta_file_hash(const void *bytes, size_t len);

/* ---- test-only fault injection ---------------------------------------------- */

/* BITEXACT_FAULT=RANK:STEP:POINT (docs/faults.md). */
typedef struct tf_fault {
  int on;
  int64_t rank, step;
  char point[16];
  int fired;
} tf_fault;

/* Parses env (NULL or empty: off). POINT is one of alloc, data, kernel,
 * loss, save, eval (the routed experts in the eval's forward). 0, or -1
 * with a one-line reason in err. */
int tf_parse(const char *env, tf_fault *f, char *err, size_t errlen);

/* 1 once when the fault is this rank's at this step and point (it fires
 * at the first such call and never again); 0 otherwise. */
int tf_hit(tf_fault *f, int rank, int64_t step, const char *point);

#endif /* BX_CLI_TRAIN_AGREE_H */
