/*
 * train_sim.c — the host simulation of the training kernels' device backend
 * (train_device.h's bx_hostsim_train): every launcher of src/cuda/train
 * mirrored on the calling thread, the same grids over the same thread
 * bodies (src/cuda/train/train_grid.h, grid_*.h; the
 * arithmetic is the src/common _hd.h headers'), kernels in the launchers'
 * order, the GEMM-like kernels' blocks phase by phase between their
 * barriers, atomics as plain sequential integer ops; the token reduction's
 * device scratch arena is host scratch here.
 *
 * What it is for: running the device path of a whole program on a machine
 * without a GPU (`BITEXACT_TEST_DEVICE=sim bitexact train --device cuda`,
 * tests/cli/cases_device.py), so that the plumbing — which buffers a caller
 * allocates where, which calls reach the device, in what order — is tested
 * in CI. Device memory is what alloc_managed handed out: every pointer a
 * launcher dereferences must lie, with its whole extent, inside one such
 * allocation, else the launch fails with BX_EDEVICE naming the argument
 * (a GPU would fault on host memory). Blocks and threads run in ascending
 * order here; tests/test_train_cuda_sim*.c shuffle them.
 *
 * Tests only (docs/cuda.md): selected by bx_train_device_use_sim or
 * BITEXACT_TEST_DEVICE=sim. Thread-safe: the allocation registry is locked;
 * launchers share nothing.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "grid_attention.h"
#include "grid_math.h"
#include "grid_moe.h"
#include "grid_tokred.h"
#include "train_device.h"
#include "train_grid.h"

/* ---- device memory: the registry of live allocations ---------------------------------- */

typedef struct sim_block {
  uintptr_t base;
  size_t bytes;
} sim_block;

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static sim_block *g_blocks;
static size_t g_count, g_cap;

static bx_status sim_alloc(const char *fn, size_t bytes, void **ptr) {
  size_t n = (bytes + 63) / 64 * 64;
  void *p = n >= bytes ? aligned_alloc(64, n) : NULL;
  if (!p) return bx_fail(BX_ENOMEM, "%s: %zu bytes of (simulated) managed memory", fn, bytes);
  memset(p, 0, n);
  pthread_mutex_lock(&g_lock);
  if (g_count == g_cap) {
    size_t cap = g_cap ? 2 * g_cap : 64;
    sim_block *nb = realloc(g_blocks, cap * sizeof *nb);
    if (!nb) {
      pthread_mutex_unlock(&g_lock);
      free(p);
      return bx_fail(BX_ENOMEM, "%s: the simulated device's allocation table", fn);
    }
    g_blocks = nb;
    g_cap = cap;
  }
  g_blocks[g_count++] = (sim_block){(uintptr_t)p, bytes};
  pthread_mutex_unlock(&g_lock);
  *ptr = p;
  return BX_OK;
}

static void sim_free(void *ptr) {
  if (!ptr) return;
  pthread_mutex_lock(&g_lock);
  for (size_t i = 0; i < g_count; i++)
    if (g_blocks[i].base == (uintptr_t)ptr) {
      g_blocks[i] = g_blocks[--g_count];
      break;
    }
  if (!g_count) {
    free(g_blocks);
    g_blocks = NULL;
    g_cap = 0;
  }
  pthread_mutex_unlock(&g_lock);
  free(ptr);
}

/* BX_OK when [p, p + bytes) lies inside one live allocation (or bytes == 0). */
static bx_status sim_mem(const char *fn, const char *arg, const void *p, size_t bytes) {
  if (!bytes) return BX_OK;
  uintptr_t a = (uintptr_t)p;
  int ok = 0;
  pthread_mutex_lock(&g_lock);
  for (size_t i = 0; i < g_count && !ok; i++)
    ok = a >= g_blocks[i].base && a - g_blocks[i].base <= g_blocks[i].bytes &&
         bytes <= g_blocks[i].bytes - (a - g_blocks[i].base);
  pthread_mutex_unlock(&g_lock);
  if (ok) return BX_OK;
  return bx_fail(BX_EDEVICE, "%s: %s (%zu bytes at %p) is not device memory: the (simulated) "
                 "device would fault on it", fn, arg, bytes, p);
}

/* Elements spanned by rows rows of cols elements, ld apart. */
static size_t span(size_t rows, size_t cols, size_t ld) {
  return rows && cols ? (rows - 1) * ld + cols : 0;
}

#define MEM(arg, p, bytes)                                                                 \
  do {                                                                                     \
    bx_status st_ = sim_mem(fn, arg, p, bytes);                                            \
    if (st_ != BX_OK) return st_;                                                          \
  } while (0)

static bx_status sim_usable(const char *fn) {
  (void)fn;
  return BX_OK;
}

static bx_status sim_to_host(const char *fn, int device, void *dst, const void *src,
                             size_t bytes) {
  (void)device;
  MEM("the source", src, bytes);
  if (bytes) memcpy(dst, src, bytes);
  return BX_OK;
}

/* ---- the launchers ------------------------------------------------------------------------ */

static bx_status sim_swiglu_fwd(const char *fn, int device, const float *g, const float *u,
                                float *h, size_t rows, size_t f, size_t ldg, size_t ldu,
                                size_t ldh) {
  (void)device;
  MEM("gate", g, span(rows, f, ldg) * 4);
  MEM("up", u, span(rows, f, ldu) * 4);
  MEM("h", h, span(rows, f, ldh) * 4);
  bx_tg_swiglu a = {g, u, NULL, h, NULL, NULL, rows, f, ldg, ldu, ldh, 0, 0};
  for (uint64_t i = 0; i < (uint64_t)rows * f; i++) bx_tg_swiglu_fwd(&a, i);
  return BX_OK;
}

static bx_status sim_swiglu_bwd(const char *fn, int device, const float *g, const float *u,
                                const float *dh, float *dg, float *du, size_t rows, size_t f,
                                size_t ldg, size_t ldu, size_t ldh, size_t lddg, size_t lddu) {
  (void)device;
  MEM("gate", g, span(rows, f, ldg) * 4);
  MEM("up", u, span(rows, f, ldu) * 4);
  MEM("dh", dh, span(rows, f, ldh) * 4);
  MEM("dgate", dg, span(rows, f, lddg) * 4);
  MEM("dup", du, span(rows, f, lddu) * 4);
  bx_tg_swiglu a = {g, u, dh, NULL, dg, du, rows, f, ldg, ldu, ldh, lddg, lddu};
  for (uint64_t i = 0; i < (uint64_t)rows * f; i++) bx_tg_swiglu_bwd(&a, i);
  return BX_OK;
}

static bx_status sim_adamw(const char *fn, int device, float *p, const float *g, float *m,
                           float *v, size_t n, const bx_adamw_scalars *s) {
  (void)device;
  MEM("param", p, n * 4);
  MEM("grad", g, n * 4);
  MEM("exp_avg", m, n * 4);
  MEM("exp_avg_sq", v, n * 4);
  bx_tg_adamw a = {p, m, v, g, n, *s};
  for (uint64_t i = 0; i < n; i++) bx_tg_adamw_elem(&a, i);
  return BX_OK;
}

static bx_status sim_rmsnorm_fwd(const char *fn, int device, const float *x, const float *w,
                                 float *y, float *rstd, size_t rows, size_t h, float eps) {
  (void)device;
  MEM("x", x, rows * h * 4);
  MEM("weight", w, h * 4);
  MEM("y", y, rows * h * 4);
  if (rstd) MEM("rstd", rstd, rows * 4);
  bx_tg_rmsnorm a = {x, w, NULL, NULL, y, rstd, NULL, NULL, rows, h, 0, 0, eps};
  for (uint64_t r = 0; r < rows; r++) bx_tg_rmsnorm_fwd_row(&a, r);
  return BX_OK;
}

static bx_status sim_rmsnorm_bwd(const char *fn, int device, const float *x, const float *w,
                                 const float *dy, const float *rstd, float *dx, float *partials,
                                 size_t rows, size_t h, size_t chunk, size_t nchunks) {
  (void)device;
  MEM("x", x, rows * h * 4);
  MEM("weight", w, h * 4);
  MEM("dy", dy, rows * h * 4);
  MEM("rstd", rstd, rows * 4);
  MEM("dx", dx, rows * h * 4);
  if (partials) MEM("partials", partials, nchunks * h * 4);
  bx_tg_rmsnorm a = {x, w, dy, rstd, NULL, NULL, dx, partials, rows, h, chunk, nchunks, 0.0f};
  if (partials) /* the launcher's first kernel: dx may be dy */
    for (uint64_t i = 0; i < (uint64_t)nchunks * h; i++) bx_tg_rmsnorm_part(&a, i);
  for (uint64_t r = 0; r < rows; r++) bx_tg_rmsnorm_dx_row(&a, r);
  return BX_OK;
}

static bx_status sim_rope(const char *fn, int device, const float *x, float *y, const int64_t *pos,
                          size_t tokens, size_t width, size_t head_dim, size_t half,
                          size_t rotary_dim, float theta, float sin_sign) {
  (void)device;
  MEM("x", x, tokens * width * 4);
  MEM("y", y, tokens * width * 4);
  MEM("positions", pos, tokens * 8);
  bx_tg_rope a = {x, y, pos, tokens, width, head_dim, head_dim ? width / head_dim : 0, half,
                  rotary_dim, theta, sin_sign};
  uint64_t items = (uint64_t)tokens * bx_tg_rope_slots(&a);
  for (uint64_t i = 0; i < items; i++) bx_tg_rope_slot(&a, i);
  return BX_OK;
}

/* bx_cut_gemm's refusal of a grid CUDA cannot launch. */
static bx_status gemm_fits(const char *fn, size_t m, size_t n) {
  uint64_t gx = (m + BX_TG_GEMM_BM - 1) / BX_TG_GEMM_BM, gy = (n + BX_TG_GEMM_BN - 1) / BX_TG_GEMM_BN;
  if (gx > 0x7FFFFFFFu || gy > 65535u)
    return bx_fail(BX_EINVAL, "%s: %zu x %zu outputs exceed the CUDA kernel's grid (at most "
                   "2^31 - 1 row tiles and 65535 column tiles of 64)", fn, m, n);
  return BX_OK;
}

/* gemm.cu's kernel, its blocks phase by phase (the pointers already checked). */
static bx_status gemm_grid(const char *fn, const void *a, int a_bf16, const void *b, int b_bf16,
                          int layout, float *c, size_t m, size_t n, size_t k, int accumulate) {
  bx_tg_gemm g = {a, b, a_bf16, b_bf16, layout, c, m, n, k, accumulate};
  float As[BX_TG_GEMM_BK * BX_TG_GEMM_BM], Bs[BX_TG_GEMM_BK * BX_TG_GEMM_BN];
  float *acc = malloc(BX_TG_GEMM_THREADS * BX_TG_GEMM_TM * BX_TG_GEMM_TN * sizeof *acc);
  if (!acc) return bx_fail(BX_ENOMEM, "%s: the simulated GEMM's registers", fn);
  uint64_t gx = (m + BX_TG_GEMM_BM - 1) / BX_TG_GEMM_BM, gy = (n + BX_TG_GEMM_BN - 1) / BX_TG_GEMM_BN;
  const size_t per = BX_TG_GEMM_TM * BX_TG_GEMM_TN;
  for (uint64_t bm = 0; bm < gx; bm++)
    for (uint64_t bn = 0; bn < gy; bn++) {
      for (uint32_t t = 0; t < BX_TG_GEMM_THREADS; t++) bx_tg_gemm_init(&g, bm, bn, t, acc + t * per);
      for (uint64_t k0 = 0; k0 < k; k0 += BX_TG_GEMM_BK) {
        for (uint32_t t = 0; t < BX_TG_GEMM_THREADS; t++) bx_tg_gemm_load(&g, bm, bn, k0, t, As, Bs);
        for (uint32_t t = 0; t < BX_TG_GEMM_THREADS; t++)
          bx_tg_gemm_compute(&g, k0, t, As, Bs, acc + t * per);
      }
      for (uint32_t t = 0; t < BX_TG_GEMM_THREADS; t++) bx_tg_gemm_store(&g, bm, bn, t, acc + t * per);
    }
  free(acc);
  return BX_OK;
}

static bx_status sim_gemm(const char *fn, int device, const void *a, int a_bf16, const void *b,
                          int b_bf16, int layout, float *c, size_t m, size_t n, size_t k,
                          int accumulate) {
  (void)device;
  if (k == 0 && accumulate) return BX_OK; /* the launcher's early return */
  bx_status st = gemm_fits(fn, m, n);
  if (st != BX_OK) return st;
  MEM("a", a, m * k * (a_bf16 ? 2 : 4));
  MEM("b", b, n * k * (b_bf16 ? 2 : 4));
  MEM("c", c, m * n * 4);
  st = gemm_grid(fn, a, a_bf16, b, b_bf16, layout, c, m, n, k, accumulate);
  if (st != BX_OK) return st;
  if (bx_train_device_sim_plant() && m && n) { /* the negative control's one ulp */
    uint32_t u;
    memcpy(&u, c, 4);
    u += (u & 0x7F800000u) != 0x7F800000u;
    memcpy(c, &u, 4);
  }
  return BX_OK;
}

static bx_status sim_attention_fwd(const char *fn, int device, const float *q, const float *k,
                                   const float *v, float *o, float *stats, size_t T, size_t L,
                                   size_t Hq, size_t Hkv, size_t D, float scale) {
  (void)device;
  MEM("q", q, T * Hq * D * 4);
  MEM("k", k, T * Hkv * D * 4);
  MEM("v", v, T * Hkv * D * 4);
  MEM("o", o, T * Hq * D * 4);
  MEM("stats", stats, T * Hq * 2 * 4);
  bx_tg_attn a = {q, k, v, NULL, NULL, o, stats, NULL, NULL, NULL, T, L, Hq, Hkv, D, scale};
  for (uint64_t i = 0; i < (uint64_t)T * Hq; i++) bx_tg_attn_fwd_row(&a, i);
  return BX_OK;
}

static bx_status sim_attention_bwd(const char *fn, int device, const float *dout, const float *q,
                                   const float *k, const float *v, const float *stats, float *dq,
                                   float *dk, float *dv, size_t T, size_t L, size_t Hq, size_t Hkv,
                                   size_t D, float scale) {
  (void)device;
  MEM("dout", dout, T * Hq * D * 4);
  MEM("q", q, T * Hq * D * 4);
  MEM("k", k, T * Hkv * D * 4);
  MEM("v", v, T * Hkv * D * 4);
  MEM("stats", stats, T * Hq * 2 * 4);
  MEM("dq", dq, T * Hq * D * 4);
  MEM("dk", dk, T * Hkv * D * 4);
  MEM("dv", dv, T * Hkv * D * 4);
  bx_tg_attn a = {q, k, v, dout, stats, NULL, NULL, dq, dk, dv, T, L, Hq, Hkv, D, scale};
  for (uint64_t i = 0; i < (uint64_t)T * Hq; i++) bx_tg_attn_delta_row(&a, i);
  for (uint64_t i = 0; i < (uint64_t)T * Hkv; i++) bx_tg_attn_dkdv_row(&a, i);
  for (uint64_t i = 0; i < (uint64_t)T * Hq; i++) bx_tg_attn_dq_row(&a, i);
  return BX_OK;
}

static bx_status sim_to_device(const char *fn, int device, void *dst, const void *src,
                               size_t bytes) {
  (void)device;
  MEM("the destination", dst, bytes);
  if (bytes) memcpy(dst, src, bytes);
  return BX_OK;
}

/* ---- MoE router, token dispatch, embedding, cross-entropy (grid_moe.h) ------------------- */

/* One thread per item of a grid-stride kernel: in ascending order, the
 * same as any grid (each item written by its own thread only). */
#define SIM_FOR(i, n) for (uint64_t i = 0; i < (uint64_t)(n); i++)

static size_t id_size(int i64) { return i64 ? 8 : 4; }

/* The largest of n ids (int32 or int64; n > 0): the rows a gather reads. */
static int64_t max_id(const void *ids, int i64, uint64_t n) {
  int64_t m = 0;
  for (uint64_t i = 0; i < n; i++) {
    int64_t v = bx_tg_id(ids, i64, i);
    m = v > m ? v : m;
  }
  return m;
}

static bx_status sim_router_fwd(const char *fn, int device, const float *logits, const float *bias,
                                void *ids, int ids_i64, float *weights, int64_t *counts, size_t T,
                                size_t chunk, size_t nchunks, const bx_router_cfg *q) {
  (void)device;
  const size_t E = (size_t)q->E, k = (size_t)q->k;
  int run_count = counts && nchunks;
  if (T) {
    MEM("logits", logits, T * E * 4);
    MEM("bias", bias, E * 4);
    MEM("topk_ids", ids, T * k * id_size(ids_i64));
    MEM("topk_weights", weights, T * k * 4);
  }
  if (run_count) {
    MEM("topk_ids", ids, T * k * id_size(ids_i64));
    MEM("counts", counts, nchunks * E * 8);
  }
  bx_tg_router a = {logits, bias, NULL, ids,    ids_i64, weights, NULL, counts,
                    T,      chunk, nchunks, *q, 0.0};
  if (T) SIM_FOR(t, T) bx_tg_router_fwd_token(&a, t);
  if (run_count) SIM_FOR(i, (uint64_t)nchunks * E) bx_tg_router_count(&a, i); /* after the tokens */
  return BX_OK;
}

static bx_status sim_router_bwd(const char *fn, int device, const float *logits, const void *ids,
                                int ids_i64, const float *dw, float *dl, size_t T, size_t E, size_t k,
                                int norm, double r) {
  (void)device;
  if (!T) return BX_OK; /* no launch */
  MEM("logits", logits, T * E * 4);
  MEM("topk_ids", ids, T * k * id_size(ids_i64));
  MEM("dweights", dw, T * k * 4);
  MEM("dlogits", dl, T * E * 4);
  bx_router_cfg q = {(int64_t)E, 1, (int64_t)E, 1, (int64_t)k, norm, 0.0f};
  bx_tg_router a = {logits, NULL, dw, (void *)(uintptr_t)ids, ids_i64, NULL, dl, NULL,
                    T,      0,    0,  q,                      r};
  SIM_FOR(t, T) bx_tg_router_bwd_token(&a, t);
  return BX_OK;
}

static bx_status sim_moe_permute(const char *fn, int device, const float *x, const int64_t *row_map,
                                 float *x_perm, size_t R, size_t H) {
  (void)device;
  if (!(R && H)) return BX_OK; /* no launch */
  MEM("row_map", row_map, R * 2 * 8);
  /* x's rows: the tokens row_map names (the launcher does not know T) */
  int64_t rows = 0;
  for (size_t r = 0; r < R; r++) rows = row_map[2 * r] + 1 > rows ? row_map[2 * r] + 1 : rows;
  MEM("x", x, (size_t)rows * H * 4);
  MEM("x_perm", x_perm, R * H * 4);
  bx_tg_permute a = {x, NULL, NULL, NULL, row_map, NULL, x_perm, NULL, 0, 0, H, R};
  SIM_FOR(i, (uint64_t)R * H) bx_tg_permute_elem(&a, i);
  return BX_OK;
}

static bx_status sim_moe_permute_bwd(const char *fn, int device, const float *dx_perm,
                                     const int64_t *pos, float *dx, size_t T, size_t k, size_t H) {
  (void)device;
  if (!(T && H)) return BX_OK; /* no launch */
  MEM("dx_perm", dx_perm, T * k * H * 4);
  MEM("pos", pos, T * k * 8);
  MEM("dx", dx, T * H * 4);
  bx_tg_permute a = {dx_perm, NULL, NULL, NULL, NULL, pos, dx, NULL, T, k, H, T * k};
  SIM_FOR(i, (uint64_t)T * H) bx_tg_permute_bwd_elem(&a, i);
  return BX_OK;
}

static bx_status sim_moe_unpermute(const char *fn, int device, const float *y_perm, const float *w,
                                   const int64_t *pos, const float *initial, float *out, size_t T,
                                   size_t k, size_t H) {
  (void)device;
  if (!(T && H)) return BX_OK; /* no launch */
  MEM("y_perm", y_perm, T * k * H * 4);
  MEM("weights", w, T * k * 4);
  MEM("pos", pos, T * k * 8);
  if (initial) MEM("initial", initial, T * H * 4);
  MEM("out", out, T * H * 4);
  bx_tg_permute a = {y_perm, w, initial, NULL, NULL, pos, out, NULL, T, k, H, T * k};
  SIM_FOR(i, (uint64_t)T * H) bx_tg_unpermute_elem(&a, i);
  return BX_OK;
}

static bx_status sim_moe_unpermute_bwd(const char *fn, int device, const float *dout,
                                       const float *y_perm, const float *w, const int64_t *row_map,
                                       const int64_t *pos, float *dy_perm, float *dweights, size_t T,
                                       size_t k, size_t H) {
  (void)device;
  size_t R = T * k;
  int run_dy = dy_perm && R && H, run_dw = dweights && T && k;
  if (run_dy) {
    MEM("dout", dout, T * H * 4);
    MEM("weights", w, T * k * 4);
    MEM("row_map", row_map, R * 2 * 8);
    MEM("dy_perm", dy_perm, R * H * 4);
  }
  if (run_dw) {
    MEM("dout", dout, T * H * 4);
    MEM("y_perm", y_perm, R * H * 4);
    MEM("pos", pos, T * k * 8);
    MEM("dweights", dweights, T * k * 4);
  }
  bx_tg_permute a = {y_perm, w, NULL, dout, row_map, pos, dy_perm, dweights, T, k, H, R};
  if (run_dy) SIM_FOR(i, (uint64_t)R * H) bx_tg_unpermute_dy_elem(&a, i);
  if (run_dw) SIM_FOR(i, (uint64_t)T * k) bx_tg_unpermute_dw_slot(&a, i);
  return BX_OK;
}

static bx_status sim_embedding_fwd(const char *fn, int device, const float *weight, const void *ids,
                                   int ids_i64, float *y, size_t T, size_t H) {
  (void)device;
  if (!(T && H)) return BX_OK; /* no launch */
  MEM("ids", ids, T * id_size(ids_i64));
  /* weight's rows: up to the largest id (the launcher does not know V) */
  MEM("weight", weight, ((size_t)max_id(ids, ids_i64, T) + 1) * H * 4);
  MEM("y", y, T * H * 4);
  bx_tg_embedding a = {weight, NULL, ids, ids_i64, y, NULL, NULL, T, H, 0, 0};
  SIM_FOR(i, (uint64_t)T * H) bx_tg_embedding_fwd_elem(&a, i);
  return BX_OK;
}

static bx_status sim_embedding_bwd(const char *fn, int device, const void *ids, int ids_i64,
                                   const float *dy, const int64_t *row_ids, const int64_t *offsets,
                                   float *rows, size_t T, size_t H, size_t chunk, size_t nchunks,
                                   size_t total) {
  (void)device;
  uint64_t n = (uint64_t)total * H;
  if (!n) return BX_OK; /* no launch */
  MEM("ids", ids, T * id_size(ids_i64));
  MEM("dy", dy, T * H * 4);
  MEM("row_ids", row_ids, total * 8);
  MEM("offsets", offsets, (nchunks + 1) * 8);
  MEM("rows", rows, total * H * 4);
  bx_tg_embedding a = {NULL, dy, ids, ids_i64, rows, row_ids, offsets, T, H, chunk, nchunks};
  SIM_FOR(i, n) bx_tg_embedding_bwd_elem(&a, i);
  return BX_OK;
}

static bx_status sim_xent(const char *fn, int device, const float *z, const void *targets,
                          int targets_i64, int64_t ignore_index, float *g, float *losses,
                          float *partials, int64_t *counts, size_t T, size_t V, size_t chunk,
                          size_t nchunks, double c) {
  (void)device;
  int run_chunk = (partials || counts) && nchunks;
  if (T) {
    MEM("logits", z, T * V * 4);
    MEM("targets", targets, T * id_size(targets_i64));
    if (g) MEM("dlogits", g, T * V * 4);
    if (losses) MEM("losses", losses, T * 4);
  }
  if (run_chunk) {
    MEM("targets", targets, T * id_size(targets_i64));
    MEM("losses", losses, T * 4);
    if (partials) MEM("loss partials", partials, nchunks * 4);
    if (counts) MEM("counts", counts, nchunks * 8);
  }
  bx_tg_xent a = {z, targets, targets_i64, ignore_index, g, losses, partials, counts,
                  T, V,       chunk,       nchunks,      c};
  if (T) SIM_FOR(t, T) bx_tg_xent_row(&a, t);
  if (run_chunk) SIM_FOR(i, nchunks) bx_tg_xent_chunk(&a, i); /* after the rows */
  return BX_OK;
}

/* ---- the token reduction (grid_tokred.h; tokred.cu) ---------------------------------------
 * The device scratch arena is host scratch here (malloc'd per call): the
 * launchers' results come back to host memory anyway. The atomics are
 * plain integer ops in the order the threads run (+ modulo 2^64, max,
 * min): any order gives the same words. */

/* train_table.cu's launch-geometry test hook (BITEXACT_TEST_CUDA_BLOCKS=N
 * caps the grid-stride kernels at N blocks), read once. */
static unsigned g_max_blocks;
static pthread_once_t g_max_blocks_once = PTHREAD_ONCE_INIT;

static void read_max_blocks(void) {
  const char *e = getenv("BITEXACT_TEST_CUDA_BLOCKS");
  long v = e ? strtol(e, NULL, 10) : 0;
  g_max_blocks = v > 0 && v <= 65535 ? (unsigned)v : 0u;
}

/* bx_cut_launch's block count for items. */
static uint32_t launch_blocks(uint64_t items) {
  pthread_once(&g_max_blocks_once, read_max_blocks);
  uint32_t blocks = bx_tg_blocks(items);
  return g_max_blocks && blocks > g_max_blocks ? g_max_blocks : blocks;
}

/* tokred.cu's tk_res: the device's result words. */
typedef struct tk_res {
  uint32_t mx_w, mx_b;
  uint64_t nf_w, nf_b, bad_w, bad_b;
  float bad_value;
} tk_res;

/* tk_res_clear: maxima and counts 0, firsts all ones. */
static void tk_res_clear(tk_res *r) {
  memset(r, 0, sizeof *r);
  r->bad_w = r->bad_b = UINT64_MAX;
}

/* A thread's end: its atomicMax, atomicAdd, atomicMin. */
static void tk_atomics(const bx_tgt_acc *s, uint32_t *mx, uint64_t *nf, uint64_t *bad) {
  if (s->mx && s->mx > *mx) *mx = s->mx;
  if (s->nf) *nf += (uint64_t)s->nf;
  if (s->bad != UINT64_MAX && s->bad < *bad) *bad = s->bad;
}

static void tk_res_out(const tk_res *r, int weight, bx_tokred_dev_res *out) {
  out->mx = weight ? r->mx_w : r->mx_b;
  out->nf = (int64_t)(weight ? r->nf_w : r->nf_b);
  out->bad = weight ? r->bad_w : r->bad_b;
  out->bad_value = weight ? r->bad_value : 0.0f;
}

static void *tk_scratch(size_t bytes) { return calloc(bytes ? bytes : 1, 1); }

#define TK_NOMEM(bytes)                                                                    \
  bx_fail(BX_ENOMEM, "%s: reserving the token reduction's (simulated) scratch: %zu bytes", \
          fn, (size_t)(bytes))

static bx_status sim_tokred_maxabs(const char *fn, int device, const void *a, int a_bf16,
                                   size_t rows, size_t cols, size_t chunk, uint32_t *mx) {
  (void)device;
  size_t nch = rows / chunk + (rows % chunk != 0);
  if (nch == 0) return BX_OK;
  uint32_t *base = tk_scratch(nch * sizeof *base); /* zeroed (the memset) */
  if (!base) return TK_NOMEM(nch * sizeof *base);
  bx_tgt_maxabs m = {a, a_bf16, rows, cols, chunk, nch, base};
  uint64_t per = (uint64_t)(chunk < rows ? chunk : rows) * cols; /* elements of a chunk */
  uint64_t gy = (per + 16 * BX_TG_BLOCK - 1) / (16 * BX_TG_BLOCK);
  unsigned gx = nch > BX_TG_MAX_BLOCKS ? BX_TG_MAX_BLOCKS : (unsigned)nch;
  gy = gy < 1 ? 1 : gy > BX_TG_MAX_BLOCKS ? BX_TG_MAX_BLOCKS : gy;
  if (per) {
    bx_status st = sim_mem(fn, "the operand", a, rows * cols * (a_bf16 ? 2 : 4));
    if (st != BX_OK) {
      free(base);
      return st;
    }
    const uint32_t nt = (uint32_t)gy * BX_TG_BLOCK;
    for (uint64_t by = 0; by < gy; by++)
      for (uint64_t bx = 0; bx < gx; bx++)
        for (uint32_t t = 0; t < BX_TG_BLOCK; t++) {
          uint32_t tid = (uint32_t)by * BX_TG_BLOCK + t;
          if (tid >= per) continue; /* no element in any chunk: max 0, no atomic */
          for (uint64_t c = bx; c < nch; c += gx) {
            uint32_t v = bx_tgt_maxabs_thread(&m, c, tid, nt);
            if (v && v > base[c]) base[c] = v; /* atomicMax */
          }
        }
  }
  memcpy(mx, base, nch * sizeof *mx); /* to the host */
  free(base);
  return BX_OK;
}

static bx_status sim_tokred_grid(const char *fn, int device, const float *a, size_t n,
                                 double inv_step, uint32_t lim, int64_t *q,
                                 bx_tokred_dev_res *res) {
  (void)device;
  int64_t *qd = tk_scratch(n * sizeof *qd);
  if (!qd) return TK_NOMEM(n * sizeof *qd);
  tk_res r;
  tk_res_clear(&r);
  bx_tgt_grid g = {a, n, inv_step, lim, qd};
  if (n) {
    bx_status st = sim_mem(fn, "the partial", a, n * 4);
    if (st != BX_OK) {
      free(qd);
      return st;
    }
    uint32_t blocks = launch_blocks(n);
    uint64_t stride = (uint64_t)blocks * BX_TG_BLOCK;
    for (uint64_t i0 = 0; i0 < stride && i0 < n; i0++) { /* thread i0 (threads past n: nothing) */
      bx_tgt_acc s;
      bx_tgt_acc_init(&s);
      bx_tgt_grid_thread(&g, i0, stride, &s);
      tk_atomics(&s, &r.mx_w, &r.nf_w, &r.bad_w);
    }
  }
  if (r.bad_w < n) r.bad_value = a[r.bad_w]; /* the copy of the breaking element */
  if (n) memcpy(q, qd, n * sizeof *q);
  free(qd);
  tk_res_out(&r, 1, res);
  return BX_OK;
}


/* bx_cut_tokred_wgrad_kernel over grid (gx, gy, t->zgroups): per block, per
 * chunk, the GEMM's phases between the barriers and the epilogue; then
 * every thread's atomics. */
static bx_status tk_wgrad_weight(const char *fn, const bx_tgt_wgrad *t, uint64_t gx, uint64_t gy,
                                 tk_res *r) {
  const size_t per = BX_TG_GEMM_TM * BX_TG_GEMM_TN;
  float As[BX_TG_GEMM_BK * BX_TG_GEMM_BM], Bs[BX_TG_GEMM_BK * BX_TG_GEMM_BN];
  float *acc = malloc(BX_TG_GEMM_THREADS * per * sizeof *acc);
  bx_tgt_acc *st = malloc(BX_TG_GEMM_THREADS * sizeof *st);
  if (!acc || !st) {
    free(acc);
    free(st);
    return bx_fail(BX_ENOMEM, "%s: the simulated weight-gradient kernel's registers", fn);
  }
  for (uint64_t z = 0; z < t->zgroups; z++)
    for (uint64_t bn = 0; bn < gy; bn++)
      for (uint64_t bm = 0; bm < gx; bm++) {
        for (uint32_t i = 0; i < BX_TG_GEMM_THREADS; i++) bx_tgt_acc_init(&st[i]);
        for (uint64_t c = z; c < t->nchunks; c += t->zgroups) {
          bx_tg_gemm g = bx_tgt_wgrad_gemm(t, c);
          for (uint32_t i = 0; i < BX_TG_GEMM_THREADS; i++) bx_tg_gemm_init(&g, bm, bn, i, acc + i * per);
          for (uint64_t k0 = 0; k0 < g.k; k0 += BX_TG_GEMM_BK) {
            for (uint32_t i = 0; i < BX_TG_GEMM_THREADS; i++) bx_tg_gemm_load(&g, bm, bn, k0, i, As, Bs);
            for (uint32_t i = 0; i < BX_TG_GEMM_THREADS; i++)
              bx_tg_gemm_compute(&g, k0, i, As, Bs, acc + i * per);
          }
          for (uint32_t i = 0; i < BX_TG_GEMM_THREADS; i++)
            bx_tgt_wgrad_epi(t, &g, c, bm, bn, i, acc + i * per, &st[i]);
        }
        for (uint32_t i = 0; i < BX_TG_GEMM_THREADS; i++) {
          for (uint32_t o = 0; o < per; o++) {
            uint64_t at = bx_tgt_wgrad_out(t, bm, bn, i, o);
            if (at != UINT64_MAX && st[i].q[o] != 0) /* atomicAdd, modulo 2^64 */
              t->qw[at] = (int64_t)((uint64_t)t->qw[at] + (uint64_t)st[i].q[o]);
          }
          tk_atomics(&st[i], &r->mx_w, &r->nf_w, &r->bad_w);
        }
      }
  free(acc);
  free(st);
  return BX_OK;
}

/* bx_cut_tokred_bias_kernel: a grid-stride kernel over t->zgroups * n items. */
static void tk_wgrad_bias(const bx_tgt_wgrad *t, tk_res *r) {
  uint64_t items = t->zgroups * t->n;
  uint32_t blocks = launch_blocks(items);
  uint64_t stride = (uint64_t)blocks * BX_TG_BLOCK;
  for (uint64_t i0 = 0; i0 < stride && i0 < items; i0++) { /* thread i0 (threads past items: nothing) */
    bx_tgt_acc s;
    bx_tgt_acc_init(&s);
    for (uint64_t i = i0; i < items; i += stride) {
      int64_t q;
      bx_tgt_bias_item(t, i, &q, &s);
      if (q != 0) t->qb[i % t->n] = (int64_t)((uint64_t)t->qb[i % t->n] + (uint64_t)q);
    }
    tk_atomics(&s, &r->mx_b, &r->nf_b, &r->bad_b);
  }
}

static bx_status sim_tokred_wgrad(const char *fn, int device, const bx_tokred_dev_wgrad *w,
                                  int64_t *qw, int64_t *qb, bx_tokred_dev_res *rw,
                                  bx_tokred_dev_res *rb) {
  (void)device;
  uint64_t gx = (w->n + BX_TG_GEMM_BM - 1) / BX_TG_GEMM_BM, gy = (w->k + BX_TG_GEMM_BN - 1) / BX_TG_GEMM_BN;
  if (w->do_w && (gx > 0x7FFFFFFFu || gy > 65535u))
    return bx_fail(BX_EINVAL, "%s: a %zu x %zu weight exceeds the CUDA kernel's grid (at most "
                   "2^31 - 1 row tiles and 65535 column tiles of 64)", fn, w->n, w->k);
  size_t nk = w->do_w ? w->n * w->k : 0, nb = w->do_b ? w->n : 0;
  if (nk) {
    MEM("dy", w->dy, w->t * w->n * (w->dy_bf16 ? 2 : 4));
    MEM("x", w->x, w->t * w->k * (w->x_bf16 ? 2 : 4));
  }
  if (nb) MEM("dy", w->dy, w->t * w->n * (w->dy_bf16 ? 2 : 4));
  int64_t *q = tk_scratch((nk + nb) * sizeof *q); /* zeroed (the memset) */
  if (!q) return TK_NOMEM((nk + nb) * sizeof *q);
  tk_res r;
  tk_res_clear(&r);
  bx_tgt_wgrad t = bx_tgt_wgrad_of(w, gx * gy);
  t.qw = q;
  t.qb = q + nk;
  bx_status st = BX_OK;
  if (nk) st = tk_wgrad_weight(fn, &t, gx, gy, &r);
  if (st == BX_OK && nb) {
    bx_tgt_wgrad tb = t;
    tb.zgroups = bx_tgt_zgroups((w->n + BX_TG_BLOCK - 1) / BX_TG_BLOCK, w->nchunks);
    tk_wgrad_bias(&tb, &r);
  }
  if (st == BX_OK) {
    if (nk) memcpy(qw, t.qw, nk * sizeof *qw);
    if (nb) memcpy(qb, t.qb, nb * sizeof *qb);
    tk_res_out(&r, 1, rw);
    tk_res_out(&r, 0, rb);
  }
  free(q);
  return st;
}

static bx_status sim_tokred_wgrad_chunk(const char *fn, int device, const bx_tokred_dev_wgrad *w,
                                        size_t c, float *pw, float *pb) {
  (void)device;
  size_t nk = pw ? w->n * w->k : 0, nb = pb ? w->n : 0;
  bx_tgt_wgrad t = bx_tgt_wgrad_of(w, 1);
  uint64_t r0, r1;
  bx_tgt_chunk_rows(&t, c, &r0, &r1);
  float *dw = tk_scratch((nk + nb) * sizeof *dw), *db = dw ? dw + nk : NULL;
  if (!dw) return TK_NOMEM((nk + nb) * sizeof *dw);
  bx_status st = BX_OK;
  if (nk) { /* gemm.cu's TN launcher on the chunk's rows (its checks; the scratch is the device's) */
    bx_tg_gemm g = bx_tgt_wgrad_gemm(&t, c);
    st = gemm_fits(fn, g.m, g.n);
    if (st == BX_OK) st = sim_mem(fn, "a", g.a, g.m * g.k * (g.a_bf16 ? 2 : 4));
    if (st == BX_OK) st = sim_mem(fn, "b", g.b, g.n * g.k * (g.b_bf16 ? 2 : 4));
    if (st == BX_OK) st = gemm_grid(fn, g.a, g.a_bf16, g.b, g.b_bf16, 2, dw, g.m, g.n, g.k, 0);
  }
  if (st == BX_OK && nb) { /* bx_cut_tokred_bias_chunk_kernel: one thread per column */
    st = sim_mem(fn, "dy", (const char *)w->dy + r0 * w->n * (w->dy_bf16 ? 2 : 4),
                 (r1 - r0) * w->n * (w->dy_bf16 ? 2 : 4));
    if (st == BX_OK) SIM_FOR(j, nb) db[j] = bx_tgt_bias_partial(&t, c, j);
  }
  if (st == BX_OK && nk) memcpy(pw, dw, nk * sizeof *pw);
  if (st == BX_OK && nb) memcpy(pb, db, nb * sizeof *pb);
  free(dw);
  return st;
}

/* math.cu's bx_cut_math: one thread per element. */
static bx_status sim_math(const char *fn, int device, int op, const float *x, void *y, size_t n) {
  (void)device;
  MEM("x", x, n * 4);
  MEM("y", y, n * (op == BX_TDEV_ROUND_BF16 ? 2 : 4));
  bx_tgm_math a = {x, y, n, op};
  for (uint64_t i = 0; i < n; i++) bx_tgm_math_elem(&a, i);
  return BX_OK;
}

/* math.cu's bx_cut_rope_table: one thread per (token, slot). */
static bx_status sim_rope_table(const char *fn, int device, const int64_t *pos, float *cos,
                                float *sin, size_t tokens, size_t half, float theta) {
  (void)device;
  MEM("positions", pos, tokens * 8);
  MEM("cos", cos, tokens * half * 4);
  MEM("sin", sin, tokens * half * 4);
  bx_tgm_rope_table a = {pos, cos, sin, tokens, half, 2 * (uint64_t)half, theta};
  for (uint64_t i = 0; i < (uint64_t)tokens * half; i++) bx_tgm_rope_table_item(&a, i);
  return BX_OK;
}

/* math.cu's bx_cut_bias_partials: one thread per (chunk, column). */
static bx_status sim_bias_partials(const char *fn, int device, const void *dy, int dy_bf16,
                                   size_t t, size_t n, size_t chunk, size_t nchunks,
                                   float *partials) {
  (void)device;
  MEM("dy", dy, t * n * (dy_bf16 ? 2 : 4));
  MEM("partials", partials, nchunks * n * 4);
  bx_tgt_wgrad w = bx_tgm_bias_args(dy, dy_bf16, t, n, chunk, nchunks);
  for (uint64_t i = 0; i < (uint64_t)nchunks * n; i++) bx_tgm_bias_item(&w, partials, i);
  return BX_OK;
}

const bx_train_device bx_hostsim_train = {
    .name = "cuda (host simulation)",
    .swiglu_fwd = sim_swiglu_fwd,
    .swiglu_bwd = sim_swiglu_bwd,
    .adamw = sim_adamw,
    .rmsnorm_fwd = sim_rmsnorm_fwd,
    .rmsnorm_bwd = sim_rmsnorm_bwd,
    .rope = sim_rope,
    .gemm = sim_gemm,
    .to_host = sim_to_host,
    .alloc_managed = sim_alloc,
    .free_managed = sim_free,
    .usable = sim_usable,
    .attention_fwd = sim_attention_fwd,
    .attention_bwd = sim_attention_bwd,
    .to_device = sim_to_device,
    .router_fwd = sim_router_fwd,
    .router_bwd = sim_router_bwd,
    .moe_permute = sim_moe_permute,
    .moe_permute_bwd = sim_moe_permute_bwd,
    .moe_unpermute = sim_moe_unpermute,
    .moe_unpermute_bwd = sim_moe_unpermute_bwd,
    .embedding_fwd = sim_embedding_fwd,
    .embedding_bwd = sim_embedding_bwd,
    .xent = sim_xent,
    .tokred_maxabs = sim_tokred_maxabs,
    .tokred_grid = sim_tokred_grid,
    .tokred_wgrad = sim_tokred_wgrad,
    .tokred_wgrad_chunk = sim_tokred_wgrad_chunk,
    .math = sim_math,
    .rope_table = sim_rope_table,
    .bias_partials = sim_bias_partials,
};
