/*
 * train_agree.c — the start-up agreement of the run-wide settings and the
 * test-only fault injection of `bitexact train` (train_agree.h).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "train_agree.h"

static void show(const ta_setting *s, int64_t v, char *out, size_t n) {
  double d;
  switch (s->kind) {
  case TA_UINT: snprintf(out, n, "%llu", (unsigned long long)v); break;
  case TA_F64: memcpy(&d, &v, 8); snprintf(out, n, "%g", d); break;
  case TA_HASH: snprintf(out, n, "xxh3:%016llx", (unsigned long long)v); break;
  case TA_ENUM: snprintf(out, n, "%s", s->names[v]); break;
  default: snprintf(out, n, "%lld", (long long)v); break;
  }
}

/* "ranks disagree on NAME: rank 0 A, rank 1 B, ..." from every rank's value. */
static void disagree_line(const ta_setting *s, const int64_t *vals, int nranks, char *err,
                          size_t errlen) {
  size_t at = (size_t)snprintf(err, errlen, "ranks disagree on %s:", s->name);
  for (int r = 0; r < nranks && at < errlen; r++) {
    char v[64];
    show(s, vals[r], v, sizeof v);
    at += (size_t)snprintf(err + at, errlen - at, "%s rank %d %s", r ? "," : "", r, v);
  }
}

int ta_agree(const bx_comm *comm, int rank, int nranks, int64_t status, const ta_setting *s,
             size_t n, int64_t *agreed_status, int *all_failed, char *err, size_t errlen) {
  *agreed_status = status;
  *all_failed = status != 0;
  if (!comm || nranks <= 1) return 0;
  size_t nw = 2 + 2 * n;
  int64_t *w = malloc((nw > (size_t)nranks ? nw : (size_t)nranks) * sizeof *w);
  int64_t stk[2];
  if (!w) { /* still take part: the status alone, then every rank knows this one failed */
    stk[0] = status ? status : ((int64_t)2 << 40) | (((int64_t)1 << 40) - 1 - rank);
    stk[1] = 0;
    if (comm->allreduce_i64(stk, 2, BX_OP_MAX, comm->ctx) != 0) {
      snprintf(err, errlen, "the start-up agreement (an all-reduce) failed");
      return -1;
    }
    *agreed_status = stk[0];
    *all_failed = stk[1] == 0;
    snprintf(err, errlen, "out of memory (the start-up agreement)");
    return 0;
  }
  w[0] = status;
  w[1] = status == 0;
  for (size_t i = 0; i < n; i++) {
    w[2 + 2 * i] = s[i].value;
    w[3 + 2 * i] = s[i].value == INT64_MIN ? INT64_MAX : -s[i].value;
  }
  /* a rank that failed brings no settings: the words' sizes still match (n is fixed) */
  int rc = -1;
  if (comm->allreduce_i64(w, nw, BX_OP_MAX, comm->ctx) != 0) {
    snprintf(err, errlen, "the start-up agreement (an all-reduce) failed");
    goto done;
  }
  *agreed_status = w[0];
  *all_failed = w[1] == 0;
  rc = 0;
  if (w[0] != 0) goto done; /* a failure is reported first */
  size_t first = n;
  for (size_t i = 0; i < n; i++)
    if (w[2 + 2 * i] != -w[3 + 2 * i] &&
        !(s[i].value == INT64_MIN && w[2 + 2 * i] == INT64_MIN)) {
      first = i;
      break;
    }
  if (first == n) goto done;
  /* every rank's value of the first setting that differs (and which others differ) */
  int64_t *names_differ = calloc(n, sizeof *names_differ);
  for (size_t i = first; names_differ && i < n; i++) names_differ[i] = w[2 + 2 * i] != -w[3 + 2 * i];
  memset(w, 0, (size_t)nranks * sizeof *w);
  w[rank] = s[first].value;
  rc = -1;
  if (comm->allreduce_i64(w, (size_t)nranks, BX_OP_SUM, comm->ctx) != 0) {
    snprintf(err, errlen, "the start-up agreement (an all-reduce) failed");
    free(names_differ);
    goto done;
  }
  disagree_line(&s[first], w, nranks, err, errlen);
  size_t at = strlen(err);
  int more = 0;
  for (size_t i = first + 1; names_differ && i < n && at < errlen; i++)
    if (names_differ[i]) {
      at += (size_t)snprintf(err + at, errlen - at, "%s%s", more ? ", " : " (also: ", s[i].name);
      more = 1;
    }
  if (more && at < errlen) snprintf(err + at, errlen - at, ")");
  free(names_differ);
done:
  free(w);
  return rc;
}

uint64_t ta_file_hash(const void *bytes, size_t len) {
  XXH3_state_t *st = XXH3_createState();
  const size_t MiB = (size_t)1 << 20;
  if (!st) return 0;
  unsigned char sz[8];
  for (int i = 0; i < 8; i++) sz[i] = (unsigned char)((uint64_t)len >> (8 * i));
  XXH3_64bits_reset(st);
  XXH3_64bits_update(st, sz, 8);
  if (len <= 2 * MiB) {
    XXH3_64bits_update(st, bytes, len);
  } else {
    XXH3_64bits_update(st, bytes, MiB);
    XXH3_64bits_update(st, (const unsigned char *)bytes + len - MiB, MiB);
  }
  uint64_t h = (uint64_t)XXH3_64bits_digest(st);
  XXH3_freeState(st);
  return h;
}

int tf_parse(const char *env, tf_fault *f, char *err, size_t errlen) {
  memset(f, 0, sizeof *f);
  if (!env || !*env) return 0;
  static const char *const points[] = {"alloc", "data", "kernel", "loss", "save", "eval"};
  char *end;
  errno = 0;
  long long r = strtoll(env, &end, 10), s = 0;
  int ok = end != env && *end == ':' && r >= 0 && !errno;
  if (ok) {
    const char *p = end + 1;
    s = strtoll(p, &end, 10);
    ok = end != p && *end == ':' && s >= 0 && !errno;
  }
  int known = 0;
  for (size_t i = 0; ok && i < sizeof points / sizeof points[0]; i++) known |= strcmp(end + 1, points[i]) == 0;
  if (!ok || !known) {
    snprintf(err, errlen, "BITEXACT_FAULT '%s' is not RANK:STEP:POINT with POINT alloc, data, "
             "kernel, loss or save (a test-only switch: docs/faults.md)", env);
    return -1;
  }
  f->on = 1;
  f->rank = r;
  f->step = s;
  snprintf(f->point, sizeof f->point, "%s", end + 1);
  return 0;
}

int tf_hit(tf_fault *f, int rank, int64_t step, const char *point) {
  if (!f->on || f->fired || f->rank != rank || f->step != step || strcmp(f->point, point) != 0)
    return 0;
  f->fired = 1;
  return 1;
}
