/*
 * backend.cu — the CUDA backend of the blocking calls (src/core/backend.h):
 * bx_total_norm, bx_clip_grad_norm and bx_scale on kDLCUDA tensors, and
 * host-tensor calls with a device communicator (bx_comm_nccl), on the
 * legacy default stream.
 *
 * Memory: every byte a call needs (the plan's buffers, the staging of a
 * device communicator's words) comes from a grow-only device arena of the
 * calling thread and nesting level (call.h), reserved in prepare, before
 * the call's first collective: an out-of-memory fails every rank in the
 * agreement instead of leaving some ranks scaled. Nothing is freed per
 * call (cudaFree synchronises the device: a deadlock hazard with NCCL
 * kernels in flight). Growing the arena allocates the new block first and
 * frees the old one stream-ordered (cudaMallocAsync / cudaFreeAsync on
 * devices with memory pools; cudaMalloc / cudaFree otherwise, the only
 * place that may synchronise, and only when a call needs more than any
 * before it on this thread). The arena is freed when the thread exits.
 *
 * CUDA errors: calls and launches report their own result; the runtime's
 * last error is cleared only when it is ours (bx_cu_fail), so another
 * library's pending error stays for it to see.
 */
#include <stdlib.h>
#include <string.h>

#include "call.h"
#include "cuda_internal.h"

namespace {

thread_local bx_cu_arena arenas[BX_MAX_NESTING + 1];
thread_local bx_device_call calls[BX_MAX_NESTING + 1];

int level_now() {
  int l = bx_call_depth();
  return l > BX_MAX_NESTING ? BX_MAX_NESTING : l;
}

bx_status cu_available() {
  int n = 0;
  cudaError_t pending = cudaPeekAtLastError();
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    if (pending == cudaSuccess) cudaGetLastError();
    return bx_fail(BX_EDEVICE, "bx_cuda_available: the CUDA backend is built in, but no CUDA "
                   "device is usable: %s", cudaGetErrorString(e));
  }
  if (n == 0) return bx_fail(BX_EDEVICE, "bx_cuda_available: no CUDA device");
  return BX_OK;
}

bx_status cu_prepare(const char *fn, const bx_device_prep *prep, bx_device_call **out) {
  bx_status st = cu_available();
  if (st != BX_OK) return bx_fail(st, "%s: %s", fn, bx_last_error());
  int level = level_now();
  bx_device_call *dc = &calls[level];
  memset(dc, 0, sizeof *dc);
  dc->level = level;
  dc->rank = prep->rank < 0 ? 0 : prep->rank;
  dc->plan = &dc->storage;
  bx_cuda_plan *plan = dc->plan;
  bx_clip_opts o = BX_CLIP_OPTS_DEFAULT;
  o.norm.norm_type = prep->p;
  bx_group none = {NULL, 0};
  const bx_group *gs = prep->groups ? (prep->ngroups ? prep->groups : &none) : NULL;
  if (prep->reduce || prep->scale) {
    st = bx_cu_plan_check(fn, gs, prep->ngroups, prep->flat, prep->count, &o, prep->mode, plan);
    if (st != BX_OK) return st;
    if (prep->groups) plan->ngroups = prep->ngroups;
  } else { /* host tensors, a device communicator: staging only */
    memset(plan, 0, sizeof *plan);
    cudaError_t pending = cudaPeekAtLastError();
    if (cudaGetDevice(&plan->device) != cudaSuccess) {
      plan->device = 0;
      if (pending == cudaSuccess) cudaGetLastError();
    }
    plan->mode = prep->mode;
    plan->opts = o;
    plan->wire_words = bx_wire_words(prep->mode);
    plan->ngroups = prep->ngroups;
  }
  plan->stage_words = prep->stage_words;
  bx_cu_device_guard guard(plan->device);
  bx_cu_arena *a = &arenas[level];
  size_t ng = plan->ngroups ? plan->ngroups : 1;
  size_t host_bytes = (plan->nchunks ? plan->nchunks : 1) * sizeof(bx_cu_chunk);
  size_t ext_bytes = ng * BX_CU_EXT_WORDS * sizeof(uint64_t) + 8;
  if (ext_bytes > host_bytes) host_bytes = ext_bytes;
  st = bx_cu_arena_reserve(fn, "reserving the call's device memory before the first collective",
                             a, plan->device, bx_cu_plan_bytes(plan), host_bytes);
  if (st != BX_OK) return st;
  if (prep->reduce || prep->scale)
    st = bx_cu_plan_bind(fn, gs, prep->ngroups, prep->flat, prep->count, plan, a->dev,
                         (bx_cu_chunk *)a->host);
  else
    st = bx_cu_plan_bind(fn, NULL, 0, NULL, 0, plan, a->dev, (bx_cu_chunk *)a->host);
  if (st != BX_OK) return st;
  *out = dc;
  return BX_OK;
}

bx_status cu_partials(bx_device_call *dc, bx_partial *parts, int64_t *offender, unsigned *dtypes) {
  static const char *fn = "bx_total_norm";
  bx_cuda_plan *plan = dc->plan;
  bx_cu_arena *a = &arenas[dc->level];
  bx_cu_device_guard guard(plan->device);
  size_t ng = plan->ngroups ? plan->ngroups : 1;
  cudaStream_t s0 = 0; /* legacy default stream: ordered after other blocking streams */
  cudaError_t pending = cudaPeekAtLastError();
  cudaError_t e = cudaMemsetAsync(plan->b.accs, 0,
                                  (size_t)((char *)plan->b.offender - (char *)plan->b.accs), s0);
  if (e == cudaSuccess) e = cudaMemsetAsync(plan->b.offender, 0xFF, sizeof(int64_t), s0);
  if (e == cudaSuccess) e = bx_cu_launch_reduce(plan, s0, dc->rank);
  for (size_t g = 0; g < plan->ngroups; g++) bx_partial_init(&parts[g]);
  /* the digits and counters straight into each partial's accumulator */
  if (e == cudaSuccess && plan->ngroups)
    e = cudaMemcpy2D(&parts[0].acc, sizeof(bx_partial), plan->b.accs, BX_ACC_WORDS * sizeof(int64_t),
                     (BX_ACC_DIGITS + 3) * sizeof(int64_t), plan->ngroups, cudaMemcpyDeviceToHost);
  uint64_t *ext = (uint64_t *)a->host;
  if (e == cudaSuccess)
    e = cudaMemcpy(ext, plan->b.ext, ng * BX_CU_EXT_WORDS * sizeof(uint64_t), cudaMemcpyDeviceToHost);
  if (e == cudaSuccess) e = cudaMemcpy(offender, plan->b.offender, sizeof(int64_t), cudaMemcpyDeviceToHost);
  if (e != cudaSuccess) return bx_cu_fail(fn, "the reduction kernel", e, pending);
  *dtypes |= plan->dtypes; /* found when the plan was checked */
  for (size_t g = 0; g < plan->ngroups; g++) {
    bx_partial *q = &parts[g];
    q->acc.naccs = 1;
    q->acc.version = BX_ACC_VERSION_TAG;
    bx_acc_normalize(&q->acc);
    const uint64_t *x = ext + g * BX_CU_EXT_WORDS;
    q->maxabs = bx_f64_from_bits(x[0]);
    q->minabs = x[1] ? bx_f64_from_bits(~x[1]) : bx_f64_from_bits(BX_F64_INF_BITS);
    q->nonzero = (int64_t)x[2];
    q->nan = (int64_t)x[3];
    q->pending = 0;
  }
  return BX_OK;
}

int cu_allreduce_staged(bx_device_call *dc, const bx_comm *comm, int64_t *buf, size_t n, bx_op op) {
  return bx_cu_allreduce_staged(dc, comm, buf, n, op);
}

bx_status cu_scale(bx_device_call *dc, double coef, const bx_scale_opts *o) {
  static const char *fn = "bx_scale";
  bx_cuda_plan *plan = dc->plan;
  plan->opts.scale = *o;
  bx_cu_device_guard guard(plan->device);
  cudaError_t pending = cudaPeekAtLastError();
  cudaError_t e = bx_cu_launch_scale(plan, 0, NULL, coef, NULL, 0);
  if (e == cudaSuccess) e = cudaStreamSynchronize(0);
  if (e != cudaSuccess) return bx_cu_fail(fn, "the scaling kernel", e, pending);
  return BX_OK;
}

void cu_release(bx_device_call *dc) {
  dc->plan = nullptr; /* the arena is kept for the thread's next call */
}

} // namespace

int bx_cu_allreduce_staged(bx_device_call *dc, const bx_comm *comm, int64_t *buf, size_t n,
                           bx_op op) {
  if (!dc || !dc->plan || !dc->plan->b.stage || n > dc->plan->stage_words ||
      !comm->allreduce_i64_async)
    return -1;
  int64_t *d = dc->plan->b.stage;
  cudaStream_t st = (cudaStream_t)comm->stream;
  cudaError_t pending = cudaPeekAtLastError();
  int rc = -1;
  if (cudaMemcpyAsync(d, buf, n * sizeof(int64_t), cudaMemcpyHostToDevice, st) == cudaSuccess) {
    rc = comm->allreduce_i64_async(d, n, op, comm->ctx, (void *)st);
    if (rc == 0 &&
        (cudaMemcpyAsync(buf, d, n * sizeof(int64_t), cudaMemcpyDeviceToHost, st) != cudaSuccess ||
         cudaStreamSynchronize(st) != cudaSuccess))
      rc = -1;
  }
  if (rc != 0) {
    cudaStreamSynchronize(st);
    if (pending == cudaSuccess) cudaGetLastError();
  }
  return rc;
}

extern "C" const bx_device_backend bx_cuda_backend = {
    "cuda", cu_available, cu_prepare, cu_partials, cu_allreduce_staged, cu_scale, cu_release,
};

/* ---- the grow-only arena (cuda_internal.h) ---- */

bx_status bx_cu_arena_reserve(const char *fn, const char *what, bx_cu_arena *a, int device,
                              size_t bytes, size_t host_bytes) {
  if (host_bytes > a->host_cap) {
    void *h = realloc(a->host, host_bytes);
    if (!h) return bx_fail(BX_ENOMEM, "%s: cannot allocate %zu bytes of host staging", fn, host_bytes);
    a->host = h;
    a->host_cap = host_bytes;
  }
  if (a->dev && a->device == device && a->cap >= bytes) return BX_OK;
  cudaError_t pending = cudaPeekAtLastError();
  int pools = 0;
  if (cudaDeviceGetAttribute(&pools, cudaDevAttrMemoryPoolsSupported, device) != cudaSuccess) {
    pools = 0;
    if (pending == cudaSuccess) cudaGetLastError();
  }
  size_t want = bytes < ((size_t)1 << 16) ? ((size_t)1 << 16) : bytes + bytes / 4;
  void *p = nullptr;
  cudaError_t e = pools ? cudaMallocAsync(&p, want, 0) : cudaMalloc(&p, want);
  if (e != cudaSuccess) return bx_cu_fail(fn, what, e, pending);
  if (a->dev) { /* the old block, on its own device */
    bx_cu_device_guard guard(a->device);
    if (a->pooled) cudaFreeAsync(a->dev, 0);
    else cudaFree(a->dev);
    if (pending == cudaSuccess) cudaGetLastError();
  }
  a->dev = p;
  a->cap = want;
  a->device = device;
  a->pooled = pools;
  return BX_OK;
}
