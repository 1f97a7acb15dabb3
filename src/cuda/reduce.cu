/*
 * reduce.cu — the GPU norm: the multi-tensor reduction kernel, the kernel
 * that puts every group's words into norm.c's wire format, and the kernel
 * that checks the agreement and rounds once. Names mirror src/core/norm.c.
 *
 * Determinism: blocks take chunks in any order and fold exact integer
 * pieces with integer atomics (shared, then global); integer addition is
 * associative, so the words cannot depend on scheduling. The rounding is
 * src/core/acc_round.h, the CPU's own code.
 */
#include "acc_round.h"
#include "cuda_internal.h"
#include "offender.h"
#include "scale_round.h"

#define INF_BITS 0x7FF0000000000000ull

/* One block's share of the chunk table: exact pieces into shared memory,
 * flushed into the group's global words after each chunk. */
__global__ void __launch_bounds__(BX_CU_BLOCK)
    bx_cu_reduce_kernel(const bx_cu_chunk *chunks, uint32_t nchunks, int mode, double p,
                        int rank, int64_t *accs, uint64_t *ext, int64_t *offender) {
  __shared__ int64_t sdig[BX_ACC_DIGITS];
  __shared__ int64_t snan, sinf;
  __shared__ unsigned long long smax, smin, snz, snanx;
  const uint32_t tid = threadIdx.x, nt = blockDim.x;
  for (uint32_t c = blockIdx.x; c < nchunks; c += gridDim.x) {
    const bx_cu_chunk ch = chunks[c];
    for (uint32_t i = tid; i < BX_ACC_DIGITS; i += nt) sdig[i] = 0;
    if (tid == 0) {
      snan = sinf = 0;
      smax = 0;
      smin = INF_BITS;
      snz = snanx = 0;
    }
    __syncthreads();
    bx_sink s = {sdig, &snan, &sinf};
    if (mode == BX_CU_SQ) {
      switch (ch.dtype) {
        case BX_DT_F32: bx_thread_sumsq_f32((const uint32_t *)ch.data, ch.n, tid, nt, &s); break;
        case BX_DT_BF16: bx_thread_sumsq_bf16((const uint16_t *)ch.data, ch.n, tid, nt, &s); break;
        case BX_DT_F16: bx_thread_sumsq_f16((const uint16_t *)ch.data, ch.n, tid, nt, &s); break;
        default: bx_thread_sumsq_f64((const uint64_t *)ch.data, ch.n, tid, nt, &s); break;
      }
    } else if (mode == BX_CU_ABS) {
      switch (ch.dtype) {
        case BX_DT_F32: bx_thread_sumabs_f32((const uint32_t *)ch.data, ch.n, tid, nt, &s); break;
        case BX_DT_BF16: bx_thread_sumabs_bf16((const uint16_t *)ch.data, ch.n, tid, nt, &s); break;
        case BX_DT_F16: bx_thread_sumabs_f16((const uint16_t *)ch.data, ch.n, tid, nt, &s); break;
        default: bx_thread_sumabs_f64((const uint64_t *)ch.data, ch.n, tid, nt, &s); break;
      }
    } else if (mode == BX_CU_MEGATRON) {
      bx_thread_megatron(ch.data, ch.dtype, ch.n, tid, nt, &s);
    } else if (mode == BX_CU_POW) {
      bx_thread_pow(ch.data, ch.dtype, ch.n, tid, nt, p, &s);
    } else { /* BX_CU_EXT */
      bx_extremes r = {0, INF_BITS, 0, 0};
      bx_thread_extremes(ch.data, ch.dtype, ch.n, tid, nt, &r);
      if (r.maxbits) atomicMax(&smax, (unsigned long long)r.maxbits);
      if (r.minbits != INF_BITS) atomicMin(&smin, (unsigned long long)r.minbits);
      if (r.nonzero) atomicAdd(&snz, (unsigned long long)r.nonzero);
      if (r.nan) atomicAdd(&snanx, (unsigned long long)r.nan);
    }
    __syncthreads();
    if (mode != BX_CU_EXT) {
      int64_t *g = accs + (size_t)ch.group * BX_ACC_WORDS;
      for (uint32_t i = tid; i < BX_ACC_DIGITS; i += nt) bx_flush_word(g, (int)i, sdig[i]);
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

cudaError_t bx_cu_launch_reduce(const bx_cuda_plan *plan, cudaStream_t stream, int rank) {
  if (plan->nchunks == 0) return cudaSuccess;
  bx_cu_reduce_kernel<<<plan->grid, BX_CU_BLOCK, 0, stream>>>(
      plan->chunks, (uint32_t)plan->nchunks, plan->mode, plan->opts.norm.norm_type, rank,
      plan->accs, plan->ext, plan->offender);
  return cudaGetLastError();
}

/* ---- wire: norm.c's to_wire, on the device ------------------------------ */

/* One thread per group: normalise the raw words into the wire; thread 0
 * also writes the agreement words. */
__global__ void bx_cu_wire_kernel(const int64_t *accs, const uint64_t *ext, const int64_t *offender,
                                  int64_t *wire, size_t ngroups, size_t ww, int mode, double p,
                                  bx_cu_agree_vals agree, int error_if_nonfinite,
                                  int64_t failure_key) {
  size_t g = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (g == 0) {
    for (int i = 0; i < BX_CU_AGREE_ITEMS; i++) {
      wire[2 * i] = agree.v[i];
      wire[2 * i + 1] = ~agree.v[i];
    }
    wire[2 * BX_CU_AGREE_ITEMS] = error_if_nonfinite ? *offender : -1;
    wire[2 * BX_CU_AGREE_ITEMS + 1] = failure_key;
  }
  size_t ng = ngroups ? ngroups : 1; /* an empty group list still sends one group */
  if (g >= ng) return;
  int64_t *w = wire + BX_CU_AGREE_WORDS + g * ww;
  if (mode != BX_CU_EXT) {
    if (ngroups == 0) {
      for (int i = 0; i < BX_ACC_WORDS; i++) w[i] = 0;
    } else {
      const int64_t *a = accs + g * BX_ACC_WORDS;
      bx_digits_normalize(w, a);
      w[BX_ACC_DIGITS] = a[BX_ACC_DIGITS];
      w[BX_ACC_DIGITS + 1] = a[BX_ACC_DIGITS + 1];
      w[BX_ACC_DIGITS + 2] = a[BX_ACC_DIGITS + 2];
    }
    w[BX_ACC_DIGITS + 3] = 1; /* naccs */
    w[BX_ACC_DIGITS + 4] = BX_ACC_VERSION_TAG;
    return;
  }
  const uint64_t *e = ngroups ? ext + g * BX_CU_EXT_WORDS : NULL;
  uint64_t maxbits = e ? e[0] : 0, minbits = e && e[1] ? ~e[1] : INF_BITS;
  int64_t nonzero = e ? (int64_t)e[2] : 0, nan = e ? (int64_t)e[3] : 0;
  if (p == 0.0) {
    w[0] = nonzero;
    w[1] = nan;
  } else {
    w[0] = nan ? INT64_MAX : (int64_t)maxbits;
    w[1] = nan ? INT64_MAX : ~(int64_t)minbits;
  }
}

cudaError_t bx_cu_launch_wire(const bx_cuda_plan *plan, cudaStream_t stream, int64_t max_norm_bits,
                              int64_t failure_key) {
  bx_cu_agree_vals a;
  for (int i = 0; i < BX_CU_AGREE_ITEMS; i++) a.v[i] = plan->agree[i];
  a.v[BX_CU_AGREE_MAX_NORM] = max_norm_bits;
  size_t ng = plan->ngroups ? plan->ngroups : 1;
  unsigned threads = 128, blocks = (unsigned)((ng + threads - 1) / threads);
  bx_cu_wire_kernel<<<blocks, threads, 0, stream>>>(
      plan->accs, plan->ext, plan->offender, plan->wire, plan->ngroups, plan->wire_words,
      plan->mode, plan->opts.norm.norm_type, a, plan->opts.norm.error_if_nonfinite != 0,
      failure_key);
  return cudaGetLastError();
}

/* ---- finish: norm.c's finish and bx_clip_coef, on the device ----------- */

typedef struct dev_partial {
  double maxabs, minabs;
  int64_t nan, inf, nonzero;
} dev_partial;

/* The format a norm is rounded into: the out dtype's (BX_DT_*). */
__device__ static bx_fmt fmt_of(int code) {
  bx_fmt f = bx_fmt_f64();
  if (code == BX_DT_F32) f = bx_fmt_f32();
  else if (code == BX_DT_BF16) { f.p = 8; f.emin = -133; f.emax = 128; }
  else if (code == BX_DT_F16) { f.p = 11; f.emin = -24; f.emax = 16; }
  return f;
}

/* The norm of one set of words (a group's, or the total's digits), rounded
 * once into fmt for p = 2 and 1 (the result is exact in fmt); the other
 * modes give their double (converted later). */
__device__ static double norm_of(int mode, double p, const int64_t *digits, const dev_partial *q,
                                 bx_fmt fmt, bx_mag *scratch) {
  if (q->nan > 0) return bx_f64_from_bits(0x7FF8000000000000ull);
  if (mode == BX_CU_EXT) {
    if (p == 0.0) return (double)q->nonzero;
    if (p > 0) return q->maxabs;
    return q->minabs == INFINITY && q->maxabs == 0.0 && q->nonzero == 0 ? 0.0 : q->minabs;
  }
  if (q->inf) return INFINITY;
  int ovf;
  bx_mag_from_digits(digits, scratch);
  switch (mode) {
    case BX_CU_SQ: return scratch->negative ? NAN : bx_mag_sqrt(scratch, fmt, &ovf);
    case BX_CU_ABS: return bx_mag_round(scratch, fmt, &ovf);
    case BX_CU_POW: return pow(bx_mag_round(scratch, bx_fmt_f64(), &ovf), 1.0 / p);
    default: /* BX_CU_MEGATRON */
      return (double)sqrtf((float)bx_mag_round(scratch, bx_fmt_f32(), &ovf));
  }
}

/* Store a norm in the out dtype (exact when norm_of rounded into it). */
__device__ static void store_as(int code, void *out, double v) {
  switch (code) {
    case BX_DT_F32: *(float *)out = (float)v; break;
    case BX_DT_BF16: *(uint16_t *)out = bx_f32_to_bf16((float)v); break;
    case BX_DT_F16: *(uint16_t *)out = bx_f32_to_f16((float)v); break;
    default: *(double *)out = v; break;
  }
}

__device__ static void partial_of(int mode, double p, const int64_t *w, dev_partial *q) {
  q->maxabs = 0.0;
  q->minabs = INFINITY;
  q->nan = q->inf = q->nonzero = 0;
  if (mode != BX_CU_EXT) {
    q->nan = w[BX_ACC_DIGITS];
    q->inf = w[BX_ACC_DIGITS + 1];
  } else if (p == 0.0) {
    q->nonzero = w[0];
    q->nan = w[1];
  } else if (w[0] == INT64_MAX) {
    q->nan = 1;
  } else {
    q->maxabs = bx_f64_from_bits((uint64_t)w[0]);
    q->minabs = bx_f64_from_bits((uint64_t)~w[1]);
  }
}

/* One thread: the whole finish (ngroups x 134 words; microseconds). */
__global__ void bx_cu_finish_kernel(int64_t *wire, size_t ngroups, size_t ww, int mode, double p,
                                    int error_if_nonfinite, int clip, double max_norm, double eps,
                                    int formula, bx_mag *scratch, int64_t *total_digits,
                                    int out_code, void *d_total, double *d_groups, double *d_coef,
                                    int32_t *plan_status, int32_t *d_status) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  int32_t status = BX_OK;
  /* the agreement: every (v, ~v) pair must give max(v) == min(v) */
  for (int i = 0; i < BX_CU_AGREE_ITEMS; i++)
    if (wire[2 * i] != ~wire[2 * i + 1]) status = BX_EMISMATCH;
  int64_t failure = wire[2 * BX_CU_AGREE_ITEMS + 1];
  if (failure >= 0) status = (int32_t)(failure & 0xFF);
  if (status == BX_OK) {
    for (size_t g = 0; g < ngroups; g++) { /* the words' version check */
      const int64_t *w = wire + BX_CU_AGREE_WORDS + g * ww;
      if (mode != BX_CU_EXT &&
          (w[BX_ACC_DIGITS + 3] < 1 || w[BX_ACC_DIGITS + 4] != BX_ACC_VERSION_TAG * w[BX_ACC_DIGITS + 3]))
        status = BX_EMISMATCH;
    }
  }
  if (status == BX_OK && error_if_nonfinite && wire[2 * BX_CU_AGREE_ITEMS] >= 0)
    status = BX_ENONFINITE;
  double total = NAN;
  if (status == BX_OK) {
    dev_partial all;
    partial_of(mode, p, wire + BX_CU_AGREE_WORDS, &all); /* reset below */
    all.maxabs = 0.0;
    all.minabs = INFINITY;
    all.nan = all.inf = all.nonzero = 0;
    for (int i = 0; i < BX_ACC_DIGITS; i++) total_digits[i] = 0;
    for (size_t g = 0; g < ngroups; g++) {
      const int64_t *w = wire + BX_CU_AGREE_WORDS + g * ww;
      dev_partial q;
      partial_of(mode, p, w, &q);
      if (d_groups) d_groups[g] = norm_of(mode, p, w, &q, bx_fmt_f64(), scratch);
      if (mode != BX_CU_EXT) { /* exact: normalised digits, carries kept in int64 */
        for (int i = 0; i < BX_ACC_DIGITS; i++) total_digits[i] += w[i];
        bx_digits_normalize(total_digits, total_digits);
      }
      if (q.maxabs > all.maxabs) all.maxabs = q.maxabs;
      if (q.minabs < all.minabs) all.minabs = q.minabs;
      all.nan += q.nan;
      all.inf += q.inf;
      all.nonzero += q.nonzero;
    }
    total = norm_of(mode, p, total_digits, &all, bx_fmt_f64(), scratch);
    if (out_code != BX_DT_F64)
      store_as(out_code, d_total, norm_of(mode, p, total_digits, &all, fmt_of(out_code), scratch));
    else
      store_as(out_code, d_total, total);
  } else {
    store_as(out_code, d_total, NAN);
    if (d_groups)
      for (size_t g = 0; g < ngroups; g++) d_groups[g] = NAN;
  }
  if (d_coef) {
    double c = 1.0; /* bx_clip_coef's arithmetic, step by step */
    if (clip && max_norm != 0.0) {
      if (formula == BX_COEF_TORCH) c = max_norm / (total + eps);
      else c = max_norm / (total > max_norm || total != total ? total : max_norm);
      if (c > 1.0) c = 1.0;
    }
    *d_coef = status == BX_OK ? c : 1.0;
  }
  *plan_status = status; /* the scaling kernel reads it */
  if (d_status) *d_status = status;
}

cudaError_t bx_cu_launch_finish(const bx_cuda_plan *plan, cudaStream_t stream, int clip,
                                double max_norm, int out_code, void *d_total, double *d_groups,
                                double *d_coef, int32_t *d_status) {
  bx_cu_finish_kernel<<<1, 1, 0, stream>>>(
      plan->wire, plan->ngroups, plan->wire_words, plan->mode, plan->opts.norm.norm_type,
      plan->opts.norm.error_if_nonfinite != 0, clip, max_norm, plan->opts.eps,
      (int)plan->opts.formula, plan->scratch, plan->total_digits, out_code, d_total, d_groups,
      d_coef,
      plan->status, d_status);
  return cudaGetLastError();
}
