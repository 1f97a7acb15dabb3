/*
 * reduce.cu — the GPU norm: the multi-tensor reduction kernel, the kernel
 * that puts every group's words into norm.c's wire format, and the kernel
 * that checks the agreement and rounds once. Names mirror src/core/norm.c.
 *
 * Determinism: blocks take chunks in any order and fold exact integer
 * pieces with integer atomics (shared, then global); integer addition is
 * associative, so the words cannot depend on scheduling. The rounding is
 * src/common/norm_finish.h, the CPU's own code.
 */
#include "cuda_internal.h"
#include "offender.h"

#define INF_BITS BX_F64_INF_BITS

/* One block's share of the chunk table: exact pieces into shared memory,
 * flushed into the group's global words after each chunk. */
/* 5 blocks per SM: 48 registers, no spills (ptxas -v, sm_90) */
__global__ void __launch_bounds__(BX_CU_BLOCK, 5)
    bx_cu_reduce_kernel(const bx_cu_chunk *chunks, uint32_t nchunks, int mode, int int_squares,
                        double p, int rank, int64_t *accs, uint64_t *ext, int64_t *offender) {
  __shared__ int64_t sdig[BX_CU_WARPS][BX_ACC_DIGITS]; /* a copy per warp: less contention */
  __shared__ int64_t snan, sinf;
  __shared__ unsigned long long smax, smin, snz, snanx;
  const uint32_t tid = threadIdx.x, nt = blockDim.x;
  for (uint32_t c = blockIdx.x; c < nchunks; c += gridDim.x) {
    const bx_cu_chunk ch = chunks[c];
    for (uint32_t i = tid; i < BX_CU_WARPS * BX_ACC_DIGITS; i += nt) (&sdig[0][0])[i] = 0;
    if (tid == 0) {
      snan = sinf = 0;
      smax = 0;
      smin = INF_BITS;
      snz = snanx = 0;
    }
    __syncthreads();
    bx_sink s = {sdig[tid / 32], &snan, &sinf};
    if (mode == BX_M_SQ && !int_squares) { /* the fp64 grid (fp64 data: integer windows) */
      switch (ch.dtype) {
        case BX_DT_F32: bx_thread_gridsq_f32((const uint32_t *)ch.data, ch.n, tid, nt, &s); break;
        case BX_DT_BF16: bx_thread_gridsq_bf16((const uint16_t *)ch.data, ch.n, tid, nt, &s); break;
        case BX_DT_F16: bx_thread_gridsq_f16((const uint16_t *)ch.data, ch.n, tid, nt, &s); break;
        default: bx_thread_sumsq_f64((const uint64_t *)ch.data, ch.n, tid, nt, &s); break;
      }
    } else if (mode == BX_M_SQ) { /* integer windows for every dtype */
      switch (ch.dtype) {
        case BX_DT_F32: bx_thread_sumsq_f32((const uint32_t *)ch.data, ch.n, tid, nt, &s); break;
        case BX_DT_BF16: bx_thread_sumsq_bf16((const uint16_t *)ch.data, ch.n, tid, nt, &s); break;
        case BX_DT_F16: bx_thread_sumsq_f16((const uint16_t *)ch.data, ch.n, tid, nt, &s); break;
        default: bx_thread_sumsq_f64((const uint64_t *)ch.data, ch.n, tid, nt, &s); break;
      }
    } else if (mode == BX_M_ABS) {
      bx_thread_sumabs(ch.data, ch.dtype, ch.n, tid, nt, &s);
    } else if (mode == BX_M_MEGATRON) {
      bx_thread_megatron(ch.data, ch.dtype, ch.n, tid, nt, &s);
    } else if (mode == BX_M_POW) {
      bx_thread_pow(ch.data, ch.dtype, ch.n, tid, nt, p, &s);
    } else { /* BX_M_EXT */
      bx_extremes r = {0, INF_BITS, 0, 0};
      bx_thread_extremes(ch.data, ch.dtype, ch.n, tid, nt, &r);
      if (r.maxbits) atomicMax(&smax, (unsigned long long)r.maxbits);
      if (r.minbits != INF_BITS) atomicMin(&smin, (unsigned long long)r.minbits);
      if (r.nonzero) atomicAdd(&snz, (unsigned long long)r.nonzero);
      if (r.nan) atomicAdd(&snanx, (unsigned long long)r.nan);
    }
    __syncthreads();
    if (mode != BX_M_EXT) {
      int64_t *g = accs + (size_t)ch.group * BX_ACC_WORDS;
      for (uint32_t i = tid; i < BX_ACC_DIGITS; i += nt) {
        int64_t w = 0; /* the warps' copies: each below 2^63 / BX_CU_WARPS */
        for (int k = 0; k < BX_CU_WARPS; k++) w += sdig[k][i];
        bx_flush_word(g, (int)i, w);
      }
      if (tid == 0) {
        if (snan) atomicAdd((unsigned long long *)&g[BX_ACC_DIGITS], (unsigned long long)snan);
        if (sinf) atomicAdd((unsigned long long *)&g[BX_ACC_DIGITS + 1], (unsigned long long)sinf);
        atomicAdd((unsigned long long *)&g[BX_ACC_DIGITS + 2], (unsigned long long)ch.n);
        if (snan || sinf)
          atomicMax((long long *)offender,
                    (long long)bx_offender_key_of(rank, ch.group, ch.tensor, snan > 0));
      }
    } else if (tid == 0) {
      uint64_t *e = ext + (size_t)ch.group * BX_CU_EXT_WORDS;
      if (smax) atomicMax((unsigned long long *)&e[0], smax);
      if (smin != INF_BITS) atomicMax((unsigned long long *)&e[1], ~smin);
      if (snz) atomicAdd((unsigned long long *)&e[2], snz);
      if (snanx) atomicAdd((unsigned long long *)&e[3], snanx);
      if (snanx || smax == INF_BITS)
        atomicMax((long long *)offender,
                  (long long)bx_offender_key_of(rank, ch.group, ch.tensor, snanx > 0));
    }
    __syncthreads(); /* the shared words are reset for the next chunk */
  }
}

int bx_cu_reduce_blocks_per_sm(void) {
  int n = 0;
  cudaError_t pending = cudaPeekAtLastError();
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, bx_cu_reduce_kernel, BX_CU_BLOCK, 0) !=
          cudaSuccess || n < 1) {
    if (pending == cudaSuccess) cudaGetLastError(); /* ours only */
    n = 1;
  }
  return n;
}

cudaError_t bx_cu_launch_reduce(const bx_cuda_plan *plan, cudaStream_t stream, int rank) {
  if (plan->nchunks == 0) return cudaSuccess;
  const bx_cu_chunk *chunks = plan->b.chunks;
  uint32_t nchunks = (uint32_t)plan->nchunks;
  int mode = plan->mode, int_squares = plan->int_squares;
  double p = plan->opts.norm.norm_type;
  int64_t *accs = plan->b.accs, *offender = plan->b.offender;
  uint64_t *ext = plan->b.ext;
  void *args[] = {&chunks, &nchunks, &mode, &int_squares, &p, &rank, &accs, &ext, &offender};
  return cudaLaunchKernel((const void *)bx_cu_reduce_kernel, dim3((unsigned)plan->grid),
                          dim3(BX_CU_BLOCK), args, 0, stream);
}

/* ---- wire: the agreement words and every group's words (cuda_finish.h) -- */

typedef struct bx_cu_items {
  int64_t v[BX_AGREE_ITEMS];
} bx_cu_items;

/* One thread per group: normalise the raw words into the wire; thread 0
 * also writes the agreement words. */
__global__ void bx_cu_wire_kernel(const int64_t *accs, const uint64_t *ext, const int64_t *offender,
                                  int64_t *wire, size_t ngroups, size_t ww, int mode, double p,
                                  bx_cu_items items, unsigned dtypes, int error_if_nonfinite,
                                  int64_t failure_key) {
  size_t g = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (g == 0)
    bx_agree_fill(wire, items.v, error_if_nonfinite ? *offender : -1, failure_key, -1, dtypes);
  size_t ng = ngroups ? ngroups : 1; /* an empty group list still sends one group */
  if (g >= ng) return;
  bx_cu_wire_group(mode, p, ngroups ? accs + g * BX_ACC_WORDS : NULL,
                   ngroups ? ext + g * BX_CU_EXT_WORDS : NULL, wire + BX_AGREE_WORDS + g * ww);
}

cudaError_t bx_cu_launch_wire(const bx_cuda_plan *plan, cudaStream_t stream, int64_t call,
                              int64_t max_norm_bits, int64_t failure_key) {
  bx_cu_items items;
  for (int i = 0; i < BX_AGREE_ITEMS; i++) items.v[i] = plan->agree[i];
  items.v[BX_AGREE_CALL] = call;
  items.v[BX_AGREE_MAX_NORM] = max_norm_bits;
  size_t ng = plan->ngroups ? plan->ngroups : 1;
  unsigned threads = 128, blocks = (unsigned)((ng + threads - 1) / threads);
  const int64_t *accs = plan->b.accs, *offender = plan->b.offender;
  const uint64_t *ext = plan->b.ext;
  int64_t *wire = plan->b.wire;
  size_t ngroups = plan->ngroups, ww = plan->wire_words;
  int mode = plan->mode, nonfinite = plan->opts.norm.error_if_nonfinite != 0;
  double p = plan->opts.norm.norm_type;
  unsigned dtypes = plan->dtypes;
  void *args[] = {&accs, &ext, &offender, &wire, &ngroups, &ww, &mode, &p, &items, &dtypes,
                  &nonfinite, &failure_key};
  return cudaLaunchKernel((const void *)bx_cu_wire_kernel, dim3(blocks), dim3(threads), args, 0,
                          stream);
}

/* ---- finish: cuda_finish.h's body, one thread ------------------------------ */

/* One thread: the whole finish (ngroups x 134 words; microseconds). */
__global__ void bx_cu_finish_kernel(const int64_t *wire, size_t ngroups, bx_cu_finish_args a,
                                    bx_mag *scratch, int64_t *total_digits, void *d_total,
                                    double *d_groups, double *d_coef, int32_t *plan_status,
                                    int32_t *d_status) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  int32_t status = bx_cu_finish(wire, ngroups, &a, scratch, total_digits, d_total, d_groups, d_coef);
  *plan_status = status; /* the scaling kernel reads it */
  if (d_status) *d_status = status;
}

cudaError_t bx_cu_launch_finish(const bx_cuda_plan *plan, cudaStream_t stream, int clip,
                                double max_norm, int out_code, void *d_total, double *d_groups,
                                double *d_coef, int32_t *d_status) {
  bx_cu_finish_args a = {plan->mode, plan->opts.norm.norm_type,
                         plan->opts.norm.error_if_nonfinite != 0, clip, max_norm, plan->opts.eps,
                         (int)plan->opts.formula, out_code};
  const int64_t *wire = plan->b.wire;
  size_t ngroups = plan->ngroups;
  bx_mag *scratch = plan->b.scratch;
  int64_t *total_digits = plan->b.total_digits;
  int32_t *plan_status = plan->b.status;
  void *args[] = {&wire, &ngroups, &a, &scratch, &total_digits, &d_total, &d_groups, &d_coef,
                  &plan_status, &d_status};
  return cudaLaunchKernel((const void *)bx_cu_finish_kernel, dim3(1), dim3(1), args, 0, stream);
}
