/*
 * train_cuda.h — what the training kernels' launchers (the src/cuda/train .cu files)
 * share: the launch of a grid-stride kernel on the legacy default stream,
 * and the wait that turns a launch's or a kernel's error into a status.
 * The thread bodies are train_grid.h's (plain C, simulated on the CPU by
 * tests/test_train_cuda_sim.c); the arithmetic is the src/common _hd.h headers's.
 */
#ifndef BX_TRAIN_CUDA_H
#define BX_TRAIN_CUDA_H

#include "cuda_internal.h"
#include "train_device.h"
#include "train_grid.h"

/* The test hook of the launch geometry (scripts/gpu_train_check.sh's
 * invariance step): BITEXACT_TEST_CUDA_BLOCKS=N caps the grid-stride
 * kernels at N blocks (read once; 0 or unset: no cap). The bits may not
 * change with it. */
unsigned bx_cut_max_blocks(void);

/* One block of BX_TG_BLOCK threads per BX_TG_BLOCK work items, at most
 * BX_TG_MAX_BLOCKS blocks (the kernels loop over the rest). */
static inline cudaError_t bx_cut_launch(const void *kernel, uint64_t items, void **args) {
  uint32_t blocks = bx_tg_blocks(items), cap = bx_cut_max_blocks();
  if (cap && blocks > cap) blocks = cap;
  return cudaLaunchKernel(kernel, dim3(blocks), dim3(BX_TG_BLOCK), args, 0, 0);
}

/* The end of a launcher: the launches' result e, then the wait for the
 * kernels (their asynchronous errors); BX_OK or the CUDA error. */
static inline bx_status bx_cut_done(const char *fn, const char *what, cudaError_t e,
                                    cudaError_t pending_before) {
  if (e == cudaSuccess) e = cudaStreamSynchronize(0);
  if (e != cudaSuccess) return bx_cu_fail(fn, what, e, pending_before);
  return BX_OK;
}

/* The grid-stride index loop of a kernel body over n items. */
#define BX_CUT_FOR(i, n)                                                               \
  for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);           \
       i += (uint64_t)gridDim.x * blockDim.x)

/* The launchers (one file each), collected in train_table.cu. */
bx_status bx_cut_swiglu_fwd(const char *fn, int device, const float *g, const float *u, float *h,
                            size_t rows, size_t f, size_t ldg, size_t ldu, size_t ldh);
bx_status bx_cut_swiglu_bwd(const char *fn, int device, const float *g, const float *u,
                            const float *dh, float *dg, float *du, size_t rows, size_t f,
                            size_t ldg, size_t ldu, size_t ldh, size_t lddg, size_t lddu);
bx_status bx_cut_adamw(const char *fn, int device, float *p, const float *g, float *m, float *v,
                       size_t n, const bx_adamw_scalars *s);
bx_status bx_cut_rmsnorm_fwd(const char *fn, int device, const float *x, const float *w, float *y,
                             float *rstd, size_t rows, size_t h, float eps);
bx_status bx_cut_rmsnorm_bwd(const char *fn, int device, const float *x, const float *w,
                             const float *dy, const float *rstd, float *dx, float *partials,
                             size_t rows, size_t h, size_t chunk, size_t nchunks);
bx_status bx_cut_rope(const char *fn, int device, const float *x, float *y, const int64_t *pos,
                      size_t tokens, size_t width, size_t head_dim, size_t half,
                      size_t rotary_dim, float theta, float sin_sign);
bx_status bx_cut_gemm(const char *fn, int device, const void *a, int a_bf16, const void *b,
                      int b_bf16, int layout, float *c, size_t m, size_t n, size_t k,
                      int accumulate);
bx_status bx_cut_tokred_maxabs(const char *fn, int device, const void *a, int a_bf16, size_t rows,
                               size_t cols, size_t chunk, uint32_t *mx);
bx_status bx_cut_tokred_grid(const char *fn, int device, const float *a, size_t n, double inv_step,
                             uint32_t lim, int64_t *q, bx_tokred_dev_res *res);
bx_status bx_cut_tokred_wgrad(const char *fn, int device, const bx_tokred_dev_wgrad *w,
                              int64_t *qw, int64_t *qb, bx_tokred_dev_res *rw,
                              bx_tokred_dev_res *rb);
bx_status bx_cut_tokred_wgrad_chunk(const char *fn, int device, const bx_tokred_dev_wgrad *w,
                                    size_t c, float *pw, float *pb);

/* router.cu, permute.cu, embedding.cu, xent.cu (grid_moe.h's bodies;
 * train_device.h states each member). */
bx_status bx_cut_router_fwd(const char *fn, int device, const float *logits, const float *bias,
                            void *ids, int ids_i64, float *weights, int64_t *counts, size_t T,
                            size_t chunk, size_t nchunks, const bx_router_cfg *q);
bx_status bx_cut_router_bwd(const char *fn, int device, const float *logits, const void *ids,
                            int ids_i64, const float *dw, float *dl, size_t T, size_t E, size_t k,
                            int norm, double r);
bx_status bx_cut_moe_permute(const char *fn, int device, const float *x, const int64_t *row_map,
                             float *x_perm, size_t R, size_t H);
bx_status bx_cut_moe_permute_bwd(const char *fn, int device, const float *dx_perm,
                                 const int64_t *pos, float *dx, size_t T, size_t k, size_t H);
bx_status bx_cut_moe_unpermute(const char *fn, int device, const float *y_perm, const float *w,
                               const int64_t *pos, const float *initial, float *out, size_t T,
                               size_t k, size_t H);
bx_status bx_cut_moe_unpermute_bwd(const char *fn, int device, const float *dout,
                                   const float *y_perm, const float *w, const int64_t *row_map,
                                   const int64_t *pos, float *dy_perm, float *dweights, size_t T,
                                   size_t k, size_t H);
bx_status bx_cut_embedding_fwd(const char *fn, int device, const float *weight, const void *ids,
                               int ids_i64, float *y, size_t T, size_t H);
bx_status bx_cut_embedding_bwd(const char *fn, int device, const void *ids, int ids_i64,
                               const float *dy, const int64_t *row_ids, const int64_t *offsets,
                               float *rows, size_t T, size_t H, size_t chunk, size_t nchunks,
                               size_t total);
bx_status bx_cut_xent(const char *fn, int device, const float *z, const void *targets,
                      int targets_i64, int64_t ignore_index, float *g, float *losses,
                      float *partials, int64_t *counts, size_t T, size_t V, size_t chunk,
                      size_t nchunks, double c);

bx_status bx_cut_attention_fwd(const char *fn, int device, const float *q, const float *k,
                               const float *v, float *o, float *stats, size_t T, size_t L,
                               size_t Hq, size_t Hkv, size_t D, float scale);
bx_status bx_cut_attention_bwd(const char *fn, int device, const float *dout, const float *q,
                               const float *k, const float *v, const float *stats, float *dq,
                               float *dk, float *dv, size_t T, size_t L, size_t Hq, size_t Hkv,
                               size_t D, float scale);

/* math.cu (grid_math.h's bodies; train_device.h states each member). */
bx_status bx_cut_math(const char *fn, int device, int op, const float *x, void *y, size_t n);
bx_status bx_cut_rope_table(const char *fn, int device, const int64_t *pos, float *cos,
                            float *sin, size_t tokens, size_t half, float theta);
bx_status bx_cut_bias_partials(const char *fn, int device, const void *dy, int dy_bf16, size_t t,
                               size_t n, size_t chunk, size_t nchunks, float *partials);

#endif /* BX_TRAIN_CUDA_H */
