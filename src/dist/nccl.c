/*
 * nccl.c — bx_comm over NCCL: int64 words, ncclSum or ncclMax, in place,
 * on a CUDA stream. Integer all-reduce is exact and associative, so
 * whatever algorithm NCCL picks (ring, tree, NVLS) every rank gets the
 * same words.
 *
 * ctx is the ncclComm_t itself and bx_comm.stream the cudaStream_t, so the
 * struct owns nothing. The blocking allreduce_i64 only receives ctx, not
 * the bx_comm, so it cannot see .stream: it runs on the legacy default
 * stream, the stream of bitexact's blocking calls (bitexact_cuda.h), which
 * orders it after their kernels whatever flags the caller's streams have,
 * and waits for it there. allreduce_i64_async runs on the stream it is
 * given (the plan's stream).
 *
 * Return codes of both (BX_ECOMM's text prints them): 0 success; > 0 the
 * ncclResult_t that failed; < 0 minus the cudaError_t of the wait; -1 also
 * for a bad argument (unknown bx_op, NULL communicator).
 */
#include <string.h>

#include "bitexact_nccl.h"

_Static_assert(sizeof(ncclComm_t) <= sizeof(void *), "ncclComm_t must fit in a pointer");
_Static_assert(sizeof(cudaStream_t) <= sizeof(void *), "cudaStream_t must fit in a pointer");

static ncclComm_t comm_of(void *ctx) {
  ncclComm_t c;
  memcpy(&c, &ctx, sizeof c);
  return c;
}

static cudaStream_t stream_of(void *s) {
  cudaStream_t st;
  memcpy(&st, &s, sizeof st);
  return st;
}

/* A non-blocking communicator (ncclConfig_t.blocking = 0) may answer
 * ncclInProgress while it is still enqueueing on the host; NCCL requires
 * polling ncclCommGetAsyncError until that settles before the next call.
 * This waits for NCCL's host-side work only, never for the GPU. */
static ncclResult_t settle(ncclComm_t comm, ncclResult_t rc) {
  while (rc == ncclInProgress) {
    ncclResult_t async = ncclSuccess;
    ncclResult_t q = ncclCommGetAsyncError(comm, &async);
    rc = q != ncclSuccess ? q : async;
  }
  return rc;
}

static int enqueue(int64_t *buf, size_t n, bx_op op, ncclComm_t comm, cudaStream_t stream) {
  if (!comm || (op != BX_OP_SUM && op != BX_OP_MAX)) return -1;
  if (n == 0) return 0;
  ncclResult_t rc = ncclAllReduce(buf, buf, n, ncclInt64, op == BX_OP_MAX ? ncclMax : ncclSum,
                                  comm, stream);
  rc = settle(comm, rc);
  return rc == ncclSuccess ? 0 : (int)rc;
}

static int nccl_allreduce_i64_async(int64_t *buf, size_t n, bx_op op, void *ctx, void *s) {
  return enqueue(buf, n, op, comm_of(ctx), stream_of(s));
}

static int nccl_allreduce_i64(int64_t *buf, size_t n, bx_op op, void *ctx) {
  ncclComm_t comm = comm_of(ctx);
  if (!comm) return -1;
  if (n == 0) return 0;
  /* stream 0 is per device: use (and wait on) the communicator's device */
  int dev = 0, saved = 0, rc = 0;
  ncclResult_t q = ncclCommCuDevice(comm, &dev);
  if (q != ncclSuccess) return (int)q;
  cudaError_t ce = cudaGetDevice(&saved);
  if (ce == cudaSuccess && saved != dev) ce = cudaSetDevice(dev);
  if (ce != cudaSuccess) return -(int)ce;
  rc = enqueue(buf, n, op, comm, (cudaStream_t)0);
  if (rc == 0) {
    ce = cudaStreamSynchronize((cudaStream_t)0);
    if (ce != cudaSuccess) rc = -(int)ce;
  }
  if (rc == 0) { /* errors NCCL reports only asynchronously: a peer failed, the network */
    ncclResult_t async = ncclSuccess;
    q = ncclCommGetAsyncError(comm, &async);
    if (q != ncclSuccess || async != ncclSuccess) rc = (int)(q != ncclSuccess ? q : async);
  }
  if (saved != dev) cudaSetDevice(saved);
  return rc;
}

bx_comm bx_comm_nccl(ncclComm_t comm, cudaStream_t stream) {
  bx_comm c = BX_COMM_DEFAULT; /* struct_size: this build's sizeof(bx_comm) */
  c.allreduce_i64 = nccl_allreduce_i64;
  c.allreduce_i64_async = nccl_allreduce_i64_async;
  memcpy(&c.ctx, &comm, sizeof comm);
  memcpy(&c.stream, &stream, sizeof stream);
  c.on_device = 1;
  if (!comm || ncclCommUserRank(comm, &c.rank) != ncclSuccess) c.rank = -1;
  return c;
}
