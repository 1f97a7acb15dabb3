/*
 * attention.cu — bx_attention_forward / _backward on CUDA tensors
 * (grid_attention.h): the forward one thread per (token, query head); the
 * backward three kernels in order, delta per (token, query head), dK/dV
 * per (key token, kv head), dQ per (token, query head). Each output is
 * the CPU's chain in the CPU's order (attention_hd.h), so the bits are the
 * CPU's. No scratch: the forward accumulates in o, delta waits in dq.
 * (Shared-memory tiles of k and v across a block's rows are a speed change
 * for later: the chains stay.)
 */
#include "grid_attention.h"
#include "train_cuda.h"

__global__ void __launch_bounds__(BX_TG_BLOCK) bx_cut_attention_fwd_kernel(bx_tg_attn a) {
  BX_CUT_FOR(i, a.T * a.Hq) bx_tg_attn_fwd_row(&a, i);
}

__global__ void __launch_bounds__(BX_TG_BLOCK) bx_cut_attention_delta_kernel(bx_tg_attn a) {
  BX_CUT_FOR(i, a.T * a.Hq) bx_tg_attn_delta_row(&a, i);
}

__global__ void __launch_bounds__(BX_TG_BLOCK) bx_cut_attention_dkdv_kernel(bx_tg_attn a) {
  BX_CUT_FOR(i, a.T * a.Hkv) bx_tg_attn_dkdv_row(&a, i);
}

__global__ void __launch_bounds__(BX_TG_BLOCK) bx_cut_attention_dq_kernel(bx_tg_attn a) {
  BX_CUT_FOR(i, a.T * a.Hq) bx_tg_attn_dq_row(&a, i);
}

bx_status bx_cut_attention_fwd(const char *fn, int device, const float *q, const float *k,
                               const float *v, float *o, float *stats, size_t T, size_t L,
                               size_t Hq, size_t Hkv, size_t D, float scale) {
  cudaError_t pending = cudaPeekAtLastError();
  bx_cu_device_guard guard(device);
  bx_tg_attn a = {q, k, v, nullptr, nullptr, o, stats, nullptr, nullptr, nullptr,
                  T, L, Hq, Hkv, D, scale};
  void *args[] = {&a};
  return bx_cut_done(fn, "attention forward kernel",
                     bx_cut_launch((const void *)bx_cut_attention_fwd_kernel, T * Hq, args),
                     pending);
}

bx_status bx_cut_attention_bwd(const char *fn, int device, const float *dout, const float *q,
                               const float *k, const float *v, const float *stats, float *dq,
                               float *dk, float *dv, size_t T, size_t L, size_t Hq, size_t Hkv,
                               size_t D, float scale) {
  cudaError_t pending = cudaPeekAtLastError();
  bx_cu_device_guard guard(device);
  bx_tg_attn a = {q, k, v, dout, stats, nullptr, nullptr, dq, dk, dv, T, L, Hq, Hkv, D, scale};
  void *args[] = {&a};
  cudaError_t e = bx_cut_launch((const void *)bx_cut_attention_delta_kernel, T * Hq, args);
  if (e == cudaSuccess)
    e = bx_cut_launch((const void *)bx_cut_attention_dkdv_kernel, T * Hkv, args);
  if (e == cudaSuccess) e = bx_cut_launch((const void *)bx_cut_attention_dq_kernel, T * Hq, args);
  return bx_cut_done(fn, "attention backward kernels", e, pending);
}
