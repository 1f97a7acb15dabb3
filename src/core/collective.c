/*
 * collective.c — talking to the other ranks through a bx_comm: the tiny
 * agreement step (do all ranks run the same build, group count and
 * options? did any rank find a NaN/Inf it must report?) and the checks on
 * the communicator's answers. The norm's own reduction is one fixed-size
 * SUM (or MAX) issued by norm.c.
 */
#include <stdio.h>

#include "internal.h"
#include "offender.h"

bx_status bx_comm_allreduce(const bx_comm *comm, const char *fn, const char *what,
                            int64_t *buf, size_t n, bx_op op) {
  if (!comm->allreduce_i64)
    return bx_fail(BX_EINVAL, "%s: rank %d: comm->allreduce_i64 is NULL", fn, comm->rank);
  /* a device communicator (NCCL) needs device memory: staged by src/cuda */
  int rc = comm->on_device ? bx_cuda_allreduce_staged(comm, buf, n, op)
                           : comm->allreduce_i64(buf, n, op, comm->ctx);
  if (rc != 0)
    return bx_fail(BX_ECOMM, "%s: rank %d: the communicator's all-reduce (%s, %zu words) "
                   "failed with code %d; no gradient was modified",
                   fn, comm->rank, what, n, rc);
  return BX_OK;
}

/* Agreement: every value v travels as (v, ~v) through one MAX all-reduce,
 * so each rank learns max(v) and min(v) = ~max(~v): all ranks agree iff
 * they are equal. The offender word carries the smallest (rank, group,
 * tensor) that saw a NaN/Inf, encoded so that MAX selects it. */
/* Failure keys: MAX selects the lowest failing rank; the status rides in
 * the low byte. */
int64_t bx_failure_key(int rank, bx_status st) {
  if (st == BX_OK) return -1;
  int64_t r = rank < 0 ? 0 : rank > 0xFFFFFF ? 0xFFFFFF : rank;
  return ((0xFFFFFF - r) << 8) | (int64_t)st;
}

bx_status bx_agree(const bx_comm *comm, const char *fn, const bx_agree_item *items,
                   size_t nitems, int64_t *offender, int64_t *failure) {
  int64_t buf[2 * BX_MAX_AGREE + 2];
  int64_t mine = *failure;
  if (nitems > BX_MAX_AGREE) return bx_fail(BX_EINTERNAL, "%s: too many agreement words", fn);
  for (size_t i = 0; i < nitems; i++) {
    buf[2 * i] = items[i].value;
    buf[2 * i + 1] = ~items[i].value;
  }
  buf[2 * nitems] = *offender;
  buf[2 * nitems + 1] = mine;
  bx_status st = bx_comm_allreduce(comm, fn, "agreement", buf, 2 * nitems + 2, BX_OP_MAX);
  if (st != BX_OK) return mine >= 0 ? (bx_status)(mine & 0xFF) : st;
  *failure = buf[2 * nitems + 1];
  if (mine >= 0) return (bx_status)(mine & 0xFF); /* our own error and message stand */
  if (*failure >= 0) {
    bx_status other = (bx_status)(*failure & 0xFF);
    int rank = 0xFFFFFF - (int)(*failure >> 8);
    return bx_fail(other,
                   "%s: rank %d: rank %d failed its local checks with %s (its "
                   "bx_last_error() has the detail); every rank fails, nothing was modified",
                   fn, comm->rank, rank, bx_status_str(other));
  }
  for (size_t i = 0; i < nitems; i++) {
    int64_t hi = buf[2 * i], lo = ~buf[2 * i + 1];
    if (hi != lo)
      return bx_fail(BX_EMISMATCH,
                     "%s: rank %d: ranks disagree on %s (this rank: %lld; smallest: %lld, "
                     "largest: %lld); every rank must call with the same build, group "
                     "count and options. Nothing was modified",
                     fn, comm->rank, items[i].name, (long long)items[i].value, (long long)lo,
                     (long long)hi);
  }
  *offender = buf[2 * nitems];
  return BX_OK;
}

/* Offender keys: see offender.h (shared with the CUDA kernels). */
int64_t bx_offender_key(int rank, size_t group, size_t tensor, int is_nan) {
  return bx_offender_key_of(rank, group, tensor, is_nan);
}

void bx_offender_decode(int64_t key, int *rank, size_t *group, size_t *tensor, int *is_nan) {
  uint64_t k = (1ull << 63) - 1 - (uint64_t)key;
  *is_nan = !(k & 1);
  k >>= 1;
  *tensor = (size_t)(k & ((1ull << BX_OFFENDER_TENSOR_BITS) - 1));
  k >>= BX_OFFENDER_TENSOR_BITS;
  *group = (size_t)(k & ((1ull << BX_OFFENDER_GROUP_BITS) - 1));
  k >>= BX_OFFENDER_GROUP_BITS;
  *rank = (int)k;
}
