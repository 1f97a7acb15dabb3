/*
 * rope.cu — bx_rope_forward / _backward on CUDA tensors: one thread per
 * (token, feature slot) (train_grid.h), rope_hd.h's arithmetic (each
 * thread forms its own inverse frequency, the host's bits).
 */
#include "train_cuda.h"

__global__ void __launch_bounds__(BX_TG_BLOCK) bx_cut_rope_kernel(bx_tg_rope a) {
  BX_CUT_FOR(i, a.tokens * bx_tg_rope_slots(&a)) bx_tg_rope_slot(&a, i);
}

bx_status bx_cut_rope(const char *fn, int device, const float *x, float *y, const int64_t *pos,
                      size_t tokens, size_t width, size_t head_dim, size_t half,
                      size_t rotary_dim, float theta, float sin_sign) {
  cudaError_t pending = cudaPeekAtLastError();
  bx_cu_device_guard guard(device);
  bx_tg_rope a = {x, y, pos, tokens, width, head_dim, width / head_dim, half, rotary_dim, theta,
                  sin_sign};
  void *args[] = {&a};
  return bx_cut_done(fn, "RoPE kernel",
                     bx_cut_launch((const void *)bx_cut_rope_kernel,
                                   tokens * bx_tg_rope_slots(&a), args),
                     pending);
}
