/*
 * norm.c — bx_total_norm and the public accumulator entry points: validate
 * everything first, cut tensors into pieces, let the worker threads run the
 * kernels into per-(worker, group) partials, merge them exactly, round once.
 */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "ext_wire.h"
#include "internal.h"
#include "pow_det.h"

#define PIECE ((size_t)1 << 18)         /* elements per task: load balance */
#define MIN_PER_THREAD ((size_t)1 << 16) /* below this, fewer threads */
#define DEPOSIT_BUDGET ((int64_t)1 << 28)

typedef bx_mode mode; /* internal.h: BX_M_SQ, ... (the CUDA kernels share the numbers) */

typedef struct item {
  const void *data;
  size_t n;
  bx_dtype dt;
  size_t group;
} item;

typedef bx_partial partial;

typedef struct job {
  const bx_kernels *k;
  mode m;
  double p;
  const item *items;
  partial *parts; /* [worker][group] */
  size_t ngroups;
} job;

/* Grow-only per-thread scratch, freed by a thread-exit destructor so that
 * programs starting many threads do not leak. */
typedef struct workspace {
  void *p;
  size_t cap;
} workspace;

static pthread_key_t workspace_key;
static pthread_once_t workspace_once = PTHREAD_ONCE_INIT;
static int workspace_key_ok;

static void workspace_free(void *w) {
  free(((workspace *)w)->p);
  free(w);
}

static void workspace_key_init(void) {
  workspace_key_ok = pthread_key_create(&workspace_key, workspace_free) == 0;
}

void *bx_workspace(size_t bytes) {
  pthread_once(&workspace_once, workspace_key_init);
  if (!workspace_key_ok) return NULL;
  workspace *w = pthread_getspecific(workspace_key);
  if (!w) {
    w = calloc(1, sizeof *w);
    if (!w || pthread_setspecific(workspace_key, w) != 0) {
      free(w);
      return NULL;
    }
  }
  if (bytes > w->cap) {
    void *q = realloc(w->p, bytes ? bytes : 1);
    if (!q) return NULL;
    w->p = q;
    w->cap = bytes;
  }
  return w->p;
}

static void partial_init(partial *q) {
  bx_acc_init(&q->acc);
  q->maxabs = 0.0;
  q->minabs = INFINITY;
  q->nan = q->nonzero = q->pending = 0;
}

static void partial_merge(partial *into, const partial *from) {
  bx_acc_merge(&into->acc, &from->acc);
  into->acc.naccs -= from->acc.naccs; /* threads are one logical accumulator */
  into->acc.version -= from->acc.version;
  if (from->maxabs > into->maxabs) into->maxabs = from->maxabs;
  if (from->minabs < into->minabs) into->minabs = from->minabs;
  into->nan += from->nan;
  into->nonzero += from->nonzero;
}

static void run_item(void *ctx, size_t t, int worker) {
  const job *j = ctx;
  const item *it = &j->items[t];
  partial *q = &j->parts[(size_t)worker * j->ngroups + it->group];
  switch (j->m) {
    case BX_M_SQ: j->k->sumsq[it->dt](it->data, it->n, &q->acc); break;
    case BX_M_ABS: j->k->sumabs[it->dt](it->data, it->n, &q->acc); break;
    case BX_M_POW: bx_sum_pow(it->data, it->dt, it->n, j->p, &q->acc); break;
    case BX_M_MEGATRON: bx_sum_megatron_sq(it->data, it->dt, it->n, &q->acc); break;
    case BX_M_EXT:
      bx_extreme_abs(it->data, it->dt, it->n, &q->maxabs, &q->minabs, &q->nan, &q->nonzero);
      return;
  }
  q->pending += it->n < (1u << 25) ? (int64_t)(2 * it->n + 1024) : (int64_t)BX_MAX_DEPOSITS;
  if (q->pending >= DEPOSIT_BUDGET) {
    bx_acc_normalize(&q->acc);
    q->pending = 0;
  }
}

/* The norm held by a merged partial, per the rules in bitexact.h. */
static double finish(mode m, double p, const partial *q) {
  int64_t nan = m == BX_M_EXT ? q->nan : q->acc.nan_count;
  if (nan > 0) return NAN;
  switch (m) {
    case BX_M_SQ: return q->acc.inf_count ? INFINITY : bx_acc_sqrt(&q->acc);
    case BX_M_ABS: return q->acc.inf_count ? INFINITY : bx_acc_value(&q->acc);
    case BX_M_POW: return q->acc.inf_count ? INFINITY : bx_pow_det(bx_acc_value(&q->acc), 1.0 / p);
    case BX_M_MEGATRON:
      return q->acc.inf_count ? INFINITY : (double)sqrtf(bx_acc_valuef(&q->acc));
    case BX_M_EXT:
      if (p == 0.0) return (double)q->nonzero;
      if (p > 0) return q->maxabs;
      return q->minabs == INFINITY && q->maxabs == 0.0 && q->nonzero == 0 ? 0.0 : q->minabs;
  }
  return NAN;
}

/* True if span holds a NaN or ±Inf (error path only). */
static int span_nonfinite(const bx_span *s, int *is_nan) {
  for (size_t i = 0; i < s->n; i++) {
    double v = bx_load_as_double(s->data, s->dtype, i);
    if (v != v || v == INFINITY || v == -INFINITY) {
      *is_nan = v != v;
      return 1;
    }
  }
  return 0;
}

/* The first tensor (lowest group, then index) holding a NaN/Inf: its
 * offender key for this rank, or -1 (error path only). */
static int64_t first_nonfinite(const bx_group *groups, size_t ngroups, int rank) {
  for (size_t g = 0; g < ngroups; g++)
    for (size_t i = 0; i < groups[g].count; i++) {
      bx_span s;
      int is_nan = 0;
      if (bx_tensor_span(&groups[g].tensors[i], "", g, i, &s) == BX_OK &&
          span_nonfinite(&s, &is_nan))
        return bx_offender_key(rank, g, i, is_nan);
    }
  return -1;
}

static bx_status report_nonfinite(const char *fn, int64_t key, int distributed) {
  int rank, is_nan;
  size_t g, i;
  bx_offender_decode(key, &rank, &g, &i, &is_nan);
  if (distributed)
    return bx_fail(BX_ENONFINITE,
                   "%s: rank %d, group %zu, tensor %zu holds %s; error_if_nonfinite is "
                   "set, every rank fails and nothing was modified",
                   fn, rank, g, i, is_nan ? "NaN" : "an infinite value");
  return bx_fail(BX_ENONFINITE,
                 "%s: group %zu, tensor %zu holds %s; error_if_nonfinite is set, nothing "
                 "was modified",
                 fn, g, i, is_nan ? "NaN" : "an infinite value");
}

/* Words per group in the norm's collective, and its operation. */
static size_t wire_words(mode m, double p) {
  (void)p; /* p = 0: nonzero, nan (SUM); p = ±inf: max, ~min (MAX) */
  return m == BX_M_EXT ? 2 : BX_ACC_WORDS;
}

static void to_wire(mode m, double p, partial *q, int64_t *w) {
  if (m != BX_M_EXT) {
    bx_acc_normalize(&q->acc); /* the wire format promise: normalised words */
    memcpy(w, &q->acc, sizeof q->acc);
  } else {
    bx_ext e = {q->maxabs, q->minabs, q->nan, q->nonzero};
    bx_ext_to_wire(p, &e, w);
  }
}

static void from_wire(mode m, double p, const int64_t *w, partial *q) {
  if (m != BX_M_EXT) {
    memcpy(&q->acc, w, sizeof q->acc);
  } else {
    bx_ext e;
    bx_ext_from_wire(p, w, &e);
    q->maxabs = e.maxabs;
    q->minabs = e.minabs;
    q->nan = e.nan;
    q->nonzero = e.nonzero;
  }
}

static int64_t double_bits(double d) {
  int64_t b;
  memcpy(&b, &d, 8);
  return b;
}

bx_status bx_check_norm_opts(const char *fn, const bx_norm_opts *o, bx_mode *m) {
  double p = o->norm_type;
  if (p != p) return bx_fail(BX_EINVAL, "%s: norm_type is NaN", fn);
  if (p < 0 && p != -INFINITY)
    return bx_fail(BX_EINVAL, "%s: norm_type %g is negative (only -inf is allowed)", fn, p);
  if (o->num_threads < 0)
    return bx_fail(BX_EINVAL, "%s: num_threads %d is negative", fn, o->num_threads);
  if (o->flavor == BX_MEGATRON_FP32) {
    if (p != 2.0)
      return bx_fail(BX_EINVAL, "%s: BX_MEGATRON_FP32 is defined for norm_type 2 only", fn);
    *m = BX_M_MEGATRON;
    return BX_OK;
  }
  if (o->flavor != BX_EXACT) return bx_fail(BX_EINVAL, "%s: unknown flavor %d", fn, o->flavor);
  if (p == 2.0) *m = BX_M_SQ;
  else if (p == 1.0) *m = BX_M_ABS;
  else if (p == 0.0 || p == INFINITY || p == -INFINITY) *m = BX_M_EXT;
  else *m = BX_M_POW;
  return BX_OK;
}

/* What the ranks must agree on: build, group count, options, extras. */
static size_t agree_items(bx_agree_item *items, const bx_norm_opts *o, size_t ngroups,
                          const bx_agree_item *extra, size_t nextra) {
  size_t n = 0;
  items[n++] = (bx_agree_item){"the accumulator format (bitexact build)", BX_ACC_VERSION_TAG};
  items[n++] = (bx_agree_item){"the number of groups", (int64_t)ngroups};
  items[n++] = (bx_agree_item){"norm_type", double_bits(o->norm_type)};
  items[n++] = (bx_agree_item){"flavor", (int64_t)o->flavor};
  items[n++] = (bx_agree_item){"error_if_nonfinite", (int64_t)(o->error_if_nonfinite != 0)};
  for (size_t i = 0; i < nextra && n < BX_MAX_AGREE; i++) items[n++] = extra[i];
  return n;
}

bx_status bx_norm_agreed(const char *fn, const bx_group *groups, size_t ngroups,
                         const bx_comm *comm, const bx_norm_opts *opts,
                         const bx_agree_item *extra, size_t nextra, bx_status prior,
                         double *total_norm, double *group_norms) {
  bx_norm_opts o = BX_NORM_OPTS_DEFAULT;
  if (opts) o = *opts;
  mode m = BX_M_SQ;
  size_t nitems = 0, total = 0;
  bx_status st = prior;
  if (st != BX_OK) goto local_failed;
  st = bx_check_norm_opts(fn, &o, &m);
  if (st != BX_OK) goto local_failed;
  if (!total_norm) {
    st = bx_fail(BX_EINVAL, "%s: total_norm is NULL", fn);
    goto local_failed;
  }
  if (ngroups > 0 && !groups) {
    st = bx_fail(BX_EINVAL, "%s: groups is NULL with ngroups %zu", fn, ngroups);
    goto local_failed;
  }

  bx_where where = BX_ON_HOST;
  st = bx_tensors_where(fn, groups, ngroups, NULL, 0, &where);
  if (st != BX_OK) goto local_failed;
  {
  int rank = comm ? comm->rank : 0;
  size_t ww = wire_words(m, o.norm_type), nwire = (ngroups ? ngroups : 1) * ww;
  size_t parts_bytes;
  char *ws;
  partial *parts;
  int used = 1;
  int64_t gpu_offender = -1;
  if (where == BX_ON_CUDA) {
    /* the GPU fills one partial per group (src/cuda); the rest is shared */
    parts_bytes = (ngroups ? ngroups : 1) * sizeof(partial);
    ws = bx_workspace(parts_bytes + nwire * sizeof(int64_t));
    if (!ws) {
      st = bx_fail(BX_ENOMEM, "%s: cannot allocate workspace", fn);
      goto local_failed;
    }
    parts = (partial *)ws;
    st = bx_cuda_partials(fn, groups, ngroups, m, o.norm_type, rank, parts, &gpu_offender);
    if (st != BX_OK) goto local_failed;
  } else {
  /* pass 1: validate every tensor and count the pieces */
  for (size_t g = 0; g < ngroups; g++) {
    if (groups[g].count > 0 && !groups[g].tensors) {
      st = bx_fail(BX_EINVAL, "%s: group %zu: tensors is NULL with count %zu", fn, g,
                   groups[g].count);
      goto local_failed;
    }
    for (size_t i = 0; i < groups[g].count; i++) {
      bx_span s;
      st = bx_tensor_span(&groups[g].tensors[i], fn, g, i, &s);
      if (st != BX_OK) goto local_failed;
      nitems += (s.n + PIECE - 1) / PIECE;
      total += s.n;
    }
  }
  int nthreads = o.num_threads > 0 ? o.num_threads : bx_default_threads();
  if (nthreads > BX_MAX_THREADS) nthreads = BX_MAX_THREADS;
  size_t useful = total / MIN_PER_THREAD + 1;
  if ((size_t)nthreads > useful) nthreads = (int)useful;
  size_t nparts = (size_t)nthreads * (ngroups ? ngroups : 1);

  /* workspace: partials, then the items (later reused for the wire words) */
  parts_bytes = nparts * sizeof(partial);
  size_t tail_bytes = nitems * sizeof(item);
  if (comm && nwire * sizeof(int64_t) > tail_bytes) tail_bytes = nwire * sizeof(int64_t);
  ws = bx_workspace(parts_bytes + tail_bytes);
  if (!ws) {
    st = bx_fail(BX_ENOMEM, "%s: cannot allocate %zu bytes of workspace", fn,
                 parts_bytes + tail_bytes);
    goto local_failed;
  }
  parts = (partial *)ws;
  item *items = (item *)(ws + parts_bytes);
  for (size_t i = 0; i < nparts; i++) partial_init(&parts[i]);

  /* pass 2: the pieces */
  size_t k = 0;
  for (size_t g = 0; g < ngroups; g++)
    for (size_t i = 0; i < groups[g].count; i++) {
      bx_span s;
      bx_tensor_span(&groups[g].tensors[i], fn, g, i, &s);
      size_t es = bx_dtype_size(s.dtype);
      for (size_t off = 0; off < s.n; off += PIECE) {
        items[k].data = (const char *)s.data + off * es;
        items[k].n = s.n - off < PIECE ? s.n - off : PIECE;
        items[k].dt = s.dtype;
        items[k].group = g;
        k++;
      }
    }

  job j = {bx_kernels_active(), m, o.norm_type, items, parts, ngroups};
  used = bx_parallel_run(nthreads, nitems, run_item, &j);
  }

  /* merge workers into worker 0's partials, then groups into the total */
  partial all;
  partial_init(&all);
  for (size_t g = 0; g < ngroups; g++) {
    for (int w = 1; w < used; w++) partial_merge(&parts[g], &parts[(size_t)w * ngroups + g]);
    partial_merge(&all, &parts[g]);
  }
  int64_t bad = m == BX_M_EXT ? all.nan + (all.maxabs == INFINITY)
                           : all.acc.nan_count + all.acc.inf_count;
  int64_t offender = -1;
  if (o.error_if_nonfinite && bad > 0)
    offender = where == BX_ON_CUDA ? gpu_offender : first_nonfinite(groups, ngroups, rank);

  if (comm) {
    /* 1: the tiny agreement step (also spreads the first NaN/Inf location
     * and whether any rank failed its local checks) */
    bx_agree_item agree[BX_MAX_AGREE];
    size_t nagree = agree_items(agree, &o, ngroups, extra, nextra);
    int64_t failure = -1;
    st = bx_agree(comm, fn, agree, nagree, &offender, &failure);
    if (st != BX_OK) return st;
    if (o.error_if_nonfinite && offender >= 0) return report_nonfinite(fn, offender, 1);

    /* 2: the norm's one collective, fixed size: ngroups x ww words (an empty
     * group list still sends one group's worth, so every rank calls alike) */
    int64_t *wire = (int64_t *)(ws + parts_bytes); /* the items are done with */
    partial empty;
    partial_init(&empty);
    _Static_assert(sizeof(bx_acc) == BX_ACC_WORDS * sizeof(int64_t), "wire layout");
    for (size_t g = 0; g < (ngroups ? ngroups : 1); g++)
      to_wire(m, o.norm_type, ngroups ? &parts[g] : &empty, wire + g * ww);
    bx_op op = m == BX_M_EXT && o.norm_type != 0.0 ? BX_OP_MAX : BX_OP_SUM;
    st = bx_comm_allreduce(comm, fn, "norm", wire, nwire, op);
    if (st != BX_OK) return st;
    partial_init(&all);
    for (size_t g = 0; g < ngroups; g++) {
      partial_init(&parts[g]);
      from_wire(m, o.norm_type, wire + g * ww, &parts[g]);
      if (m != BX_M_EXT && (st = bx_acc_check(&parts[g].acc)) != BX_OK) return st;
      partial_merge(&all, &parts[g]);
    }
  }
  if (o.error_if_nonfinite && offender >= 0) return report_nonfinite(fn, offender, 0);

  *total_norm = finish(m, o.norm_type, &all);
  if (group_norms)
    for (size_t g = 0; g < ngroups; g++) group_norms[g] = finish(m, o.norm_type, &parts[g]);
  return BX_OK;
  }

local_failed:
  /* A rank that fails its local checks still joins the agreement step, so
   * the others fail with it instead of waiting in the collective. */
  if (comm && comm->allreduce_i64) {
    bx_agree_item agree[BX_MAX_AGREE];
    size_t nagree = agree_items(agree, &o, ngroups, extra, nextra);
    int64_t offender = -1, failure = bx_failure_key(comm->rank, st);
    bx_agree(comm, fn, agree, nagree, &offender, &failure); /* reports our own st */
  }
  return st;
}

bx_status bx_total_norm(const bx_group *groups, size_t ngroups, const bx_comm *comm,
                        const bx_norm_opts *opts, double *total_norm, double *group_norms) {
  return bx_norm_agreed("bx_total_norm", groups, ngroups, comm, opts, NULL, 0, BX_OK,
                        total_norm, group_norms);
}

/* ---- public accumulator entry points (calling thread only) ---------- */

static bx_status acc_add(bx_acc *acc, const DLTensor *t, int squares, const char *fn) {
  if (!acc) return bx_fail(BX_EINVAL, "%s: acc is NULL", fn);
  bx_span s;
  bx_status st = bx_tensor_span(t, fn, BX_NO_GROUP, 0, &s);
  if (st != BX_OK) return st;
  const bx_kernels *k = bx_kernels_active();
  size_t es = bx_dtype_size(s.dtype);
  for (size_t off = 0; off < s.n; off += BX_CHUNK) {
    size_t n = s.n - off < BX_CHUNK ? s.n - off : BX_CHUNK;
    const void *p = (const char *)s.data + off * es;
    if (squares) k->sumsq[s.dtype](p, n, acc);
    else k->sumabs[s.dtype](p, n, acc);
    bx_acc_normalize(acc);
  }
  return BX_OK;
}

bx_status bx_acc_add_squares(bx_acc *acc, const DLTensor *t) {
  return acc_add(acc, t, 1, "bx_acc_add_squares");
}

bx_status bx_acc_add_abs(bx_acc *acc, const DLTensor *t) {
  return acc_add(acc, t, 0, "bx_acc_add_abs");
}
