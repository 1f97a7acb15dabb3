/*
 * bitexact_nccl.h — the NCCL adapter: a bx_comm whose int64 all-reduces run
 * on a CUDA stream with NCCL (ncclInt64, ncclSum / ncclMax). Lives in its
 * own library (libbitexact_nccl) so that libbitexact never needs NCCL. Link
 * with -lbitexact_nccl -lbitexact -lnccl.
 *
 * Integer all-reduce is exact and associative: whatever algorithm NCCL picks
 * (ring, tree, NVLS) every rank gets the same words.
 */
#ifndef BITEXACT_NCCL_H
#define BITEXACT_NCCL_H

#include <cuda_runtime_api.h>
#include <nccl.h>

#include "bitexact.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A device communicator (bx_comm.on_device = 1) over an NCCL communicator
 * and a CUDA stream. Both entries take a DEVICE pointer and all-reduce
 * int64 words in place (ncclAllReduce(buf, buf, n, ncclInt64, ncclSum or
 * ncclMax, comm, s)):
 *   allreduce_i64_async(buf, n, op, ctx, s)  enqueues on stream s and
 *       returns without waiting (NCCL's host-side enqueue only);
 *   allreduce_i64(buf, n, op, ctx)           runs on the legacy default
 *       stream of the communicator's device and WAITS for it (for callers
 *       outside bitexact; bitexact itself never uses it on a device comm).
 * The struct holds both handles by value (nothing to free); both must stay
 * valid while it is used. rank comes from ncclCommUserRank (-1 if that
 * fails).
 *
 * With the stream-ordered API (bitexact_cuda.h) the all-reduces are
 * enqueued with allreduce_i64_async on the stream given to
 * bx_cuda_norm_async / _clip_async: the plan orders them after its kernels.
 * With the blocking API (bx_total_norm and friends) bitexact stages the
 * words through device memory reserved before the call's first collective
 * and runs allreduce_i64_async on `stream`, then waits for that stream. A
 * NCCL error becomes BX_ECOMM (asynchronous errors surface at the next call
 * or through ncclCommGetAsyncError).
 *
 * Every rank of comm must make the same bitexact calls in the same order
 * (they are collective), from one host thread per communicator. */
BX_API bx_comm bx_comm_nccl(ncclComm_t comm, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif /* BITEXACT_NCCL_H */
