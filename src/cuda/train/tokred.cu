/*
 * tokred.cu — the token reduction on CUDA partials (train_device.h's
 * tokred_* members): the exponent bound (largest finite |bits| per chunk),
 * the grid add of one partial (bx_tokred_q per element), and
 * bx_linear_wgrad's chunked TN weight partials and bias partials rounded
 * onto their grids in the GEMM's epilogue and summed with integer atomics
 * in any order (grid_tokred.h holds the thread bodies). Every result is an
 * integer combined by +, MAX or MIN, so no schedule reaches a bit; the
 * words go back to the host, where the state's words live (tokred.c adds
 * them there).
 *
 * Memory: device scratch (the q words, maxima, counters) comes from a
 * grow-only arena of the calling thread: never freed during a call
 * (cudaFree synchronises the device: a hazard with NCCL kernels in
 * flight); a larger need allocates the new block first and frees the old
 * one stream-ordered (cudaMallocAsync / cudaFreeAsync where the device has
 * memory pools); the block is freed when the thread exits. Everything runs
 * on the legacy default stream and is waited for (the copies back).
 */
#include <stdlib.h>
#include <string.h>

#include "grid_tokred.h"
#include "train_cuda.h"

/* The device results of one launch (w: the weight or the one partial; b: the bias). */
struct bx_cut_tk_res {
  uint32_t mx_w, mx_b;
  unsigned long long nf_w, nf_b, bad_w, bad_b;
  float bad_value;
};
typedef bx_cut_tk_res tk_res;

namespace {

thread_local bx_cu_arena tk_scratch;

bx_status tk_reserve(const char *fn, int device, size_t bytes, void **out) {
  bx_status st = bx_cu_arena_reserve(fn, "reserving the token reduction's scratch", &tk_scratch,
                                     device, bytes, 0);
  if (st == BX_OK) *out = tk_scratch.dev;
  return st;
}

size_t align256(size_t b) { return (b + 255) & ~(size_t)255; }

/* The result words before a launch: maxima and counts 0, firsts all ones. */
cudaError_t tk_res_clear(tk_res *r) {
  cudaError_t e = cudaMemsetAsync(r, 0, sizeof *r, 0);
  if (e == cudaSuccess) e = cudaMemsetAsync(&r->bad_w, 0xFF, 2 * sizeof r->bad_w, 0);
  return e;
}

/* The weight's (weight != 0; the one partial's) or the bias's results. */
void tk_res_out(const tk_res &r, int weight, bx_tokred_dev_res *out) {
  out->mx = weight ? r.mx_w : r.mx_b;
  out->nf = (int64_t)(weight ? r.nf_w : r.nf_b);
  out->bad = (uint64_t)(weight ? r.bad_w : r.bad_b);
  out->bad_value = weight ? r.bad_value : 0.0f;
}

} // namespace

/* ---- kernels ------------------------------------------------------------------------ */

/* Block (x, y): chunks x, x + gridDim.x, ...; its threads are y's share of
 * the chunk's elements (gridDim.y * blockDim.x threads per chunk). */
__global__ void __launch_bounds__(BX_TG_BLOCK) bx_cut_tokred_maxabs_kernel(bx_tgt_maxabs m) {
  uint32_t tid = blockIdx.y * blockDim.x + threadIdx.x, nt = gridDim.y * blockDim.x;
  for (uint64_t c = blockIdx.x; c < m.nchunks; c += gridDim.x) {
    uint32_t mx = bx_tgt_maxabs_thread(&m, c, tid, nt);
    if (mx) atomicMax(&m.mx[c], mx);
  }
}

/* One thread per element (grid-stride): its q stored, its results as atomics. */
__global__ void __launch_bounds__(BX_TG_BLOCK) bx_cut_tokred_grid_kernel(bx_tgt_grid g, tk_res *r) {
  bx_tgt_acc s;
  bx_tgt_acc_init(&s);
  bx_tgt_grid_thread(&g, (uint64_t)blockIdx.x * blockDim.x + threadIdx.x,
                     (uint64_t)gridDim.x * blockDim.x, &s);
  if (s.mx) atomicMax(&r->mx_w, s.mx);
  if (s.nf) atomicAdd(&r->nf_w, (unsigned long long)s.nf);
  if (s.bad != UINT64_MAX) atomicMin(&r->bad_w, (unsigned long long)s.bad);
}

/* Block (row tile, column tile, chunk group): the GEMM's tile chains per
 * chunk between __syncthreads(), the grid in the epilogue, the q of the
 * group's chunks summed in registers, one atomicAdd per output. */
__global__ void __launch_bounds__(BX_TG_GEMM_THREADS) bx_cut_tokred_wgrad_kernel(bx_tgt_wgrad w,
                                                                                 tk_res *r) {
  __shared__ float As[BX_TG_GEMM_BK * BX_TG_GEMM_BM];
  __shared__ float Bs[BX_TG_GEMM_BK * BX_TG_GEMM_BN];
  float acc[BX_TG_GEMM_TM * BX_TG_GEMM_TN];
  bx_tgt_acc s;
  bx_tgt_acc_init(&s);
  const uint64_t bm = blockIdx.x, bn = blockIdx.y;
  const uint32_t tid = threadIdx.x;
  for (uint64_t c = blockIdx.z; c < w.nchunks; c += gridDim.z) {
    bx_tg_gemm g = bx_tgt_wgrad_gemm(&w, c);
    bx_tg_gemm_init(&g, bm, bn, tid, acc);
    for (uint64_t k0 = 0; k0 < g.k; k0 += BX_TG_GEMM_BK) {
      bx_tg_gemm_load(&g, bm, bn, k0, tid, As, Bs);
      __syncthreads();
      bx_tg_gemm_compute(&g, k0, tid, As, Bs, acc);
      __syncthreads();
    }
    bx_tgt_wgrad_epi(&w, &g, c, bm, bn, tid, acc, &s);
  }
  for (uint32_t o = 0; o < BX_TG_GEMM_TM * BX_TG_GEMM_TN; o++) {
    uint64_t at = bx_tgt_wgrad_out(&w, bm, bn, tid, o);
    if (at != UINT64_MAX && s.q[o] != 0)
      atomicAdd((unsigned long long *)&w.qw[at], (unsigned long long)s.q[o]); /* modulo 2^64 */
  }
  if (s.mx) atomicMax(&r->mx_w, s.mx);
  if (s.nf) atomicAdd(&r->nf_w, (unsigned long long)s.nf);
  if (s.bad != UINT64_MAX) atomicMin(&r->bad_w, (unsigned long long)s.bad);
}

/* One thread per (chunk group, column): the bias partials' q summed, one
 * atomicAdd per item. */
__global__ void __launch_bounds__(BX_TG_BLOCK) bx_cut_tokred_bias_kernel(bx_tgt_wgrad w, tk_res *r) {
  bx_tgt_acc s;
  bx_tgt_acc_init(&s);
  BX_CUT_FOR(i, w.zgroups * w.n) {
    int64_t q;
    bx_tgt_bias_item(&w, i, &q, &s);
    if (q != 0) atomicAdd((unsigned long long *)&w.qb[i % w.n], (unsigned long long)q);
  }
  if (s.mx) atomicMax(&r->mx_b, s.mx);
  if (s.nf) atomicAdd(&r->nf_b, (unsigned long long)s.nf);
  if (s.bad != UINT64_MAX) atomicMin(&r->bad_b, (unsigned long long)s.bad);
}

/* One thread per column: chunk c's bias partial stored (the error path and
 * the ordinary mode). */
__global__ void __launch_bounds__(BX_TG_BLOCK) bx_cut_tokred_bias_chunk_kernel(bx_tgt_wgrad w,
                                                                               uint64_t c, float *pb) {
  BX_CUT_FOR(j, w.n) pb[j] = bx_tgt_bias_partial(&w, c, j);
}

/* ---- launchers ---------------------------------------------------------------------- */

/* train_device.h tokred_maxabs: zeroed maxima, the kernel, the copy back. */
bx_status bx_cut_tokred_maxabs(const char *fn, int device, const void *a, int a_bf16, size_t rows,
                               size_t cols, size_t chunk, uint32_t *mx) {
  size_t nch = rows / chunk + (rows % chunk != 0);
  if (nch == 0) return BX_OK;
  cudaError_t pending = cudaPeekAtLastError();
  bx_cu_device_guard guard(device);
  void *base;
  bx_status st = tk_reserve(fn, device, nch * sizeof(uint32_t), &base);
  if (st != BX_OK) return st;
  bx_tgt_maxabs m = {a, a_bf16, rows, cols, chunk, nch, (uint32_t *)base};
  uint64_t per = (uint64_t)(chunk < rows ? chunk : rows) * cols; /* elements of a chunk */
  uint64_t gy = (per + 16 * BX_TG_BLOCK - 1) / (16 * BX_TG_BLOCK);
  unsigned gx = nch > BX_TG_MAX_BLOCKS ? BX_TG_MAX_BLOCKS : (unsigned)nch;
  gy = gy < 1 ? 1 : gy > BX_TG_MAX_BLOCKS ? BX_TG_MAX_BLOCKS : gy;
  void *args[] = {&m};
  cudaError_t e = cudaMemsetAsync(base, 0, nch * sizeof(uint32_t), 0);
  if (e == cudaSuccess && per)
    e = cudaLaunchKernel((const void *)bx_cut_tokred_maxabs_kernel, dim3(gx, (unsigned)gy),
                         dim3(BX_TG_BLOCK), args, 0, 0);
  if (e == cudaSuccess) e = cudaMemcpy(mx, base, nch * sizeof(uint32_t), cudaMemcpyDeviceToHost);
  if (e != cudaSuccess) return bx_cu_fail(fn, "the token reduction's bound kernel", e, pending);
  return BX_OK;
}

/* train_device.h tokred_grid: the q words and results back to the host
 * (and the first breaking element's value). */
bx_status bx_cut_tokred_grid(const char *fn, int device, const float *a, size_t n, double inv_step,
                             uint32_t lim, int64_t *q, bx_tokred_dev_res *res) {
  cudaError_t pending = cudaPeekAtLastError();
  bx_cu_device_guard guard(device);
  void *base;
  size_t rb = align256(sizeof(tk_res));
  bx_status st = tk_reserve(fn, device, rb + n * sizeof(int64_t), &base);
  if (st != BX_OK) return st;
  tk_res *r = (tk_res *)base, h;
  bx_tgt_grid g = {a, n, inv_step, lim, (int64_t *)((char *)base + rb)};
  void *args[] = {&g, &r};
  cudaError_t e = tk_res_clear(r);
  if (e == cudaSuccess && n) e = bx_cut_launch((const void *)bx_cut_tokred_grid_kernel, n, args);
  if (e == cudaSuccess) e = cudaMemcpy(&h, r, sizeof h, cudaMemcpyDeviceToHost);
  if (e == cudaSuccess && h.bad_w < n)
    e = cudaMemcpy(&h.bad_value, a + h.bad_w, sizeof(float), cudaMemcpyDeviceToHost);
  if (e == cudaSuccess && n) e = cudaMemcpy(q, g.q, n * sizeof(int64_t), cudaMemcpyDeviceToHost);
  if (e != cudaSuccess) return bx_cu_fail(fn, "the token reduction's grid kernel", e, pending);
  tk_res_out(h, 1, res);
  return BX_OK;
}


/* train_device.h tokred_wgrad: the weight kernel, then the bias kernel,
 * into zeroed q words; everything back to the host once. */
bx_status bx_cut_tokred_wgrad(const char *fn, int device, const bx_tokred_dev_wgrad *w,
                              int64_t *qw, int64_t *qb, bx_tokred_dev_res *rw,
                              bx_tokred_dev_res *rb) {
  uint64_t gx = (w->n + BX_TG_GEMM_BM - 1) / BX_TG_GEMM_BM, gy = (w->k + BX_TG_GEMM_BN - 1) / BX_TG_GEMM_BN;
  if (w->do_w && (gx > 0x7FFFFFFFu || gy > 65535u))
    return bx_fail(BX_EINVAL, "%s: a %zu x %zu weight exceeds the CUDA kernel's grid (at most "
                   "2^31 - 1 row tiles and 65535 column tiles of 64)", fn, w->n, w->k);
  size_t nk = w->do_w ? w->n * w->k : 0, nb = w->do_b ? w->n : 0;
  cudaError_t pending = cudaPeekAtLastError();
  bx_cu_device_guard guard(device);
  void *base;
  size_t rbytes = align256(sizeof(tk_res)), wbytes = align256(nk * sizeof(int64_t));
  bx_status st = tk_reserve(fn, device, rbytes + wbytes + nb * sizeof(int64_t), &base);
  if (st != BX_OK) return st;
  tk_res *r = (tk_res *)base, h;
  bx_tgt_wgrad t = bx_tgt_wgrad_of(w, gx * gy);
  t.qw = (int64_t *)((char *)base + rbytes);
  t.qb = (int64_t *)((char *)base + rbytes + wbytes);
  void *args[] = {&t, &r};
  cudaError_t e = tk_res_clear(r);
  if (e == cudaSuccess && nk + nb)
    e = cudaMemsetAsync(t.qw, 0, wbytes + nb * sizeof(int64_t), 0);
  if (e == cudaSuccess && nk)
    e = cudaLaunchKernel((const void *)bx_cut_tokred_wgrad_kernel,
                         dim3((unsigned)gx, (unsigned)gy, (unsigned)t.zgroups),
                         dim3(BX_TG_GEMM_THREADS), args, 0, 0);
  if (e == cudaSuccess && nb) {
    bx_tgt_wgrad tb = t;
    tb.zgroups = bx_tgt_zgroups((w->n + BX_TG_BLOCK - 1) / BX_TG_BLOCK, w->nchunks); /* ~2^18 threads */
    void *bargs[] = {&tb, &r};
    e = bx_cut_launch((const void *)bx_cut_tokred_bias_kernel, tb.zgroups * w->n, bargs);
  }
  if (e == cudaSuccess) e = cudaMemcpy(&h, r, sizeof h, cudaMemcpyDeviceToHost);
  if (e == cudaSuccess && nk) e = cudaMemcpy(qw, t.qw, nk * sizeof(int64_t), cudaMemcpyDeviceToHost);
  if (e == cudaSuccess && nb) e = cudaMemcpy(qb, t.qb, nb * sizeof(int64_t), cudaMemcpyDeviceToHost);
  if (e != cudaSuccess) return bx_cu_fail(fn, "the weight-gradient kernels", e, pending);
  tk_res_out(h, 1, rw);
  tk_res_out(h, 0, rb);
  return BX_OK;
}

/* train_device.h tokred_wgrad_chunk: chunk c's partials (gemm.cu's TN
 * kernel on its rows; the bias kernel) into scratch, then to the host. */
bx_status bx_cut_tokred_wgrad_chunk(const char *fn, int device, const bx_tokred_dev_wgrad *w,
                                    size_t c, float *pw, float *pb) {
  size_t nk = pw ? w->n * w->k : 0, nb = pb ? w->n : 0;
  bx_tgt_wgrad t = bx_tgt_wgrad_of(w, 1);
  size_t wbytes = align256(nk * sizeof(float));
  void *base;
  {
    bx_cu_device_guard guard(device);
    bx_status st = tk_reserve(fn, device, wbytes + nb * sizeof(float), &base);
    if (st != BX_OK) return st;
  }
  float *dw = (float *)base, *db = (float *)((char *)base + wbytes);
  if (nk) { /* bx_gemm's TN kernel on the chunk's rows */
    bx_tg_gemm g = bx_tgt_wgrad_gemm(&t, c);
    bx_status st = bx_cut_gemm(fn, device, g.a, g.a_bf16, g.b, g.b_bf16, 2, dw, g.m, g.n, g.k, 0);
    if (st != BX_OK) return st;
  }
  cudaError_t pending = cudaPeekAtLastError();
  bx_cu_device_guard guard(device);
  uint64_t cc = c;
  void *args[] = {&t, &cc, &db};
  cudaError_t e = cudaSuccess;
  if (nb) e = bx_cut_launch((const void *)bx_cut_tokred_bias_chunk_kernel, nb, args);
  if (e == cudaSuccess && nk) e = cudaMemcpy(pw, dw, nk * sizeof(float), cudaMemcpyDeviceToHost);
  if (e == cudaSuccess && nb) e = cudaMemcpy(pb, db, nb * sizeof(float), cudaMemcpyDeviceToHost);
  if (e != cudaSuccess) return bx_cu_fail(fn, "the weight-gradient partial kernels", e, pending);
  return BX_OK;
}
