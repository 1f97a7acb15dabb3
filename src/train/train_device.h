/*
 * train_device.h — the training kernels' device backend: the launchers a
 * backend implements (the src/cuda/train .cu files for CUDA), reached from the
 * public entries of bitexact_train.h when every tensor of a call is a
 * kDLCUDA tensor of one device (train_check.h bx_tc_place_of). The
 * arithmetic of every launcher is the CPU's own (the src/common _hd.h headers), so a
 * device call gives the CPU call's bits (issue 30; docs/cuda.md says what
 * has and has not run on a GPU).
 *
 * The entries have checked everything before a launcher is called: shapes,
 * dtypes, layouts, overlaps, options; pointers are device addresses of
 * dense row-major tensors on device `device`. A launcher selects the
 * device, enqueues its kernels on the legacy default stream, waits for
 * them and returns BX_OK, or BX_EDEVICE / BX_ENOMEM with the CUDA text in
 * bx_last_error() (a CUDA error another library left pending stays for it
 * to see). Nothing here allocates device memory, except the token
 * reduction's launchers (their grow-only scratch arena, below).
 *
 * src/train reaches a backend only through this table, registered in
 * train_devices.c (one line per backend); a backend includes nothing of
 * src/train but this header.
 */
#ifndef BX_TRAIN_DEVICE_H
#define BX_TRAIN_DEVICE_H

#include <stddef.h>
#include <stdint.h>

#include "adamw_hd.h"
#include "bitexact.h"
#include "router_hd.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What a token-reduction launcher found (host memory). */
typedef struct bx_tokred_dev_res {
  uint32_t mx;     /* the largest finite |bits| of the elements (0: none) */
  int64_t nf;      /* NaN and Inf elements */
  uint64_t bad;    /* the first element (wgrad: local chunk) with a finite |bits| >= lim,
                      or UINT64_MAX */
  float bad_value; /* tokred_grid: element bad's value (when bad is one) */
} bx_tokred_dev_res;

/* bx_linear_wgrad's work on the device: dy [t, n] and x [t, k] (device,
 * fp32 or bf16; x unused without do_w), local chunks of chunk rows (the
 * rows start on a chunk boundary; nchunks = ceil(t / chunk) >= 1), the
 * grids' 2^-e and the bounds' |bits| limits. */
typedef struct bx_tokred_dev_wgrad {
  const void *dy, *x;
  int dy_bf16, x_bf16;
  size_t t, n, k, chunk, nchunks;
  double inv_w, inv_b;
  uint32_t lim_w, lim_b;
  int do_w, do_b;
} bx_tokred_dev_wgrad;

/* The elementwise math entries' ops (the math member): bx_exp ... bx_cos
 * (fp32 -> fp32) and bx_round_bf16 (fp32 -> bf16). */
typedef enum bx_tdev_math_op {
  BX_TDEV_EXP,
  BX_TDEV_LOG,
  BX_TDEV_SIGMOID,
  BX_TDEV_SILU,
  BX_TDEV_RSQRT,
  BX_TDEV_SIN,
  BX_TDEV_COS,
  BX_TDEV_ROUND_BF16
} bx_tdev_math_op;

typedef struct bx_train_device {
  const char *name;
  /* SwiGLU over rows x f elements; row strides in elements (ld*). */
  bx_status (*swiglu_fwd)(const char *fn, int device, const float *g, const float *u, float *h,
                          size_t rows, size_t f, size_t ldg, size_t ldu, size_t ldh);
  bx_status (*swiglu_bwd)(const char *fn, int device, const float *g, const float *u,
                          const float *dh, float *dg, float *du, size_t rows, size_t f,
                          size_t ldg, size_t ldu, size_t ldh, size_t lddg, size_t lddu);
  /* AdamW over n elements with the call's fp32 scalars. */
  bx_status (*adamw)(const char *fn, int device, float *p, const float *g, float *m, float *v,
                     size_t n, const bx_adamw_scalars *s);
  /* RMSNorm forward: rows x h; rstd may be NULL. */
  bx_status (*rmsnorm_fwd)(const char *fn, int device, const float *x, const float *w, float *y,
                           float *rstd, size_t rows, size_t h, float eps);
  /* RMSNorm backward: dx (may be dy exactly) and, unless partials is NULL,
   * the [nchunks, h] weight-gradient partials over chunks of chunk rows
   * (computed before dx is written). */
  bx_status (*rmsnorm_bwd)(const char *fn, int device, const float *x, const float *w,
                           const float *dy, const float *rstd, float *dx, float *partials,
                           size_t rows, size_t h, size_t chunk, size_t nchunks);
  /* RoPE on tokens x width (heads of head_dim), the first 2 * half features
   * of each head rotated, the rest copied (unless y is x); positions on the
   * device, already checked (0 <= pos <= 2^24); sin_sign +1 / -1. */
  bx_status (*rope)(const char *fn, int device, const float *x, float *y, const int64_t *pos,
                    size_t tokens, size_t width, size_t head_dim, size_t half, size_t rotary_dim,
                    float theta, float sin_sign);
  /* C (m x n, row-major) = A . op(B) (+ C with accumulate) in bx_gemm's
   * layouts; a_bf16 / b_bf16: the operand holds bf16. */
  bx_status (*gemm)(const char *fn, int device, const void *a, int a_bf16, const void *b,
                    int b_bf16, int layout, float *c, size_t m, size_t n, size_t k,
                    int accumulate);
  /* bytes from device memory to the host (the checks of device data that
   * decide an error: RoPE's positions). */
  bx_status (*to_host)(const char *fn, int device, void *dst, const void *src, size_t bytes);
  /* Managed (unified) memory for kDLCUDAManaged tensors: bytes (> 0) readable
   * and writable by the host and the device, zeroed, aligned to 64 bytes;
   * BX_ENOMEM / BX_EDEVICE naming fn. free_managed(NULL) does nothing; it
   * waits for the device's work (the model frees only between steps). */
  bx_status (*alloc_managed)(const char *fn, size_t bytes, void **ptr);
  void (*free_managed)(void *ptr);
  /* BX_OK when a device can run this backend's kernels now (a CUDA device
   * is present and the driver loads), else BX_EDEVICE with the reason. */
  bx_status (*usable)(const char *fn);
  /* ---- MoE router, token dispatch, embedding, cross-entropy (issue 30) ---- */
  /* bytes from the host to device memory (a host decision a kernel reads:
   * embedding backward's row ids and offsets). */
  bx_status (*to_device)(const char *fn, int device, void *dst, const void *src, size_t bytes);
  /* MoE router forward over T tokens (logits NaN-free and bias finite,
   * checked on the host; q checked, q->E <= 256, q->k <= 32): ids [T, k]
   * int32 or (ids_i64) int64, weights [T, k]; counts NULL or [nchunks, E]
   * int64 over chunks of chunk tokens. */
  bx_status (*router_fwd)(const char *fn, int device, const float *logits, const float *bias,
                          void *ids, int ids_i64, float *weights, int64_t *counts, size_t T,
                          size_t chunk, size_t nchunks, const bx_router_cfg *q);
  /* MoE router backward: dl [T, E] from logits [T, E], ids [T, k] (checked:
   * distinct, in [0, E); k <= 32) and dw [T, k]; r = f64(f32(scaling)). */
  bx_status (*router_bwd)(const char *fn, int device, const float *logits, const void *ids,
                          int ids_i64, const float *dw, float *dl, size_t T, size_t E, size_t k,
                          int norm, double r);
  /* x_perm [R, H] = x's rows row_map[r][0] (row_map checked). */
  bx_status (*moe_permute)(const char *fn, int device, const float *x, const int64_t *row_map,
                           float *x_perm, size_t R, size_t H);
  /* dx [T, H] = the gather sums of dx_perm's rows pos[t][*] (plan checked). */
  bx_status (*moe_permute_bwd)(const char *fn, int device, const float *dx_perm,
                               const int64_t *pos, float *dx, size_t T, size_t k, size_t H);
  /* out [T, H] = sum_j w[t][j] * y_perm[pos[t][j]] (+ initial, may be NULL). */
  bx_status (*moe_unpermute)(const char *fn, int device, const float *y_perm, const float *w,
                             const int64_t *pos, const float *initial, float *out, size_t T,
                             size_t k, size_t H);
  /* dy_perm [R, H] (NULL: not computed) and dweights [T, k] (NULL: not
   * computed) of the unpermute; R = T * k (plan checked). */
  bx_status (*moe_unpermute_bwd)(const char *fn, int device, const float *dout,
                                 const float *y_perm, const float *w, const int64_t *row_map,
                                 const int64_t *pos, float *dy_perm, float *dweights, size_t T,
                                 size_t k, size_t H);
  /* y [T, H] = weight's rows ids[t] (ids int32 or int64, checked in [0, V)). */
  bx_status (*embedding_fwd)(const char *fn, int device, const float *weight, const void *ids,
                             int ids_i64, float *y, size_t T, size_t H);
  /* rows [total, H]: the compact chunk partials of dy [T, H] for the host's
   * row_ids [total] and offsets [nchunks + 1] (already on the device: the
   * call's outputs, written with to_device), chunks of chunk tokens. */
  bx_status (*embedding_bwd)(const char *fn, int device, const void *ids, int ids_i64,
                             const float *dy, const int64_t *row_ids, const int64_t *offsets,
                             float *rows, size_t T, size_t H, size_t chunk, size_t nchunks,
                             size_t total);
  /* Cross-entropy over T rows of V logits (targets int32 or int64, checked):
   * losses (may be NULL), dlogits g (may be NULL or z exactly; c the
   * gradient's factor), then per chunk of chunk tokens the loss partials
   * and counts (each may be NULL; with either, losses is not NULL). */
  bx_status (*xent)(const char *fn, int device, const float *z, const void *targets,
                    int targets_i64, int64_t ignore_index, float *g, float *losses,
                    float *partials, int64_t *counts, size_t T, size_t V, size_t chunk,
                    size_t nchunks, double c);
  /* ---- the token reduction (tokred.c, wgrad.c; src/cuda/train/tokred.cu) ----
   * These launchers keep device scratch (the q words, the maxima) in a
   * grow-only arena of the calling thread (never freed during a call;
   * freed when the thread exits); the results come back to host memory,
   * where the state's words live. */
  /* mx[0..nchunks) (host) := the largest finite |bits| (fp32 bits; bf16
   * widened, a_bf16) of each chunk of chunk rows of a [rows, cols] (the
   * last chunk may be shorter; nchunks = ceil(rows / chunk) >= 1). */
  bx_status (*tokred_maxabs)(const char *fn, int device, const void *a, int a_bf16, size_t rows,
                             size_t cols, size_t chunk, uint32_t *mx);
  /* The grid add of one partial a[0..n) (fp32, device): q[i] (host) :=
   * bx_tokred_q(a[i], inv_step) (0 for a non-finite element), and *res. */
  bx_status (*tokred_grid)(const char *fn, int device, const float *a, size_t n, double inv_step,
                           uint32_t lim, int64_t *q, bx_tokred_dev_res *res);
  /* The chunked weight (do_w) and bias (do_b) partials of w, rounded onto
   * their grids and summed over the chunks: qw [n * k], qb [n] (host), and
   * *rw, *rb (bad: the first local chunk with a breaking element). */
  bx_status (*tokred_wgrad)(const char *fn, int device, const bx_tokred_dev_wgrad *w,
                            int64_t *qw, int64_t *qb, bx_tokred_dev_res *rw, bx_tokred_dev_res *rb);
  /* Local chunk c's weight partial (pw [n * k], unless NULL) and bias
   * partial (pb [n], unless NULL), in host memory: the error messages'
   * partial and the ordinary mode's addends. */
  bx_status (*tokred_wgrad_chunk)(const char *fn, int device, const bx_tokred_dev_wgrad *w,
                                  size_t c, float *pw, float *pb);
  /* Causal GQA attention forward (bitexact_train_layers.h) over T = B * L
   * tokens: q, o [T, Hq*D]; k, v [T, Hkv*D]; stats [T, Hq, 2]; scale the
   * fp32 nearest to D^-1/2. */
  bx_status (*attention_fwd)(const char *fn, int device, const float *q, const float *k,
                             const float *v, float *o, float *stats, size_t T, size_t L,
                             size_t Hq, size_t Hkv, size_t D, float scale);
  /* Its backward: dout, q, dq [T, Hq*D]; k, v, dk, dv [T, Hkv*D]; stats
   * [T, Hq, 2] from the forward. */
  bx_status (*attention_bwd)(const char *fn, int device, const float *dout, const float *q,
                             const float *k, const float *v, const float *stats, float *dq,
                             float *dk, float *dv, size_t T, size_t L, size_t Hq, size_t Hkv,
                             size_t D, float scale);
  /* ---- the last entries (issue 30; src/cuda/train/grid_math.h's bodies) ---- */
  /* y[i] = op(x[i]) for i < n (> 0): op a bx_tdev_math_op; y fp32, or bf16
   * (uint16_t) for BX_TDEV_ROUND_BF16; y may be x exactly (fp32 ops). */
  bx_status (*math)(const char *fn, int device, int op, const float *x, void *y, size_t n);
  /* bx_rope_cos_sin: cos, sin [tokens, half] (tokens * half > 0) for
   * positions pos [tokens] (device, checked in [0, 2^24]), rotary_dim =
   * 2 * half, theta the fp32 base. */
  bx_status (*rope_table)(const char *fn, int device, const int64_t *pos, float *cos, float *sin,
                          size_t tokens, size_t half, float theta);
  /* bx_bias_grad_partials: partials [nchunks, n] (nchunks * n > 0) of dy
   * [t, n] (fp32 or bf16) over chunks of chunk rows. */
  bx_status (*bias_partials)(const char *fn, int device, const void *dy, int dy_bf16, size_t t,
                             size_t n, size_t chunk, size_t nchunks, float *partials);
} bx_train_device;

/* The CUDA backend's table, or NULL in a build without it; the host
 * simulation's (src/hostsim) instead when the test hook selects it
 * (bx_train_device_use_sim, or BITEXACT_TEST_DEVICE=sim in the
 * environment when first asked). */
const bx_train_device *bx_train_device_cuda(void);

/* The host simulation of the device backend (src/hostsim/train_sim.c): the
 * launchers' grids run on the calling thread over train_grid.h's bodies, in
 * memory from its alloc_managed, and every device pointer a launcher gets
 * is checked to lie in one such allocation (BX_EDEVICE naming fn and the
 * argument otherwise: what a GPU would fault on). Tests only: with it,
 * kDLCUDA and kDLCUDAManaged calls run on the host. */
extern const bx_train_device bx_hostsim_train;

/* Test hook: on != 0 selects the host simulation for every later call of
 * the process, 0 the build's own backend again. Not thread-safe against
 * calls in flight. */
void bx_train_device_use_sim(int on);

/* 1 under BITEXACT_TEST_DEVICE=sim-plant: the simulated GEMM moves its first
 * output one unit in the last place (a negative control: a run that reaches
 * the device path must then differ from the host's). */
int bx_train_device_sim_plant(void);

/* 1 when calls whose tensors are all kDLCUDAManaged (or kDLCUDA) memory run
 * on the device: the backend exists and says it is usable (asked once per
 * backend selection); 0: they run on the host, which reads managed memory. */
int bx_train_managed_on_device(void);

/* The same for a call whose tensors are all CUDA tensors: BX_EDEVICE
 * naming fn when this build has no CUDA backend. */
bx_status bx_train_cuda(const char *fn, const bx_train_device **dev);

#ifdef __cplusplus
}
#endif

#endif /* BX_TRAIN_DEVICE_H */
