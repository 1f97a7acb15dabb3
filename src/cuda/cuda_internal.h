/*
 * cuda_internal.h — what the CUDA files share: the chunk table (the
 * multi-tensor launch's work list), the plan, the kernel launchers, and
 * the error handling that leaves other libraries' CUDA errors alone.
 *
 * Dependencies: src/cuda uses the core (validation, errors, the agreement,
 * the backend interface it implements) and the host/device numerics of
 * src/common; the core knows src/cuda only through the backend table
 * registered in src/core/backends.c.
 */
#ifndef BX_CUDA_INTERNAL_H
#define BX_CUDA_INTERNAL_H

#include <cuda_runtime_api.h>
#include <stdlib.h>

#include "agree.h"
#include "backend.h"
#include "bitexact_cuda.h"
#include "collective.h"
#include "cuda_finish.h"
#include "dtype.h"
#include "error.h"
#include "exact_window.h"
#include "norm_state.h"
#include "tensor.h"

/* One block's unit of work: up to BX_CU_CHUNK elements of one tensor. */
typedef struct bx_cu_chunk {
  const void *data; /* first element of the chunk */
  uint32_t n;       /* elements, 1..BX_CU_CHUNK */
  uint16_t dtype;   /* bx_dtype */
  uint16_t unused;
  uint32_t group;
  uint32_t tensor; /* index in its group (for the NaN/Inf location) */
} bx_cu_chunk;

/* The device buffers of a plan, carved from one allocation. */
typedef struct bx_cu_buffers {
  bx_cu_chunk *chunks;
  int64_t *accs;     /* ngroups * BX_ACC_WORDS raw words */
  uint64_t *ext;     /* ngroups * BX_CU_EXT_WORDS */
  int64_t *offender; /* 1 word: first NaN/Inf key, -1 none */
  int64_t *wire;     /* BX_AGREE_WORDS + ngroups * wire words */
  double *result;    /* total, coef, then ngroups norms */
  int32_t *status;   /* the last call's device status (the scaling kernel reads it) */
  bx_mag *scratch;   /* the finishing kernel's magnitude view */
  int64_t *total_digits; /* the finishing kernel's running total */
  int64_t *stage;    /* a device communicator's staged words (blocking calls) */
} bx_cu_buffers;

struct bx_cuda_plan {
  int device;
  size_t ngroups, nchunks;
  int mode;            /* bx_mode */
  int int_squares;     /* squares of fp32/bf16/fp16 by integer windows instead of the
                          fp64 grid (BX_CUDA_SQUARES=int; the same bits either way) */
  bx_clip_opts opts;
  int has_comm;
  bx_comm comm;
  int grid;            /* blocks of the reduction kernel: all resident at once */
  int grid_scale;      /* blocks of the scaling kernel */
  int64_t agree[BX_AGREE_ITEMS]; /* this rank's items; the call and max_norm per call */
  unsigned dtypes;     /* bit d: a tensor of dtype d */
  size_t wire_words;
  size_t stage_words;
  void *base;          /* the plan's own allocation (stream-ordered plans), or NULL */
  bx_cu_buffers b;
  cudaEvent_t done;    /* recorded after each enqueue outside graph capture */
  int overlap;         /* two tensors share memory: norms fine, scaling refused */
  char overlap_msg[256];
};

/* A prepared blocking call (backend.h), or a plan's creation: the plan
 * whose buffers the call uses, staging included. */
struct bx_device_call {
  bx_cuda_plan *plan;
  int level; /* the arena it came from (backend.cu), -1 for a plan's own memory */
  int rank;  /* for the NaN/Inf location */
  bx_cuda_plan storage;
};

/* A device communicator's all-reduce of host words through the call's
 * staging buffer (plan->b.stage, plan->stage_words words) on the
 * communicator's stream; waits. The communicator's code (0 ok), -1 when
 * the staging buffer is missing or too small. */
int bx_cu_allreduce_staged(bx_device_call *dc, const bx_comm *comm, int64_t *buf, size_t n,
                           bx_op op);

/* Blocks of 256 threads of each kernel that fit on one SM at once (the
 * occupancy calculator; at least 1). */
int bx_cu_reduce_blocks_per_sm(void);
int bx_cu_scale_blocks_per_sm(void);

/* Launchers (reduce.cu, scale.cu). Each enqueues on stream with
 * cudaLaunchKernel and returns that launch's own result (never another
 * library's pending error). */
cudaError_t bx_cu_launch_reduce(const bx_cuda_plan *plan, cudaStream_t stream, int rank);
/* wire: the agreement words (the plan's items with the call and max_norm
 * bits, the failure key) and every group's words (norm_finish.h). */
cudaError_t bx_cu_launch_wire(const bx_cuda_plan *plan, cudaStream_t stream, int64_t call,
                              int64_t max_norm_bits, int64_t failure_key);
/* finish: the agreement's verdict, every group and the total rounded, the
 * coefficient (clip = 1) for max_norm; writes the outputs. out_code: the
 * dtype of d_total (BX_DT_*), the norm rounded once into it. */
cudaError_t bx_cu_launch_finish(const bx_cuda_plan *plan, cudaStream_t stream, int clip,
                                double max_norm, int out_code, void *d_total, double *d_groups,
                                double *d_coef, int32_t *d_status);
/* scale every chunk by *d_coef (or coef_host when d_coef is NULL); skips
 * all writes when *d_status != 0 or (skip_one and the coefficient is 1). */
cudaError_t bx_cu_launch_scale(const bx_cuda_plan *plan, cudaStream_t stream,
                               const double *d_coef, double coef_host, const int32_t *d_status,
                               int skip_one);

/* ---- plans (plan.cu), shared with the blocking backend (backend.cu) ---- */

/* Validate the tensors (groups, or flat[0..count) as one group when groups
 * is NULL) and fill the plan's host-side fields; *nchunks and *device. */
bx_status bx_cu_plan_check(const char *fn, const bx_group *groups, size_t ngroups,
                           const DLTensor *flat, size_t count, const bx_clip_opts *o, int mode,
                           bx_cuda_plan *plan);
/* Bytes of device memory the plan needs (with stage_words staged words). */
size_t bx_cu_plan_bytes(const bx_cuda_plan *plan);
/* Carve the buffers from base; fill the chunk table (host staging buffer
 * host: nchunks entries) and upload it; grids and agreement items. Waits
 * for the upload (legacy default stream). */
bx_status bx_cu_plan_bind(const char *fn, const bx_group *groups, size_t ngroups,
                          const DLTensor *flat, size_t count, bx_cuda_plan *plan, void *base,
                          bx_cu_chunk *host);

/* A failed CUDA call: the status (BX_ENOMEM for an allocation, else
 * BX_EDEVICE) with the CUDA text. Clears the runtime's last error only when
 * it is this call's own (pending_before: cudaPeekAtLastError() taken
 * before the call), so another library's error stays for it to see. */
bx_status bx_cu_fail(const char *fn, const char *what, cudaError_t e, cudaError_t pending_before);

/* A grow-only device arena of one thread (backend.cu's calls per nesting
 * level, tokred.cu's scratch): never freed during a call (cudaFree
 * synchronises the device: a deadlock hazard with NCCL kernels in flight);
 * growing allocates the new block first and frees the old one
 * stream-ordered (cudaMallocAsync / cudaFreeAsync where the device has
 * memory pools); freed when the thread exits. */
struct bx_cu_arena {
  void *dev = nullptr;
  size_t cap = 0;
  int device = -1;
  int pooled = 0;
  void *host = nullptr; /* chunk table and word staging on the host */
  size_t host_cap = 0;
  ~bx_cu_arena() {
    if (dev) {
      int prev = 0;
      bool ok = cudaGetDevice(&prev) == cudaSuccess;
      cudaSetDevice(device);
      if (pooled) cudaFreeAsync(dev, 0);
      else cudaFree(dev);
      if (ok) cudaSetDevice(prev);
      cudaGetLastError(); /* thread exit: nothing of the caller's is pending here */
    }
    free(host);
  }
};

/* At least bytes of device memory on device, and host_bytes of host
 * staging; what names the allocation in a failure's message. */
bx_status bx_cu_arena_reserve(const char *fn, const char *what, bx_cu_arena *a, int device,
                              size_t bytes, size_t host_bytes);

/* Selects a device for the scope of a call and restores the caller's. */
struct bx_cu_device_guard {
  int prev;
  bool ok;
  explicit bx_cu_device_guard(int dev) {
    ok = cudaGetDevice(&prev) == cudaSuccess;
    if (!ok || prev != dev) cudaSetDevice(dev);
  }
  ~bx_cu_device_guard() {
    if (ok) cudaSetDevice(prev);
  }
};

#endif /* BX_CUDA_INTERNAL_H */
