/*
 * bitexact_cuda.h — the CUDA backend: the same accumulator words on the GPU
 * as on the CPU (DESIGN §3), and a stream-ordered API that never waits on
 * the host, usable inside CUDA graph capture.
 *
 * Built into libbitexact whenever nvcc is found at build time (make
 * CUDA=0 builds without it); bx_cuda_available() says whether this build
 * has it and whether a device is visible. Two ways to use it:
 *
 *  1. Blocking, simplest: pass kDLCUDA tensors to bx_total_norm,
 *     bx_clip_grad_norm and bx_scale (bitexact.h). Each call runs on the
 *     legacy default stream (stream 0, which waits for work queued on the
 *     other blocking streams of the device), waits for its own work and
 *     returns the norm on the host, exactly as for CPU tensors. All
 *     tensors of one call must be on one CUDA device; mixing CPU and CUDA
 *     tensors in one call is BX_EDEVICE. The communicator may be a host
 *     one (bx_comm_mpi: words travel through host memory) or a device one
 *     (bx_comm_nccl). Every byte of device memory a blocking call needs
 *     is reserved before its first collective, from a grow-only arena of
 *     the calling thread (kept between calls, freed at thread exit): an
 *     out-of-memory fails every rank at the agreement step, none is left
 *     scaled, and no call frees device memory (cudaFree would synchronise
 *     the device under NCCL kernels in flight). The arena grows
 *     stream-ordered (cudaMallocAsync/cudaFreeAsync) where the device has
 *     memory pools.
 *
 *  2. Stream-ordered: build a bx_cuda_plan once for a fixed set of
 *     gradient buffers (validation, device buffers, the chunk table), then
 *     enqueue the norm, the clip or the scaling on any stream, as often as
 *     needed. Enqueueing never synchronises the host, never allocates, and
 *     enqueues a constant number of operations whatever the tensor count:
 *       norm:  2 memsets + the multi-tensor reduction kernel + the wire
 *              kernel (normalised words in the wire format) + the
 *              finishing kernel (+ 2 all-reduces with a device
 *              communicator, between the wire and finishing kernels);
 *       clip:  the norm + 1 multi-tensor scaling kernel.
 *     So a clip step can be captured into a CUDA graph and replayed.
 *     Results (norm, coefficient, status) are left in device memory.
 *
 * Numerics: the norm's bits are those of the CPU backend for every dtype
 * and norm_type 2, 1, 0, +-inf and BX_MEGATRON_FP32 (the kernels fold exact
 * integer partials with integer atomics, whose order cannot change a
 * sum; the final rounding runs the same code as bx_acc_sqrt). Other p use
 * bx_pow_det (src/common/pow_det.h), one power function built from IEEE
 * basic operations only, compiled for both: |x|^p per element is not
 * exact, but it is the same bits on the CPU and the GPU. Scaling gives the
 * CPU's bits in both modes. The environment variable BX_CUDA_SQUARES=int,
 * read when a plan is made, switches the squares of fp32/bf16/fp16 from
 * the exact fp64 grid to exact integer windows: the same bits, another
 * speed (for measurements).
 *
 * CUDA errors: every call reports its own CUDA failures (BX_EDEVICE, or
 * BX_ENOMEM for an allocation, with the CUDA text) and never clears an
 * error another library left pending in the runtime (cudaGetLastError).
 *
 * Thread-safety: a plan may be used from one host thread at a time; work
 * enqueued on it must be ordered (one stream, or streams joined by
 * events): two clip steps of one plan running concurrently on unordered
 * streams would share its accumulator buffers.
 */
#ifndef BITEXACT_CUDA_H
#define BITEXACT_CUDA_H

#include <cuda_runtime_api.h>

#include "bitexact.h"

#ifdef __cplusplus
extern "C" {
#endif

/* bx_cuda_available() (declared in bitexact.h: callable without CUDA
 * headers) says whether this build has the backend and a device. */

/* A prepared multi-tensor launch for one fixed set of CUDA tensors. */
typedef struct bx_cuda_plan bx_cuda_plan;

/* Validate groups (every tensor kDLCUDA on one existing device, dtype,
 * dense layout) and build a plan on that device: the chunk table and the
 * accumulator buffers in device memory. Tensors that share memory are
 * allowed for norms (counted twice, as on the CPU); the clip and scaling
 * calls of such a plan fail with BX_ELAYOUT.
 *   groups, ngroups  borrowed for the call; the plan KEEPS the tensors'
 *                    data addresses (not the DLTensor structs): the
 *                    buffers must stay allocated, at the same addresses,
 *                    while the plan is used. Their contents may change.
 *   comm             NULL (this process alone), a device communicator
 *                    (bx_comm_nccl) or a host one. Kept by value. Plan
 *                    creation with a communicator is collective: every rank
 *                    calls it; ranks whose checks fail make every rank
 *                    fail (one host-side MAX all-reduce, as bx_total_norm).
 *                    The stream-ordered calls need a device communicator
 *                    (a host one would need the host to wait).
 *                    comm->struct_size must be sizeof(bx_comm): a wrong one
 *                    fails at once with BX_EINVAL, before any collective
 *                    (see bx_comm in bitexact.h).
 *   opts             NULL = BX_CLIP_OPTS_DEFAULT; its norm and scale
 *                    options are fixed for the plan (copied). Its
 *                    struct_size and those of its nested norm and scale
 *                    options are checked first, as by bx_clip_grad_norm.
 *   out              *out receives the plan (NULL on failure).
 * Synchronous: allocates (cudaMalloc) and copies the chunk table; call it
 * outside graph capture. Errors: as bx_clip_grad_norm, plus BX_EDEVICE
 * (no backend or device, tensors on several devices), BX_ENOMEM. */
BX_API bx_status bx_cuda_plan_create(const bx_group *groups, size_t ngroups,
                                     const bx_comm *comm, const bx_clip_opts *opts,
                                     bx_cuda_plan **out);

/* Free a plan (NULL is allowed). Waits for the work already enqueued on
 * it (the last stream it was used on) before freeing its device buffers. */
BX_API void bx_cuda_plan_destroy(bx_cuda_plan *plan);

/* The calls below that enqueue work take the plan first and the stream
 * second. */

/* Enqueue the norm of the plan's tensors on stream (0 = legacy default).
 *   d_total_norm   device pointer, 1 double: the total norm (the same bits
 *                  as bx_total_norm on the same values).
 *   d_group_norms  device pointer to ngroups doubles, or NULL.
 *   d_status       device pointer to one int32, or NULL: 0 (BX_OK) or the
 *                  bx_status of a failure found on the device:
 *                  BX_ENONFINITE (error_if_nonfinite and a NaN/Inf;
 *                  the norm is then NaN), BX_EMISMATCH (ranks disagree;
 *                  NaN). Read it after the stream reaches this point.
 * Returns BX_EINVAL for a NULL plan or d_total_norm, BX_EDEVICE if a
 * launch fails (the CUDA error text in bx_last_error()). Never waits for
 * the device; captureable. The buffers must be on the plan's device. */
BX_API bx_status bx_cuda_norm_async(bx_cuda_plan *plan, cudaStream_t stream,
                                    double *d_total_norm, double *d_group_norms,
                                    int32_t *d_status);

/* As bx_cuda_norm_async, but the total norm is written in out_dtype
 * (float16, bfloat16, float32 or float64; BX_EDTYPE otherwise) at
 * d_total_norm: for p = 2 and 1 it is the exact value's sqrt (or sum)
 * correctly rounded ONCE into out_dtype — what a framework that reports the
 * norm in the gradients' dtype needs (rounding the fp64 norm again could be
 * off by one unit in the last place at a tie). Other norms: the fp64 value
 * rounded once into out_dtype (nearest-even). */
BX_API bx_status bx_cuda_norm_async_dtype(bx_cuda_plan *plan, cudaStream_t stream,
                                          DLDataType out_dtype, void *d_total_norm,
                                          int32_t *d_status);

/* Enqueue a whole clip step on stream: the norm as bx_cuda_norm_async,
 * the coefficient (bx_clip_coef's formula, from the plan's options; 1 when
 * max_norm == 0), then the scaling of every tensor by it with the plan's
 * scale mode. The scaling kernel reads the coefficient from device memory
 * and writes nothing when it is exactly 1 or when a failure was found on
 * the device (d_status != 0): all-or-nothing, as on the CPU.
 *   max_norm   >= 0 (BX_EINVAL otherwise; with a communicator the other
 *              ranks see BX_EMISMATCH in d_status rather than a hang).
 *              A kernel argument: a captured graph replays this value.
 *   d_coef     device pointer to one double, or NULL.
 * Other arguments as bx_cuda_norm_async. */
BX_API bx_status bx_cuda_clip_async(bx_cuda_plan *plan, cudaStream_t stream, double max_norm,
                                    double *d_total_norm, double *d_coef, int32_t *d_status);

/* Enqueue the scaling of the plan's tensors by the double at d_coef
 * (device memory), with the plan's scale mode; nothing is written when
 * *d_coef is exactly 1 (a NaN coefficient gives NaN, as on the CPU).
 * d_status (device, may be NULL): when non-NULL and non-zero at run time,
 * nothing is written. Returns as bx_cuda_norm_async. */
BX_API bx_status bx_cuda_scale_async(bx_cuda_plan *plan, cudaStream_t stream,
                                     const double *d_coef, const int32_t *d_status);

/* The device the plan lives on (its CUDA ordinal). */
BX_API int bx_cuda_plan_device(const bx_cuda_plan *plan);

#ifdef __cplusplus
}
#endif
#endif /* BITEXACT_CUDA_H */
