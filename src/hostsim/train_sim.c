/*
 * train_sim.c — the host simulation of the training kernels' device backend
 * (train_device.h's bx_hostsim_train): every launcher of src/cuda/train
 * mirrored on the calling thread, the same grids over the same thread
 * bodies (src/cuda/train/train_grid.h; the arithmetic is the src/common
 * _hd.h headers'), kernels in the launchers' order, the GEMM's blocks phase
 * by phase between its barriers.
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
#include "train_device.h"
#include "grid_attention.h"
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

static bx_status sim_gemm(const char *fn, int device, const void *a, int a_bf16, const void *b,
                          int b_bf16, int layout, float *c, size_t m, size_t n, size_t k,
                          int accumulate) {
  (void)device;
  if (k == 0 && accumulate) return BX_OK; /* the launcher's early return */
  MEM("a", a, m * k * (a_bf16 ? 2 : 4));
  MEM("b", b, n * k * (b_bf16 ? 2 : 4));
  MEM("c", c, m * n * 4);
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
};
