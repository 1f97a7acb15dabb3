/*
 * moe_internal.h — the validation shared by the MoE router (router.c) and
 * the token dispatch (permute.c): host tensors of fp32, int32 or int64
 * elements, row-major contiguous, their shapes, the overlap of outputs,
 * and the dispatch plan (row_map and pos, each other's inverse).
 */
#ifndef BX_MOE_INTERNAL_H
#define BX_MOE_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "bitexact.h"

/* dtype masks */
#define BX_MOE_F32 1u
#define BX_MOE_I32 2u
#define BX_MOE_I64 4u
#define BX_MOE_IDS (BX_MOE_I32 | BX_MOE_I64)

typedef struct bx_moe_tensor {
  const char *name; /* as in the messages: "logits" */
  size_t index;     /* argument number */
  void *data;       /* first element; NULL when n == 0 */
  int64_t dim[2];   /* shape (dim[1] = 1 for 1-D) */
  size_t n;         /* elements */
  unsigned dtype;   /* one of the masks */
  int writable;
} bx_moe_tensor;

/* t: present, host, dtype in dtypes, ndim dimensions, shape[d] == want[d]
 * where want[d] >= 0, row-major contiguous, aligned. Errors name
 * "fn: tensor index (name)". */
bx_status bx_moe_check(const char *fn, size_t index, const char *name, const DLTensor *t,
                       unsigned dtypes, int ndim, const int64_t *want, int writable,
                       bx_moe_tensor *out);

/* No writable tensor of ts[0..n) shares a byte with another one. */
bx_status bx_moe_check_overlap(const char *fn, const bx_moe_tensor *const *ts, size_t n);

/* row_map [R, 2] and pos [T, k] (checked int64 tensors) describe R = T*k
 * rows: pos[t][j] in [0, R) and row_map[pos[t][j]] == (t, j) for all
 * (t, j) — so pos is a bijection and row_map its inverse. */
bx_status bx_moe_check_plan(const char *fn, const bx_moe_tensor *row_map,
                            const bx_moe_tensor *pos);

/* Each row of ids [T, k] holds k distinct experts in [0, E) (BX_EINVAL
 * naming token and slot). seen: E zero bytes of scratch, left zero. */
bx_status bx_moe_check_ids(const char *fn, const bx_moe_tensor *ids, int64_t E,
                           unsigned char *seen);

/* Threads for npieces fixed pieces: num_threads (0 = default), at most
 * one per piece, at least 1. */
int bx_moe_threads(int num_threads, size_t npieces);

/* Element i of an ids tensor (int32 or int64). */
static inline int64_t bx_moe_id(const bx_moe_tensor *t, size_t i) {
  return t->dtype == BX_MOE_I32 ? (int64_t)((const int32_t *)t->data)[i]
                                : ((const int64_t *)t->data)[i];
}

/* The row-major int64 dispatch maps. */
static inline const int64_t *bx_moe_i64(const bx_moe_tensor *t) {
  return (const int64_t *)t->data;
}

#endif /* BX_MOE_INTERNAL_H */
