/*
 * math.cu — the last training entries on CUDA tensors (issue 30): the
 * elementwise math (bx_exp ... bx_cos, bx_round_bf16; one thread per
 * element), RoPE's cos/sin table (bx_rope_cos_sin; one thread per (token,
 * slot)) and the bias-gradient chunk partials (bx_bias_grad_partials; one
 * thread per (chunk, column)). The bodies are grid_math.h's; the
 * arithmetic math_det.h's, scale_round.h's, rope_hd.h's and
 * grid_tokred.h's, the CPU's own.
 */
#include <string.h>

#include "grid_math.h"
#include "train_cuda.h"

__global__ void __launch_bounds__(BX_TG_BLOCK) bx_cut_math_kernel(bx_tgm_math a) {
  BX_CUT_FOR(i, a.n) bx_tgm_math_elem(&a, i);
}

__global__ void __launch_bounds__(BX_TG_BLOCK) bx_cut_rope_table_kernel(bx_tgm_rope_table a) {
  BX_CUT_FOR(i, a.tokens * a.half) bx_tgm_rope_table_item(&a, i);
}

__global__ void __launch_bounds__(BX_TG_BLOCK) bx_cut_bias_partials_kernel(bx_tgt_wgrad w,
                                                                           float *out) {
  BX_CUT_FOR(i, w.nchunks * w.n) bx_tgm_bias_item(&w, out, i);
}

bx_status bx_cut_math(const char *fn, int device, int op, const float *x, void *y, size_t n) {
  cudaError_t pending = cudaPeekAtLastError();
  bx_cu_device_guard guard(device);
  bx_tgm_math a = {x, y, n, op};
  void *args[] = {&a};
  return bx_cut_done(fn, "elementwise math kernel",
                     bx_cut_launch((const void *)bx_cut_math_kernel, n, args), pending);
}

bx_status bx_cut_rope_table(const char *fn, int device, const int64_t *pos, float *cos,
                            float *sin, size_t tokens, size_t half, float theta) {
  cudaError_t pending = cudaPeekAtLastError();
  bx_cu_device_guard guard(device);
  bx_tgm_rope_table a = {pos, cos, sin, tokens, half, 2 * (uint64_t)half, theta};
  void *args[] = {&a};
  return bx_cut_done(fn, "RoPE cos/sin kernel",
                     bx_cut_launch((const void *)bx_cut_rope_table_kernel, tokens * half, args),
                     pending);
}

bx_status bx_cut_bias_partials(const char *fn, int device, const void *dy, int dy_bf16, size_t t,
                               size_t n, size_t chunk, size_t nchunks, float *partials) {
  cudaError_t pending = cudaPeekAtLastError();
  bx_cu_device_guard guard(device);
  bx_tgt_wgrad w = bx_tgm_bias_args(dy, dy_bf16, t, n, chunk, nchunks);
  void *args[] = {&w, &partials};
  return bx_cut_done(fn, "bias partials kernel",
                     bx_cut_launch((const void *)bx_cut_bias_partials_kernel, nchunks * n, args),
                     pending);
}
