/*
 * adamw.cu — bx_adamw_step on CUDA tensors: one thread per element
 * (train_grid.h), adamw_hd.h's update with the host's fp32 scalars.
 */
#include "train_cuda.h"

__global__ void __launch_bounds__(BX_TG_BLOCK) bx_cut_adamw_kernel(bx_tg_adamw a) {
  BX_CUT_FOR(i, a.n) bx_tg_adamw_elem(&a, i);
}

bx_status bx_cut_adamw(const char *fn, int device, float *p, const float *g, float *m, float *v,
                       size_t n, const bx_adamw_scalars *s) {
  cudaError_t pending = cudaPeekAtLastError();
  bx_cu_device_guard guard(device);
  bx_tg_adamw a = {p, m, v, g, n, *s};
  void *args[] = {&a};
  return bx_cut_done(fn, "AdamW kernel",
                     bx_cut_launch((const void *)bx_cut_adamw_kernel, n, args), pending);
}
