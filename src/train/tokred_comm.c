/*
 * tokred_comm.c — the token reduction over ranks (bitexact_train.h, "Token
 * reduction"): bx_tokred_agree (one MAX all-reduce of the agreement items
 * and each tensor's exponent bound: the grid) and bx_tokred_allreduce (the
 * agreement, then one SUM all-reduce of the words; the ordinary mode's
 * float all-reduce through comm->allreduce_f32, or its gather in rank
 * order). The state lives in tokred_internal.h.
 *
 * A device communicator (bx_comm_nccl: on_device) reduces device memory:
 * the words are staged through device memory that the CUDA backend
 * (backend.h, the norm's blocking path) reserves from its grow-only arena
 * before the call's first collective (so an out-of-memory fails this rank
 * in the agreement, like any local failure, and every rank fails), copied
 * there, all-reduced by NCCL (int64 SUM: wrap-around is the words' own
 * arithmetic; MAX for the agreement) on the communicator's stream and
 * copied back; the call waits. A rank whose staging cannot be reserved
 * (no CUDA backend or device) cannot take part: it fails locally
 * (BX_EDEVICE) and its peers wait in the collective, as for the norm.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "abi.h"
#include "agree.h"
#include "call.h"
#include "collective.h"
#include "error.h"
#include "tokred_grid.h"
#include "tokred_internal.h"

/* ---- agreement --------------------------------------------------------- */

enum {
  AG_FORMAT = 0, /* TOKRED_TAG */
  AG_CALL,       /* 1 agree, 2 allreduce */
  AG_MODE,
  AG_NTENSORS,
  AG_CHUNK,
  AG_TOTAL,
  AG_SHAPES, /* a hash of every tensor's shape */
  AG_GRID,   /* a hash of the agreed grid (allreduce only) */
  AG_ITEMS
};
static const char *const ag_names[AG_ITEMS] = {
    "the token-reduction format (bitexact build)",
    "the call (agree on some ranks, allreduce on others)",
    "the mode (and on_bound)",
    "the tensor count",
    "chunk_tokens",
    "total_tokens",
    "the tensor shapes",
    "the agreed grid"};

/* ---- a device communicator's staging ---------------------------------------- */

/* The words a state's collectives stage at once (the same on every rank
 * once the configuration is agreed): the agreement with its 2 words per
 * tensor, the words, the ordinary gather's rank count. Larger all-reduces
 * (the ordinary mode's gather) go through in pieces of this many words. */
static size_t stage_words(const bx_tokred *s) {
  size_t w = 2 * AG_ITEMS + 1 + 2 * s->ntensors;
  if (s->nwords > w) w = s->nwords;
  return w;
}

/* A call's staging: dev NULL for a host communicator. */
typedef struct comm_stage {
  const bx_device_backend *be;
  bx_device_call *dev;
  size_t words;
} comm_stage;

/* Reserves the staging of a device communicator (nothing for a host one):
 * BX_OK, or this rank's local failure (BX_EDEVICE, BX_ENOMEM) with
 * cs->dev NULL. */
static bx_status stage_prepare(const char *fn, const bx_tokred *s, const bx_comm *comm,
                               comm_stage *cs) {
  memset(cs, 0, sizeof *cs);
  if (!comm || !comm->on_device || !s) return BX_OK;
  cs->be = bx_backend_cuda();
  if (!cs->be)
    return bx_fail(BX_EDEVICE, "%s: a device communicator, but this build of bitexact has no "
                   "CUDA backend (built without nvcc, or CUDA=0)", fn);
  cs->words = stage_words(s);
  bx_device_prep prep = {NULL, 0, NULL, 0, 0, 0, 2.0, 0, cs->words, comm->rank};
  bx_status st = cs->be->prepare(fn, &prep, &cs->dev);
  if (st != BX_OK) cs->dev = NULL;
  return st;
}

/* The staging back to the backend (its arena is kept for the next call). */
static void stage_release(comm_stage *cs) {
  if (cs->dev) cs->be->release(cs->dev);
  cs->dev = NULL;
}

/* bx_comm_allreduce through the staging (for a device communicator, in
 * pieces of at most cs->words words: the same pieces on every rank). */
static bx_status allreduce(const bx_comm *comm, const comm_stage *cs, const char *fn,
                           const char *what, int64_t *buf, size_t n, bx_op op) {
  if (!comm->on_device || n <= cs->words || !cs->dev)
    return bx_comm_allreduce(comm, cs->dev, fn, what, buf, n, op);
  for (size_t at = 0; at < n; at += cs->words) {
    size_t m = n - at < cs->words ? n - at : cs->words;
    bx_status st = bx_comm_allreduce(comm, cs->dev, fn, what, buf + at, m, op);
    if (st != BX_OK) return st;
  }
  return BX_OK;
}

static int64_t mix(uint64_t h, uint64_t v) {
  h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
  return (int64_t)(h & 0x3fffffffffffffffull);
}

static void fill_items(const bx_tokred *s, int call, int64_t *items) {
  items[AG_FORMAT] = TOKRED_TAG;
  items[AG_CALL] = call;
  items[AG_MODE] = s->mode + 16 * s->on_bound;
  items[AG_NTENSORS] = (int64_t)s->ntensors;
  items[AG_CHUNK] = s->chunk_tokens;
  items[AG_TOTAL] = s->total_tokens;
  uint64_t h = 1, g = 1;
  for (size_t t = 0; t < s->ntensors; t++) {
    h = (uint64_t)mix(h, (uint64_t)s->ndim[t]);
    for (int d = 0; d < s->ndim[t]; d++) h = (uint64_t)mix(h, (uint64_t)s->shape[s->shape_at[t] + (size_t)d]);
    g = (uint64_t)mix(g, (uint64_t)(int64_t)s->grid[t]);
  }
  items[AG_SHAPES] = (int64_t)h;
  items[AG_GRID] = call == 2 ? (int64_t)g : 0;
}

/* One MAX all-reduce of the items, this rank's failure key and extra[0..n)
 * (MAX'ed in place on success). local: this rank's own failure (kept). */
static bx_status agree_step(const char *fn, const bx_tokred *s, const bx_comm *comm,
                            const comm_stage *cs, int call, bx_status local, int64_t *extra,
                            size_t nextra) {
  int64_t items[AG_ITEMS];
  if (s) fill_items(s, call, items);
  else memset(items, 0, sizeof items);
  size_t nw = 2 * AG_ITEMS + 1 + nextra;
  int64_t *w = malloc(nw * sizeof *w);
  if (!w) {
    if (local != BX_OK) return local;
    local = bx_fail(BX_ENOMEM, "%s: cannot allocate %zu agreement words", fn, nw);
    return local; /* cannot join: the others time out as for a missing rank */
  }
  for (int i = 0; i < AG_ITEMS; i++) {
    w[2 * i] = items[i];
    w[2 * i + 1] = ~items[i];
  }
  w[2 * AG_ITEMS] = bx_agree_failure_key(comm->rank, (int)local);
  for (size_t i = 0; i < nextra; i++) w[2 * AG_ITEMS + 1 + i] = extra[i];
  bx_error_saved mine;
  if (local != BX_OK) bx_error_save(&mine);
  bx_status st = allreduce(comm, cs, fn, "token-reduction agreement", w, nw, BX_OP_MAX);
  if (local != BX_OK) {
    bx_error_restore(&mine);
    st = local;
    goto done;
  }
  if (st != BX_OK) goto done;
  int64_t failure = w[2 * AG_ITEMS];
  if (failure >= 0) {
    bx_status other = (bx_status)bx_agree_failure_status(failure);
    int rank = bx_agree_failure_rank(failure);
    st = bx_fail_at(other, rank, BX_NO_INDEX, BX_NO_INDEX,
                    "%s: rank %d: rank %d failed its local checks with %s (its bx_last_error() "
                    "has the detail); every rank fails, nothing was modified",
                    fn, comm->rank, rank, bx_status_str(other));
    goto done;
  }
  for (int i = 0; i < AG_ITEMS; i++)
    if (w[2 * i] != ~w[2 * i + 1]) {
      st = bx_fail_at(BX_EMISMATCH, comm->rank, BX_NO_INDEX, BX_NO_INDEX,
                      "%s: rank %d: ranks disagree on %s (this rank: %lld; smallest %lld, "
                      "largest %lld); nothing was modified",
                      fn, comm->rank, ag_names[i], (long long)items[i], (long long)~w[2 * i + 1],
                      (long long)w[2 * i]);
      goto done;
    }
  for (size_t i = 0; i < nextra; i++) extra[i] = w[2 * AG_ITEMS + 1 + i];
done:
  free(w);
  return st;
}

static bx_status agree_impl(const char *fn, bx_tokred *s, const bx_comm *comm) {
  bx_status local = BX_OK;
  if (!s) local = bx_fail(BX_EINVAL, "%s: s is NULL", fn);
  else if (s->agreed)
    local = bx_fail(BX_EINVAL, "%s: the grid of this state is already agreed", fn);
  if (local != BX_OK && (!comm || !s)) return local; /* no state: cannot join */
  size_t n = s->ntensors;
  int64_t *E = malloc((n ? n : 1) * sizeof *E);
  if (!E) return bx_fail(BX_ENOMEM, "%s: cannot allocate %zu bound words", fn, n);
  for (size_t t = 0; t < n; t++) E[t] = s->bound[t];
  comm_stage cs;
  bx_status prep = stage_prepare(fn, s, comm, &cs); /* before the first collective */
  if (local == BX_OK) local = prep;
  bx_status st = local;
  if (comm) st = agree_step(fn, s, comm, &cs, 1, local, E, n);
  stage_release(&cs);
  if (st == BX_OK) {
    for (size_t t = 0; t < n; t++) {
      s->bound[t] = (int)E[t];
      s->grid[t] = bx_tokred_grid_exponent((int)E[t], s->nchunks);
    }
    s->agreed = 1;
  }
  free(E);
  return st;
}

bx_status bx_tokred_agree(bx_tokred *s, const bx_comm *comm) {
  static const char *fn = "bx_tokred_agree";
  bx_status st = bx_check_comm_size(fn, comm); /* before anything else */
  if (st != BX_OK) return st;
  bx_call c;
  st = bx_call_enter(&c, fn);
  if (st != BX_OK) return st;
  st = agree_impl(fn, s, comm);
  bx_call_leave(&c);
  return st;
}

/* The ordinary mode over ranks with the transport's float all-reduce
 * (comm->allreduce_f32: DDP's way, the transport's order) on a copy of the
 * fp32 sums, then the counts' SUM. */
static bx_status ordinary_float_allreduce(const char *fn, bx_tokred *s, const bx_comm *comm,
                                          const comm_stage *cs, int64_t *sum_words) {
  size_t m = s->fsum_total;
  float *f = malloc((m ? m : 1) * sizeof *f);
  if (!f) return bx_fail(BX_ENOMEM, "%s: cannot allocate %zu fp32 sums", fn, m);
  memcpy(f, s->fsum, m * sizeof *f);
  bx_call_user_begin(); /* the callback runs in the caller's environment */
  int rc = comm->allreduce_f32(f, m, comm->ctx);
  bx_call_user_end();
  bx_status st = BX_OK;
  if (rc != 0)
    st = bx_fail_at(BX_ECOMM, comm->rank, BX_NO_INDEX, BX_NO_INDEX,
                    "%s: rank %d: the communicator's float all-reduce (ordinary sums, %zu "
                    "floats) failed with code %d; no gradient was modified",
                    fn, comm->rank, m, rc);
  if (st == BX_OK) st = allreduce(comm, cs, fn, "counts", sum_words, s->nwords, BX_OP_SUM);
  if (st == BX_OK) memcpy(s->fsum, f, m * sizeof *f);
  free(f);
  return st;
}

/* The ordinary mode over ranks without a float all-reduce: a rank count,
 * then each rank's fp32 sums in its own slot (a SUM gathers them), added
 * in rank order. */
static bx_status ordinary_allreduce(const char *fn, bx_tokred *s, const bx_comm *comm,
                                    const comm_stage *cs, int64_t *sum_words) {
  if (comm->allreduce_f32 && !comm->on_device)
    return ordinary_float_allreduce(fn, s, comm, cs, sum_words);
  int64_t who[3] = {1, comm->rank, (int64_t)comm->rank * comm->rank};
  bx_status st = allreduce(comm, cs, fn, "rank count", who, 3, BX_OP_SUM);
  if (st != BX_OK) return st;
  int64_t n = who[0];
  if (comm->rank < 0 || comm->rank >= n || who[1] != n * (n - 1) / 2 ||
      who[2] != (n - 1) * n * (2 * n - 1) / 6)
    return bx_fail_at(BX_EINVAL, comm->rank, BX_NO_INDEX, BX_NO_INDEX,
                      "%s: rank %d: the ordinary mode needs comm->rank to be 0..%lld, each once",
                      fn, comm->rank, (long long)(n - 1));
  size_t m = s->fsum_total;
  int64_t *g = calloc((size_t)n * m + 1, sizeof *g);
  float *f = malloc((m ? m : 1) * sizeof *f);
  if (!g || !f) {
    free(g);
    free(f);
    return bx_fail(BX_ENOMEM, "%s: cannot allocate %lld x %zu gather words", fn, (long long)n, m);
  }
  for (size_t i = 0; i < m; i++) {
    uint32_t b;
    memcpy(&b, &s->fsum[i], 4);
    g[(size_t)comm->rank * m + i] = (int64_t)b;
  }
  st = allreduce(comm, cs, fn, "ordinary gather", g, (size_t)n * m, BX_OP_SUM);
  if (st == BX_OK) st = allreduce(comm, cs, fn, "counts", sum_words, s->nwords, BX_OP_SUM);
  if (st == BX_OK) {
    for (size_t i = 0; i < m; i++) {
      float acc = 0.0f;
      for (int64_t r = 0; r < n; r++) {
        uint32_t b = (uint32_t)g[(size_t)r * m + i];
        float v;
        memcpy(&v, &b, 4);
        acc = r == 0 ? v : acc + v;
      }
      f[i] = acc;
    }
    memcpy(s->fsum, f, m * sizeof *f);
  }
  free(g);
  free(f);
  return st;
}

static bx_status allreduce_impl(const char *fn, bx_tokred *s, const bx_comm *comm) {
  bx_status local = BX_OK;
  if (!s) local = bx_fail(BX_EINVAL, "%s: s is NULL", fn);
  else if (!s->agreed) local = bx_fail(BX_EINVAL, "%s: the grid is not agreed yet", fn);
  if (!comm || !s) return local;
  /* the observations travel with the agreement (MAX): every rank learns
   * the largest addend exponent of each tensor and whether any rank's add
   * broke a stated bound; a flagged state's words are void, not summed */
  size_t n = s->ntensors;
  int64_t *ex = malloc((2 * n + 1) * sizeof *ex);
  if (!ex && local == BX_OK) local = bx_fail(BX_ENOMEM, "%s: cannot allocate %zu words", fn, 2 * n);
  if (!ex) return local; /* cannot join: the others time out as for a missing rank */
  for (size_t t = 0; t < n; t++) {
    ex[t] = s->observed[t];
    ex[n + t] = s->flagged[t] > 0;
  }
  comm_stage cs;
  bx_status prep = stage_prepare(fn, s, comm, &cs); /* before the first collective */
  if (local == BX_OK) local = prep;
  bx_status st = agree_step(fn, s, comm, &cs, 2, local, ex, 2 * n);
  int flagged = 0;
  for (size_t t = 0; st == BX_OK && t < n; t++) flagged |= ex[n + t] != 0;
  if (st != BX_OK || (flagged && s->mode == BX_TOKRED_GRID)) {
    stage_release(&cs);
    if (st == BX_OK) /* flagged: only the observations change */
      for (size_t t = 0; t < n; t++) {
        s->observed[t] = (int)ex[t];
        if (ex[n + t] && !s->flagged[t]) s->flagged[t] = 1;
      }
    free(ex);
    return st;
  }
  /* reduce a copy, so that a failing collective leaves s unchanged (the copy's memory is
   * kept by the state for the next steps) */
  if (!s->scratch) s->scratch = malloc((s->nwords ? s->nwords : 1) * sizeof *s->scratch);
  int64_t *w = s->scratch;
  if (!w) {
    free(ex);
    stage_release(&cs);
    return bx_fail(BX_ENOMEM, "%s: cannot allocate %zu words", fn, s->nwords);
  }
  memcpy(w, s->words, s->nwords * sizeof *w);
  if (s->mode == BX_TOKRED_GRID)
    st = allreduce(comm, &cs, fn, "token-reduction words", w, s->nwords, BX_OP_SUM);
  else
    st = ordinary_allreduce(fn, s, comm, &cs, w);
  stage_release(&cs);
  if (st == BX_OK) {
    memcpy(s->words, w, s->nwords * sizeof *w);
    for (size_t t = 0; t < n; t++) s->observed[t] = (int)ex[t];
  }
  free(ex);
  return st;
}

bx_status bx_tokred_allreduce(bx_tokred *s, const bx_comm *comm) {
  static const char *fn = "bx_tokred_allreduce";
  bx_status st = bx_check_comm_size(fn, comm); /* before anything else */
  if (st != BX_OK) return st;
  bx_call c;
  st = bx_call_enter(&c, fn);
  if (st != BX_OK) return st;
  st = allreduce_impl(fn, s, comm);
  bx_call_leave(&c);
  return st;
}
