/*
 * attention_internal.h — what bx_attention_forward (attention.c) and
 * bx_attention_backward (attention_bwd.c) share: the argument checks (all
 * before the first write), the geometry, and the packing of operands for
 * the GEMM micro-kernel (kernels.h).
 */
#ifndef BX_ATTENTION_INTERNAL_H
#define BX_ATTENTION_INTERNAL_H

#include <math.h>
#include <stddef.h>

#include "bitexact_train.h"
#include "call.h"
#include "train_check.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct bx_attn_geom {
  size_t T, L, B;   /* tokens, tokens per sequence, sequences */
  size_t Hq, Hkv, R; /* query heads, kv heads, R = Hq / Hkv */
  size_t D;         /* head_dim */
  size_t ldq, ldk;  /* row strides in floats: Hq*D, Hkv*D */
  float scale;      /* fp32 nearest to D^-1/2 */
  int nthreads;     /* resolved thread count (>= 1) */
} bx_attn_geom;

/* The kind of a tensor argument: its shape in terms of the geometry. */
typedef enum bx_attn_kind {
  BX_ATTN_Q = 0,    /* [T, Hq*D] or [B, L, Hq*D] */
  BX_ATTN_KV = 1,   /* [T, Hkv*D] or [B, L, Hkv*D] */
  BX_ATTN_STATS = 2 /* [T, Hq, 2] */
} bx_attn_kind;

typedef struct bx_attn_arg {
  const DLTensor *t;
  const char *name; /* "q", "dk", ... */
  bx_attn_kind kind;
  int writable;
} bx_attn_arg;

/* The start of both calls: opts->struct_size first, num_threads >= 0,
 * then the call is entered (train_check.h bx_tc_enter). */
bx_status bx_attn_enter(bx_call *call, const char *fn, const bx_attention_opts *opts);

/* Everything a call checks after bx_attn_enter, in order: the four sizes, each
 * tensor (index = position in args; tensor 0 fixes T; at place pl:
 * train_check.h bx_tc_check_in), shapes, overlaps. data[i] gets tensor i's
 * first element. Writes nothing else. */
bx_status bx_attn_check(const char *fn, const bx_tc_place *pl, const bx_attention_opts *opts,
                        int64_t seq_len,
                        int64_t num_heads, int64_t num_kv_heads, int64_t head_dim,
                        const bx_attn_arg *args, size_t nargs, float **data, bx_attn_geom *g);

/* Packing for the GEMM micro-kernel (kernels.h), in attention.c.
 * bx_attn_pack_rows: n rows of x (row stride ld), their first kc columns,
 * into k-major slivers w rows wide, zero padded: element (row s + ii, k)
 * of sliver s / w at out[s * kc + k * w + ii] (the micro-kernel's packed
 * A, or packed B of an NT product).
 * bx_attn_pack_cols: kc rows of x (stride ld), columns [0, D), into
 * slivers of w columns, zero padded: element (k, s + jj) at
 * out[s * kc + k * w + jj] (packed B of an NN product; with w = mr, the
 * packed A of the transpose of x).
 * Within a sliver the layout is k-major, so a micro-kernel call may start
 * at k = k0 (pointer + k0 * w) and run fewer than kc steps. */
void bx_attn_pack_rows(const float *x, size_t ld, size_t n, size_t kc, size_t w, float *out);
void bx_attn_pack_cols(const float *x, size_t ld, size_t kc, size_t D, size_t w, float *out);

/* Largest seq_len and head_dim accepted (scratch rows, exact (float)D). */
#define BX_ATTN_MAX_LEN ((int64_t)1 << 30)
#define BX_ATTN_MAX_DIM ((int64_t)1 << 20)

#ifdef __cplusplus
}
#endif

#endif /* BX_ATTENTION_INTERNAL_H */
