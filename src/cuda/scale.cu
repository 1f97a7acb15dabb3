/*
 * scale.cu — the multi-tensor scaling kernel: every chunk of the plan's
 * chunk table scaled in place by one coefficient read from device memory,
 * with the per-element arithmetic of src/common/scale_round.h (the CPU's own
 * code, so the same bits in both bx_scale_modes). Names mirror
 * src/cpu/portable_scale.c.
 */
#include "cuda_internal.h"
#include "scale_round.h"

__global__ void __launch_bounds__(BX_CU_BLOCK)
    bx_cu_scale_kernel(const bx_cu_chunk *chunks, uint32_t nchunks, int exact,
                       const double *d_coef, double coef_host, const int32_t *d_status,
                       int skip_one) {
  if (d_status && *d_status != 0) return; /* a failed norm: all-or-nothing */
  const double coef = d_coef ? *d_coef : coef_host;
  if (skip_one && coef == 1.0) return;
  const float c32 = (float)coef; /* nearest-even, as the CPU's (float)coef */
  const bx_split_coef k = bx_split(coef);
  const uint32_t tid = threadIdx.x, nt = blockDim.x;
  for (uint32_t c = blockIdx.x; c < nchunks; c += gridDim.x) {
    const bx_cu_chunk ch = chunks[c];
    switch (ch.dtype) {
      case BX_DT_F32: {
        float *x = (float *)ch.data;
        if (exact)
          for (uint32_t i = tid; i < ch.n; i += nt) x[i] = bx_scale_f32_exact_one(x[i], &k);
        else
          for (uint32_t i = tid; i < ch.n; i += nt) x[i] = bx_scale_f32_torch_one(x[i], c32);
        break;
      }
      case BX_DT_BF16: {
        uint16_t *x = (uint16_t *)ch.data;
        if (exact)
          for (uint32_t i = tid; i < ch.n; i += nt) x[i] = bx_scale_bf16_exact_one(x[i], &k);
        else
          for (uint32_t i = tid; i < ch.n; i += nt) x[i] = bx_scale_bf16_torch_one(x[i], c32);
        break;
      }
      case BX_DT_F16: {
        uint16_t *x = (uint16_t *)ch.data;
        if (exact)
          for (uint32_t i = tid; i < ch.n; i += nt) x[i] = bx_scale_f16_exact_one(x[i], &k);
        else
          for (uint32_t i = tid; i < ch.n; i += nt) x[i] = bx_scale_f16_torch_one(x[i], c32);
        break;
      }
      default: {
        double *x = (double *)ch.data;
        for (uint32_t i = tid; i < ch.n; i += nt) x[i] = bx_scale_f64_one(x[i], coef);
        break;
      }
    }
  }
}

int bx_cu_scale_blocks_per_sm(void) {
  int n = 0;
  cudaError_t pending = cudaPeekAtLastError();
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, bx_cu_scale_kernel, BX_CU_BLOCK, 0) !=
          cudaSuccess || n < 1) {
    if (pending == cudaSuccess) cudaGetLastError(); /* ours only */
    n = 1;
  }
  return n;
}

cudaError_t bx_cu_launch_scale(const bx_cuda_plan *plan, cudaStream_t stream,
                               const double *d_coef, double coef_host, const int32_t *d_status,
                               int skip_one) {
  if (plan->nchunks == 0) return cudaSuccess;
  const bx_cu_chunk *chunks = plan->b.chunks;
  uint32_t nchunks = (uint32_t)plan->nchunks;
  int exact = plan->opts.scale.mode == BX_SCALE_EXACT;
  void *args[] = {&chunks, &nchunks, &exact, &d_coef, &coef_host, &d_status, &skip_one};
  return cudaLaunchKernel((const void *)bx_cu_scale_kernel, dim3((unsigned)plan->grid_scale),
                          dim3(BX_CU_BLOCK), args, 0, stream);
}
