/*
 * collective.c — talking to the other ranks through a bx_comm: the one
 * all-reduce wrapper and the agreement step (its layout: agree.h). The
 * norm's own reduction is one fixed-size SUM (or MAX) issued by norm.c.
 */
#include <stdio.h>
#include <string.h>

#include "call.h"
#include "collective.h"
#include "error.h"
#include "offender.h"

bx_status bx_comm_allreduce(const bx_comm *comm, bx_device_call *dev, const char *fn,
                            const char *what, int64_t *buf, size_t n, bx_op op) {
  if (!comm->allreduce_i64)
    return bx_fail_at(BX_EINVAL, comm->rank, BX_NO_INDEX, BX_NO_INDEX,
                      "%s: rank %d: comm->allreduce_i64 is NULL", fn, comm->rank);
  int rc;
  if (comm->on_device) {
    /* a device communicator (NCCL) needs device memory: staged through
     * what the backend prepared before the first collective */
    const bx_device_backend *be = bx_backend_cuda();
    rc = be && dev ? be->allreduce_staged(dev, comm, buf, n, op) : -1;
  } else {
    bx_call_user_begin(); /* the callback runs in the caller's environment */
    rc = comm->allreduce_i64(buf, n, op, comm->ctx);
    bx_call_user_end();
  }
  if (rc != 0)
    return bx_fail_at(BX_ECOMM, comm->rank, BX_NO_INDEX, BX_NO_INDEX,
                      "%s: rank %d: the communicator's all-reduce (%s, %zu words) failed "
                      "with code %d; no gradient was modified",
                      fn, comm->rank, what, n, rc);
  return BX_OK;
}

/* An agreement item's value as a caller wrote it (dtypes and modes by
 * name, doubles as numbers), for mismatch messages. */
static void agree_value(int item, int64_t v, char *buf, size_t n) {
  static const char *const dtypes[] = {"float64", "grads (the gradients' dtype)", "float32",
                                       "bfloat16", "float16"};
  static const char *const flavors[] = {"exact", "megatron_fp32"};
  static const char *const formulas[] = {"torch", "max"};
  static const char *const modes[] = {"torch", "exact"};
  const char *name = NULL;
  switch (item) {
    case BX_AGREE_NORM_TYPE:
    case BX_AGREE_MAX_NORM:
    case BX_AGREE_EPS: {
      double d;
      memcpy(&d, &v, sizeof d);
      snprintf(buf, n, "%.17g", d);
      return;
    }
    case BX_AGREE_CALL:
      name = v == BX_CALL_NORM ? "a norm" : v == BX_CALL_CLIP ? "a clip" : NULL;
      break;
    case BX_AGREE_NORM_DTYPE: name = v >= 0 && v <= 4 ? dtypes[v] : NULL; break;
    case BX_AGREE_FLAVOR: name = v >= 0 && v <= 1 ? flavors[v] : NULL; break;
    case BX_AGREE_FORMULA: name = v >= 0 && v <= 1 ? formulas[v] : NULL; break;
    case BX_AGREE_SCALE_MODE: name = v >= 0 && v <= 1 ? modes[v] : NULL; break;
    case BX_AGREE_FORMAT: snprintf(buf, n, "0x%llx", (unsigned long long)v); return;
    default: break;
  }
  if (name) snprintf(buf, n, "%s", name);
  else snprintf(buf, n, "%lld", (long long)v);
}

/* What to do about a disagreement on an item. */
static const char *agree_hint(int item) {
  switch (item) {
    case BX_AGREE_FORMAT:
      return "every rank must run the same build of bitexact";
    case BX_AGREE_CALL:
      return "every rank must make the same call (bx_total_norm or bx_clip_grad_norm) at the "
             "same point";
    case BX_AGREE_NGROUPS:
      return "every rank must pass the same number of groups; a rank that owns nothing in a "
             "group passes it empty";
    case BX_AGREE_NORM_DTYPE:
      return "every rank must ask for the same norm_dtype; to follow the gradients' dtype pass "
             "BX_NORM_GRADS (\"grads\") on every rank: the library promotes the dtypes of all "
             "ranks, so a rank holding no gradient or other dtypes gets the same result";
    default:
      return "every rank must pass the same options";
  }
}

bx_status bx_agree(const bx_comm *comm, bx_device_call *dev, const char *fn,
                   const int64_t *items, bx_status local, int64_t *offender, unsigned *dtypes) {
  int64_t w[BX_AGREE_WORDS];
  const bx_error_location *here = bx_last_error_location();
  int64_t at = local == BX_OK ? -1
                              : bx_offender_key(comm->rank,
                                                here->group < 0 ? BX_NO_INDEX : (size_t)here->group,
                                                here->tensor < 0 ? BX_NO_INDEX : (size_t)here->tensor,
                                                1);
  bx_agree_fill(w, items, *offender, bx_agree_failure_key(comm->rank, (int)local), at, *dtypes);
  /* a rank that failed keeps its own message and location, whatever the
   * collective does */
  bx_error_saved mine;
  if (local != BX_OK) bx_error_save(&mine);
  bx_status st = bx_comm_allreduce(comm, dev, fn, "agreement", w, BX_AGREE_WORDS, BX_OP_MAX);
  if (local != BX_OK) {
    bx_error_restore(&mine);
    return local;
  }
  if (st != BX_OK) return st;
  int64_t failure = w[BX_AGREE_W_FAILURE];
  if (failure >= 0) {
    bx_status other = (bx_status)bx_agree_failure_status(failure);
    int rank = bx_agree_failure_rank(failure), r, is_nan;
    size_t g = BX_NO_INDEX, t = BX_NO_INDEX;
    char where[96] = "";
    if (w[BX_AGREE_W_FAILURE_AT] >= 0) {
      bx_offender_decode(w[BX_AGREE_W_FAILURE_AT], &r, &g, &t, &is_nan);
      if (g != BX_NO_INDEX && t != BX_NO_INDEX)
        snprintf(where, sizeof where, " at group %zu, tensor %zu", g, t);
      else if (t != BX_NO_INDEX)
        snprintf(where, sizeof where, " at tensor %zu", t);
      else if (g != BX_NO_INDEX)
        snprintf(where, sizeof where, " at group %zu", g);
    }
    return bx_fail_at(other, rank, g, t,
                      "%s: rank %d: rank %d failed its local checks%s with %s (its "
                      "bx_last_error() has the detail); every rank fails, nothing was modified",
                      fn, comm->rank, rank, where, bx_status_str(other));
  }
  int bad = bx_agree_mismatch(w);
  if (bad >= 0) {
    int64_t hi = w[2 * bad], lo = ~w[2 * bad + 1];
    char here_v[48], a[48], b[48];
    agree_value(bad, items[bad], here_v, sizeof here_v);
    agree_value(bad, lo, a, sizeof a);
    agree_value(bad, hi, b, sizeof b);
    return bx_fail_at(BX_EMISMATCH, comm->rank, BX_NO_INDEX, BX_NO_INDEX,
                      "%s: rank %d: ranks disagree on %s (this rank: %s; the ranks pass at "
                      "least %s and %s): %s. Nothing was modified",
                      fn, comm->rank, bx_agree_name(bad), here_v, a, b, agree_hint(bad));
  }
  *offender = w[BX_AGREE_W_OFFENDER];
  *dtypes = bx_agree_dtypes(w);
  return BX_OK;
}

/* Offender keys: see offender.h (shared with the CUDA kernels). */
int64_t bx_offender_key(int rank, size_t group, size_t tensor, int is_nan) {
  return bx_offender_key_of(rank, group, tensor, is_nan);
}

void bx_offender_decode(int64_t key, int *rank, size_t *group, size_t *tensor, int *is_nan) {
  uint64_t k = (1ull << 63) - 1 - (uint64_t)key;
  uint64_t gmax = (1ull << BX_OFFENDER_GROUP_BITS) - 1, tmax = (1ull << BX_OFFENDER_TENSOR_BITS) - 1;
  *is_nan = !(k & 1);
  k >>= 1;
  *tensor = (size_t)(k & tmax);
  k >>= BX_OFFENDER_TENSOR_BITS;
  *group = (size_t)(k & gmax);
  k >>= BX_OFFENDER_GROUP_BITS;
  *rank = (int)k;
  /* the all-ones fields are "none" (BX_NO_INDEX, clamped into the key) */
  if (*tensor == tmax) *tensor = BX_NO_INDEX;
  if (*group == gmax) *group = BX_NO_INDEX;
}
