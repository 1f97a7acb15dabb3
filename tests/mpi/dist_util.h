/*
 * dist_util.h — shared pieces of the multi-rank tests: a deterministic
 * PRNG (every rank draws the same model and the same partitions), models
 * of mixed-dtype tensors, 1-D views of pieces, and pass/fail counting that
 * is reduced over ranks so every rank exits with the same status.
 */
#ifndef BX_DIST_UTIL_H
#define BX_DIST_UTIL_H

#include <math.h>
#include <mpi.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bitexact.h"
#include "bitexact_mpi.h"
#include "rng.h"

static int g_rank, g_size;
static long g_checks, g_failures;

static inline void dist_fail(const char *file, int line, const char *fmt, ...) {
  va_list ap;
  g_failures++;
  if (g_failures > 20) return;
  fprintf(stderr, "  FAIL rank %d %s:%d: ", g_rank, file, line);
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fputc('\n', stderr);
}

#define CHECK(cond, ...)                                  \
  do {                                                    \
    g_checks++;                                           \
    if (!(cond)) dist_fail(__FILE__, __LINE__, __VA_ARGS__); \
  } while (0)

static inline int same_bits(double a, double b) { return memcmp(&a, &b, sizeof a) == 0; }

/* src/common/rng.h: identical sequences on every rank for the same seed */
typedef bx_rng rng;
static inline uint64_t rng_next(rng *r) { return bx_rng_next(r); }
static inline double rng_unit(rng *r) { return bx_rng_uniform(r); }
static inline double rng_normal(rng *r) { return bx_rng_normal(r); }
static inline rng rng_seeded(uint64_t seed) {
  rng r;
  bx_rng_seed(&r, seed);
  return r;
}

/* ---- tensors --------------------------------------------------------- */

typedef struct tensor {
  DLDataType dtype;
  size_t n, esize;
  void *data;
  int group;
} tensor;

static const DLDataType DT_F32 = {kDLFloat, 32, 1}, DT_F64 = {kDLFloat, 64, 1},
                        DT_F16 = {kDLFloat, 16, 1}, DT_BF16 = {kDLBfloat, 16, 1};

static inline uint16_t to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  u += 0x7FFF + ((u >> 16) & 1);
  return (uint16_t)(u >> 16);
}
static inline uint16_t to_f16(float f) { /* values here are normal-range fp16 or zero */
  uint32_t u;
  memcpy(&u, &f, 4);
  uint16_t sign = (uint16_t)((u >> 16) & 0x8000);
  uint32_t a = u & 0x7FFFFFFF;
  if (a < 0x38800000) return sign; /* flush tiny values: fine for test data */
  if (a >= 0x477FE000) return sign | 0x7BFF;
  uint32_t q = a >> 13, rem = a & 0x1FFF;
  if (rem > 0x1000 || (rem == 0x1000 && (q & 1))) q++;
  return sign | (uint16_t)(q - (112u << 10));
}

static inline void tensor_fill(tensor *t, rng *r, double scale) {
  for (size_t i = 0; i < t->n; i++) {
    double v = rng_normal(r) * scale;
    if (t->dtype.bits == 64) ((double *)t->data)[i] = v;
    else if (t->dtype.bits == 32) ((float *)t->data)[i] = (float)v;
    else if (t->dtype.code == kDLBfloat) ((uint16_t *)t->data)[i] = to_bf16((float)v);
    else ((uint16_t *)t->data)[i] = to_f16((float)v);
  }
}

static inline tensor tensor_new(DLDataType dt, size_t n, int group) {
  tensor t = {dt, n, dt.bits / 8u, NULL, group};
  t.data = calloc(n ? n : 1, t.esize);
  return t;
}

/* A 1-D view of elements [off, off+len) of t (shape stored in *shape). */
static inline DLTensor view(const tensor *t, size_t off, size_t len, int64_t *shape) {
  DLTensor v;
  memset(&v, 0, sizeof v);
  v.data = (char *)t->data + off * t->esize;
  v.device.device_type = kDLCPU;
  v.ndim = 1;
  *shape = (int64_t)len;
  v.shape = shape;
  v.dtype = t->dtype;
  return v;
}

/* ---- a rank's owned pieces, in groups -------------------------------- */

#define MAX_GROUPS 4
typedef struct owned {
  DLTensor *views[MAX_GROUPS];
  int64_t *shapes[MAX_GROUPS];
  size_t count[MAX_GROUPS], cap;
  bx_group groups[MAX_GROUPS];
} owned;

static inline void owned_init(owned *o, size_t cap) {
  memset(o, 0, sizeof *o);
  o->cap = cap;
  for (int g = 0; g < MAX_GROUPS; g++) {
    o->views[g] = calloc(cap, sizeof(DLTensor));
    o->shapes[g] = calloc(cap, sizeof(int64_t));
  }
}
static inline void owned_add(owned *o, const tensor *t, size_t off, size_t len) {
  int g = t->group;
  size_t k = o->count[g]++;
  o->views[g][k] = view(t, off, len, &o->shapes[g][k]);
}
static inline const bx_group *owned_groups(owned *o, int ngroups) {
  for (int g = 0; g < ngroups; g++) {
    o->groups[g].tensors = o->views[g];
    o->groups[g].count = o->count[g];
  }
  return o->groups;
}
static inline void owned_reset(owned *o) { memset(o->count, 0, sizeof o->count); }
static inline void owned_free(owned *o) {
  for (int g = 0; g < MAX_GROUPS; g++) {
    free(o->views[g]);
    free(o->shapes[g]);
  }
}

/* Summary over all ranks; rank 0 prints "N passed, N failed". */
static inline int dist_finish(const char *name) {
  long local[2] = {g_checks - g_failures, g_failures}, total[2];
  MPI_Allreduce(local, total, 2, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
  if (g_rank == 0) {
    printf("%s (%d ranks): %ld checks passed, %ld failed\n", name, g_size, total[0], total[1]);
    fflush(stdout);
  }
  return total[1] != 0;
}

#endif
