/*
 * norm.c — the generic norm driver behind bx_total_norm and
 * bx_clip_grad_norm, and the public accumulator entry points.
 *
 * A call: enter the library's environment (call.h); validate everything
 * (and, for device tensors, let the backend reserve all it needs) before
 * the first collective; cut the tensors into pieces; let the worker
 * threads run the kernels (kernels.h) into per-group partials; the
 * agreement step and the norm's one collective (collective.c); the finish
 * (norm_finish.h: shared with the CUDA kernels); for a clip the scaling.
 *
 * State scales with the work, not threads x groups: the pieces, in group
 * order, are cut into tasks of about PIECE..2 PIECE elements. A task runs
 * its pieces in order; a run of one group that lies wholly inside the task
 * goes straight into the group's partial (no other task touches it), the
 * first and last runs (whose group may continue in the neighbouring tasks)
 * into the task's two slots, merged into their groups after the run. So
 * the partials are ngroups + 2 ntasks, whatever the thread count, and
 * every sum is exact, so which worker ran which task cannot matter.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "abi.h"
#include "backend.h"
#include "call.h"
#include "collective.h"
#include "error.h"
#include "kernels.h"
#include "norm_finish.h"
#include "norm_state.h"
#include "pool.h"
#include "scale_run.h"
#include "tensor.h"
#include "workspace.h"

#define PIECE ((size_t)1 << 18)          /* elements per piece, and per task at least */
#define MIN_PER_THREAD ((size_t)1 << 16) /* below this, fewer threads */
#define DEPOSIT_BUDGET ((int64_t)1 << 28)
#define NO_GROUP_SLOT ((size_t)-1)

typedef struct task {
  size_t begin, end;      /* pieces [begin, end) */
  size_t slot_group[2];   /* the groups of the first and last runs, or NO_GROUP_SLOT */
} task;

typedef struct job {
  const bx_kernels *k;
  bx_mode m;
  double p;
  const bx_piece *pieces;
  const size_t *gbegin, *gend; /* each group's pieces */
  task *tasks;
  bx_partial *parts; /* [ngroups] */
  bx_partial *slots; /* [ntasks][2] */
} job;

void bx_partial_init(bx_partial *q) {
  bx_acc_init(&q->acc);
  q->maxabs = 0.0;
  q->minabs = INFINITY;
  q->nan = q->nonzero = q->pending = 0;
}

/* into += from; the two are one logical accumulator (naccs stays 1). */
static void partial_merge(bx_partial *into, const bx_partial *from) {
  bx_acc_merge(&into->acc, &from->acc);
  into->acc.naccs -= from->acc.naccs;
  into->acc.version -= from->acc.version;
  if (from->maxabs > into->maxabs) into->maxabs = from->maxabs;
  if (from->minabs < into->minabs) into->minabs = from->minabs;
  into->nan += from->nan;
  into->nonzero += from->nonzero;
}

/* The kernel of j's mode over the contiguous x[0..n), into q. */
static void run_span(const job *j, const void *x, bx_dtype dt, size_t n, bx_partial *q) {
  switch (j->m) {
    case BX_M_SQ: j->k->sumsq[dt](x, n, &q->acc); break;
    case BX_M_ABS: j->k->sumabs[dt](x, n, &q->acc); break;
    case BX_M_POW: bx_sum_pow(x, dt, n, j->p, &q->acc); break;
    case BX_M_MEGATRON: bx_sum_megatron_sq(x, dt, n, &q->acc); break;
    case BX_M_EXT:
      bx_extreme_abs(x, dt, n, &q->maxabs, &q->minabs, &q->nan, &q->nonzero);
      return;
  }
  q->pending += n < (1u << 25) ? (int64_t)(2 * n + 1024) : (int64_t)BX_MAX_DEPOSITS;
  if (q->pending >= DEPOSIT_BUDGET) {
    bx_acc_normalize(&q->acc);
    q->pending = 0;
  }
}

/* A strided piece run by run (long runs) or gathered (short ones) into the
 * same kernels: the sums are exact, so the words cannot depend on how the
 * elements were cut. Not inlined: the dense path keeps its small frame. */
static __attribute__((noinline)) void run_strided(const job *j, const bx_piece *it,
                                                  bx_partial *q) {
  bx_layout_cursor c;
  bx_layout_seek(&c, it->lay, it->first);
  if (it->lay->inner >= BX_DIRECT) {
    for (size_t done = 0, k; done < it->n; done += k) {
      const char *at = bx_layout_run(&c, it->n - done, &k);
      run_span(j, at, it->dt, k, q);
    }
    return;
  }
  uint64_t buf[BX_GATHER];
  for (size_t done = 0, k; done < it->n; done += k) {
    k = it->n - done < BX_GATHER ? it->n - done : BX_GATHER;
    bx_layout_copy(&c, k, buf, 0);
    run_span(j, buf, it->dt, k, q);
  }
}

/* A piece: a dense one in place (the fast path), a strided one through
 * its layout. */
static void run_piece(const job *j, const bx_piece *it, bx_partial *q) {
  if (!it->lay) run_span(j, it->data, it->dt, it->n, q);
  else run_strided(j, it, q);
}

static void run_task(void *ctx, size_t t, int worker) {
  (void)worker;
  const job *j = ctx;
  task *tk = &j->tasks[t];
  tk->slot_group[0] = tk->slot_group[1] = NO_GROUP_SLOT;
  for (size_t i = tk->begin; i < tk->end;) {
    size_t g = j->pieces[i].group, e = i;
    while (e < tk->end && j->pieces[e].group == g) e++;
    bx_partial *q;
    if (j->gbegin[g] >= tk->begin && j->gend[g] <= tk->end) {
      q = &j->parts[g]; /* the whole group is this task's: it initialises it */
      bx_partial_init(q);
    } else {
      int s = i == tk->begin ? 0 : 1; /* not inside: the first run or the last */
      q = &j->slots[2 * t + (size_t)s];
      bx_partial_init(q);
      tk->slot_group[s] = g;
    }
    for (; i < e; i++) run_piece(j, &j->pieces[i], q);
  }
}

/* ---- options ------------------------------------------------------------ */

bx_status bx_check_norm_opts(const char *fn, const bx_norm_opts *o, bx_mode *m) {
  double p = o->norm_type;
  if (p != p) return bx_fail(BX_EINVAL, "%s: norm_type is NaN", fn);
  if (o->num_threads < 0)
    return bx_fail(BX_EINVAL, "%s: num_threads %d is negative", fn, o->num_threads);
  if ((int)o->norm_dtype < (int)BX_NORM_F64 || (int)o->norm_dtype > (int)BX_NORM_F16)
    return bx_fail(BX_EINVAL, "%s: unknown norm_dtype %d", fn, (int)o->norm_dtype);
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

/* norm_dtype with BX_NORM_GRADS resolved from the dtypes of every rank's
 * tensors (mask bit d: a tensor of dtype d) as torch promotes them. */
static bx_norm_dtype resolved_dtype(bx_norm_dtype nd, unsigned mask) {
  if (nd != BX_NORM_GRADS) return nd;
  if (mask & (1u << BX_DT_F64)) return BX_NORM_F64;
  if (mask == (1u << BX_DT_F16)) return BX_NORM_F16;
  if (mask == (1u << BX_DT_BF16)) return BX_NORM_BF16;
  return BX_NORM_F32; /* fp32 in it, fp16 with bf16, or nothing */
}

/* The format of a resolved norm_dtype. */
static bx_fmt norm_format(bx_norm_dtype nd) {
  switch (nd) {
    case BX_NORM_F32: return bx_fmt_of_dtype(BX_DT_F32);
    case BX_NORM_BF16: return bx_fmt_of_dtype(BX_DT_BF16);
    case BX_NORM_F16: return bx_fmt_of_dtype(BX_DT_F16);
    default: return bx_fmt_f64();
  }
}

static int64_t double_bits(double d) {
  int64_t b;
  memcpy(&b, &d, 8);
  return b;
}

/* This rank's agreement items (agree.h). */
static void agree_items(int64_t *it, const bx_norm_opts *o, size_t ngroups, const bx_clip_step *clip) {
  memset(it, 0, BX_AGREE_ITEMS * sizeof *it);
  it[BX_AGREE_FORMAT] = BX_ACC_VERSION_TAG;
  it[BX_AGREE_CALL] = clip ? BX_CALL_CLIP : BX_CALL_NORM;
  it[BX_AGREE_NGROUPS] = (int64_t)ngroups;
  it[BX_AGREE_NORM_TYPE] = double_bits(o->norm_type);
  it[BX_AGREE_FLAVOR] = (int64_t)o->flavor;
  it[BX_AGREE_NONFINITE] = o->error_if_nonfinite != 0;
  it[BX_AGREE_NORM_DTYPE] = (int64_t)o->norm_dtype;
  if (clip) {
    it[BX_AGREE_MAX_NORM] = double_bits(clip->max_norm);
    it[BX_AGREE_EPS] = double_bits(clip->opts->eps);
    it[BX_AGREE_FORMULA] = (int64_t)clip->opts->formula;
    it[BX_AGREE_SCALE_MODE] = (int64_t)clip->opts->scale.mode;
  }
}

/* ---- NaN/Inf: the first offending tensor (error path only) --------------- */

static int span_nonfinite(const void *x, bx_dtype dt, size_t n, int nan_only, int *is_nan) {
  for (size_t i = 0; i < n; i++) {
    double v = bx_load_as_double(x, dt, i);
    if (v != v || (!nan_only && (v == INFINITY || v == -INFINITY))) {
      *is_nan = v != v;
      return 1;
    }
  }
  return 0;
}

static int layout_nonfinite(const bx_layout *l, int nan_only, int *is_nan) {
  if (l->ndims == 0) return span_nonfinite(l->base, l->dtype, l->n, nan_only, is_nan);
  bx_layout_cursor c;
  uint64_t buf[BX_GATHER];
  bx_layout_seek(&c, l, 0);
  for (size_t done = 0, k; done < l->n; done += k) {
    k = l->n - done < BX_GATHER ? l->n - done : BX_GATHER;
    bx_layout_copy(&c, k, buf, 0);
    if (span_nonfinite(buf, l->dtype, k, nan_only, is_nan)) return 1;
  }
  return 0;
}

/* The first tensor holding a NaN or Inf (nan_only: a NaN; for p < 0,
 * where an Inf element does not make the norm NaN). */
static int64_t first_nonfinite(const bx_group *groups, size_t ngroups, int rank, int nan_only) {
  for (size_t g = 0; g < ngroups; g++)
    for (size_t i = 0; i < groups[g].count; i++) {
      bx_layout l;
      int is_nan = 0;
      if (bx_tensor_layout(&groups[g].tensors[i], "", g, i, &l) == BX_OK &&
          layout_nonfinite(&l, nan_only, &is_nan))
        return bx_offender_key(rank, g, i, is_nan);
    }
  return -1;
}

static bx_status report_nonfinite(const char *fn, int64_t key, const bx_comm *comm, double total) {
  int rank, is_nan;
  size_t g, i;
  if (key < 0)
    return bx_fail_at(BX_ENONFINITE, comm ? comm->rank : -1, BX_NO_INDEX, BX_NO_INDEX,
                      "%s: the total norm is %s although no gradient holds NaN or Inf (it "
                      "overflows the norm's format); error_if_nonfinite is set, nothing was "
                      "modified", fn, total != total ? "NaN" : "infinite");
  bx_offender_decode(key, &rank, &g, &i, &is_nan);
  if (comm)
    return bx_fail_at(BX_ENONFINITE, rank, g, i,
                      "%s: rank %d, group %zu, tensor %zu holds %s; error_if_nonfinite is set, "
                      "every rank fails and nothing was modified",
                      fn, rank, g, i, is_nan ? "NaN" : "an infinite value");
  return bx_fail_at(BX_ENONFINITE, -1, g, i,
                    "%s: group %zu, tensor %zu holds %s; error_if_nonfinite is set, nothing "
                    "was modified",
                    fn, g, i, is_nan ? "NaN" : "an infinite value");
}

/* ---- the host reduction -------------------------------------------------- */

/* Validate every tensor, cut the pieces and run them: parts[0..ngroups)
 * filled. *pieces_out, *npieces_out: the pieces (for a clip's scaling).
 * The workspace holds, in order: parts, pieces, gbegin, gend, tasks,
 * slots, the layouts of the strided tensors (their pieces point there),
 * then `extra` bytes for the caller (*extra_out). */
static bx_status host_reduce(const char *fn, const bx_group *groups, size_t ngroups,
                             const bx_norm_opts *o, bx_mode m, size_t extra,
                             bx_partial **parts_out, bx_piece **pieces_out, size_t *npieces_out,
                             unsigned *dtmask, void **extra_out) {
  size_t npieces = 0, total = 0, nlays = 0;
  for (size_t g = 0; g < ngroups; g++) {
    if (groups[g].count > 0 && !groups[g].tensors)
      return bx_fail_at(BX_EINVAL, -1, g, BX_NO_INDEX,
                        "%s: group %zu: tensors is NULL with count %zu", fn, g, groups[g].count);
    for (size_t i = 0; i < groups[g].count; i++) {
      bx_layout s;
      bx_status st = bx_tensor_layout(&groups[g].tensors[i], fn, g, i, &s);
      if (st != BX_OK) return st;
      npieces += (s.n + PIECE - 1) / PIECE;
      total += s.n;
      nlays += s.ndims > 0;
      *dtmask |= 1u << s.dtype;
    }
  }
  /* tasks: consecutive pieces of at least PIECE elements (the last may be
   * less); at most npieces of them */
  size_t ng = ngroups ? ngroups : 1, ntasks_max = npieces ? npieces : 1;
  size_t b_parts = ng * sizeof(bx_partial), b_pieces = npieces * sizeof(bx_piece);
  size_t b_gidx = 2 * ng * sizeof(size_t), b_tasks = ntasks_max * sizeof(task);
  size_t b_slots = 2 * ntasks_max * sizeof(bx_partial), b_lays = nlays * sizeof(bx_layout);
  size_t off_extra = b_parts + b_pieces + b_gidx + b_tasks + b_slots + b_lays;
  off_extra = (off_extra + 63) & ~(size_t)63;
  char *ws = bx_workspace(off_extra + extra);
  if (!ws)
    return bx_fail(BX_ENOMEM, "%s: cannot allocate %zu bytes of workspace", fn, off_extra + extra);
  bx_partial *parts = (bx_partial *)ws;
  bx_piece *pieces = (bx_piece *)(ws + b_parts);
  size_t *gbegin = (size_t *)(ws + b_parts + b_pieces), *gend = gbegin + ng;
  task *tasks = (task *)(ws + b_parts + b_pieces + b_gidx);
  bx_partial *slots = (bx_partial *)(ws + b_parts + b_pieces + b_gidx + b_tasks);
  bx_layout *lays = (bx_layout *)(ws + b_parts + b_pieces + b_gidx + b_tasks + b_slots);
  size_t k = 0, nl = 0;
  for (size_t g = 0; g < ngroups; g++) {
    gbegin[g] = k;
    for (size_t i = 0; i < groups[g].count; i++) {
      bx_layout s;
      bx_tensor_layout(&groups[g].tensors[i], fn, g, i, &s);
      size_t es = bx_dtype_size(s.dtype);
      const bx_layout *lay = NULL;
      if (s.ndims > 0) { /* strided: its pieces read it through the layout */
        lays[nl] = s;
        lay = &lays[nl++];
      }
      for (size_t off = 0; off < s.n; off += PIECE, k++) {
        pieces[k].data = lay ? NULL : s.base + off * es;
        pieces[k].n = s.n - off < PIECE ? s.n - off : PIECE;
        pieces[k].dt = s.dtype;
        pieces[k].group = g;
        pieces[k].lay = lay;
        pieces[k].first = off;
      }
    }
    gend[g] = k;
    if (k == gbegin[g]) bx_partial_init(&parts[g]); /* no pieces: no task initialises it */
  }
  if (ngroups == 0) bx_partial_init(&parts[0]);
  size_t ntasks = 0;
  for (size_t i = 0; i < npieces;) {
    size_t begin = i, n = 0;
    while (i < npieces && n < PIECE) n += pieces[i++].n;
    tasks[ntasks].begin = begin;
    tasks[ntasks].end = i;
    ntasks++;
  }

  int nthreads = o->num_threads > 0 ? o->num_threads : bx_default_threads();
  if (nthreads > BX_MAX_THREADS) nthreads = BX_MAX_THREADS;
  size_t useful = total / MIN_PER_THREAD + 1;
  if ((size_t)nthreads > useful) nthreads = (int)useful;
  job j = {bx_kernels_active(), m, o->norm_type, pieces, gbegin, gend, tasks, parts, slots};
  bx_parallel_run(nthreads, ntasks, run_task, &j);
  /* the groups that span tasks: the first slot of each is copied, the
   * others merged (in task order; the sums are exact, any order would do) */
  size_t last = NO_GROUP_SLOT;
  for (size_t t = 0; t < ntasks; t++)
    for (int s = 0; s < 2; s++) {
      size_t g = tasks[t].slot_group[s];
      if (g == NO_GROUP_SLOT) continue;
      if (g != last) parts[g] = slots[2 * t + (size_t)s];
      else partial_merge(&parts[g], &slots[2 * t + (size_t)s]);
      last = g;
    }
  *parts_out = parts;
  *pieces_out = pieces;
  *npieces_out = npieces;
  *extra_out = ws + off_extra;
  return BX_OK;
}

/* One group's wire words from its partial (norm_finish.h's layout). */
static void partial_to_wire(bx_mode m, double p, const bx_partial *q, int64_t *w) {
  if (m != BX_M_EXT) {
    bx_wire_of_acc(q->acc.digit, q->acc.nan_count, q->acc.inf_count, q->acc.count, w);
  } else {
    bx_ext e = {q->maxabs, q->minabs, q->nan, q->nonzero};
    bx_ext_to_wire(p, &e, w);
  }
}

/* Bytes the finish needs after the partials: the wire (ngroups, at least
 * one, groups of ww words), the group norms, the digits of the total and a
 * magnitude view. */
static size_t finish_bytes(size_t ngroups, size_t ww) {
  size_t ng = ngroups ? ngroups : 1;
  return ng * ww * sizeof(int64_t) + ng * sizeof(double) + BX_ACC_DIGITS * sizeof(int64_t) +
         sizeof(bx_mag) + 64;
}

bx_status bx_norm_run(const char *fn, const bx_group *groups, size_t ngroups, const bx_comm *comm,
                      const bx_norm_opts *opts, bx_clip_step *clip, bx_status prior,
                      double *total_norm, double *group_norms, bx_norm_dtype *norm_dtype) {
  bx_norm_opts o = BX_NORM_OPTS_DEFAULT;
  if (opts) o = *opts;
  bx_mode m = BX_M_SQ;
  bx_status st = prior;
  bx_where where = BX_ON_HOST;
  const bx_device_backend *be = NULL;
  bx_device_call *dev = NULL;
  int rank = comm ? comm->rank : -1;
  unsigned dtmask = 0;
  bx_partial *parts = NULL;
  bx_piece *pieces = NULL;
  size_t npieces = 0;
  char *fin = NULL;
  int64_t offender = -1;

  /* ---- local checks and the local reduction: all before any collective */
  if (st == BX_OK) st = bx_check_norm_opts(fn, &o, &m);
  size_t ww = bx_wire_words(m), ng = ngroups ? ngroups : 1;
  if (st == BX_OK && !total_norm) st = bx_fail(BX_EINVAL, "%s: total_norm is NULL", fn);
  if (st == BX_OK && ngroups > 0 && !groups)
    st = bx_fail(BX_EINVAL, "%s: groups is NULL with ngroups %zu", fn, ngroups);
  if (st == BX_OK) st = bx_tensors_where(fn, groups, ngroups, NULL, 0, &where);
  if (st == BX_OK && clip) /* no shared memory: before the workspace below is laid out */
    st = bx_check_writable(fn, NULL, 0, groups, ngroups, where == BX_ON_CUDA);
  if (st == BX_OK && (where == BX_ON_CUDA || (comm && comm->on_device))) {
    be = bx_backend_cuda();
    if (!be) {
      st = bx_fail(BX_EDEVICE, "%s: %s, but this build of bitexact has no CUDA backend (built "
                   "without nvcc, or CUDA=0)", fn,
                   where == BX_ON_CUDA ? "CUDA tensors" : "a device communicator");
    } else {
      bx_device_prep prep = {groups, ngroups, NULL, 0, where == BX_ON_CUDA, (int)m, o.norm_type,
                             clip != NULL && where == BX_ON_CUDA,
                             comm && comm->on_device ? BX_AGREE_WORDS + ng * ww : 0, rank};
      st = be->prepare(fn, &prep, &dev);
    }
  }
  if (st == BX_OK && where == BX_ON_CUDA) {
    size_t bytes = ng * sizeof(bx_partial) + 64 + finish_bytes(ngroups, ww);
    char *ws = bx_workspace(bytes);
    if (!ws) {
      st = bx_fail(BX_ENOMEM, "%s: cannot allocate %zu bytes of workspace", fn, bytes);
    } else {
      parts = (bx_partial *)ws;
      fin = ws + ((ng * sizeof(bx_partial) + 63) & ~(size_t)63);
      bx_partial_init(&parts[0]);
      st = be->partials(dev, parts, &offender, &dtmask);
    }
  } else if (st == BX_OK) {
    void *extra = NULL;
    st = host_reduce(fn, groups, ngroups, &o, m, finish_bytes(ngroups, ww), &parts, &pieces,
                     &npieces, &dtmask, &extra);
    fin = extra;
  }
  int64_t bad = 0, nans = 0;
  if (st == BX_OK)
    for (size_t g = 0; g < ngroups; g++) {
      bad += m == BX_M_EXT ? parts[g].nan + (parts[g].maxabs == INFINITY)
                           : parts[g].acc.nan_count + parts[g].acc.inf_count;
      nans += m == BX_M_EXT ? parts[g].nan : parts[g].acc.nan_count;
    }
  /* p < 0: the +Inf terms come from zeros and a NaN makes the norm NaN:
   * with a NaN here, name the first NaN, not an earlier Inf */
  int nan_only = m == BX_M_POW && o.norm_type < 0 && nans > 0;
  if (st == BX_OK && o.error_if_nonfinite && bad > 0 && where == BX_ON_HOST)
    offender = first_nonfinite(groups, ngroups, rank < 0 ? 0 : rank, nan_only);
  if (st != BX_OK && rank >= 0) bx_error_set_rank(rank);
  /* A device communicator (NCCL) stages the agreement's words in device memory that prepare
   * reserves. A rank that failed before its prepare (or in it) reserves that staging alone
   * (host tensors' staging-only prepare), so it still takes part in the agreement's
   * collective instead of leaving the others waiting there; its own error stays. Only a
   * rank that cannot get even those few words (no usable device) cannot take part. */
  if (st != BX_OK && !dev && comm && comm->on_device && comm->allreduce_i64) {
    const bx_device_backend *sb = be ? be : bx_backend_cuda();
    if (sb) {
      bx_error_saved mine;
      bx_error_save(&mine);
      bx_device_prep sp = {NULL, ngroups, NULL, 0, 0, (int)m, o.norm_type, 0,
                           BX_AGREE_WORDS + ng * ww, rank};
      if (sb->prepare(fn, &sp, &dev) == BX_OK) be = sb;
      else dev = NULL;
      bx_error_restore(&mine);
    }
  }

  /* ---- the agreement step (every rank, failed or not, so none hangs) */
  if (comm && comm->allreduce_i64) {
    int64_t items[BX_AGREE_ITEMS];
    agree_items(items, &o, ngroups, clip);
    st = bx_agree(comm, dev, fn, items, st, &offender, &dtmask);
  }
  if (st != BX_OK) goto done;

  /* ---- the wire, the norm's one collective, the finish */
  {
    int64_t *wire = (int64_t *)fin;
    double *gnorms = (double *)(wire + ng * ww);
    int64_t *total_digits = (int64_t *)(gnorms + ng);
    bx_mag *scratch = (bx_mag *)(((uintptr_t)(total_digits + BX_ACC_DIGITS) + 63) & ~(uintptr_t)63);
    const int64_t *words = wire;
    size_t stride = ww;
    if (comm || m == BX_M_EXT) {
      bx_partial empty;
      bx_partial_init(&empty);
      for (size_t g = 0; g < ng; g++) /* an empty group list still sends one group */
        partial_to_wire(m, o.norm_type, ngroups ? &parts[g] : &empty, wire + g * ww);
    } else { /* alone: the partials' accumulators are the wire's layout already */
      _Static_assert(sizeof(bx_partial) % sizeof(int64_t) == 0, "partials as words");
      words = (const int64_t *)parts;
      stride = sizeof(bx_partial) / sizeof(int64_t);
    }
    if (comm) {
      st = bx_comm_allreduce(comm, dev, fn, "norm", wire, ng * ww,
                             bx_wire_by_max(m, o.norm_type) ? BX_OP_MAX : BX_OP_SUM);
      if (st != BX_OK) goto done;
      if (m != BX_M_EXT)
        for (size_t g = 0; g < ng; g++)
          if (!bx_wire_version_ok(wire + g * ww)) {
            st = bx_acc_check((const bx_acc *)(wire + g * ww)); /* the message */
            if (st == BX_OK) st = bx_fail(BX_EMISMATCH, "%s: accumulator version", fn);
            bx_error_set_rank(rank);
            goto done;
          }
    }
    double total;
    bx_norm_dtype nd = resolved_dtype(o.norm_dtype, dtmask);
    bx_finish_words(m, o.norm_type, words, ngroups, stride, norm_format(nd), scratch,
                    total_digits, &total, gnorms);
    if (o.error_if_nonfinite && (total != total || total == INFINITY)) {
      st = report_nonfinite(fn, offender, comm, total);
      goto done;
    }
    if (clip) {
      double c = bx_clip_coef_of(total, clip->max_norm, clip->opts->eps, clip->opts->formula);
      if (c != 1.0) { /* skipping the writes when nothing changes */
        st = where == BX_ON_CUDA ? be->scale(dev, c, &clip->opts->scale)
                                 : bx_scale_pieces(pieces, npieces, c, &clip->opts->scale);
        if (st != BX_OK) goto done;
      }
      clip->coef = c;
    }
    *total_norm = total;
    if (group_norms) memcpy(group_norms, gnorms, ngroups * sizeof *group_norms);
    if (norm_dtype) *norm_dtype = nd;
  }

done:
  if (dev) be->release(dev);
  return st;
}

/* bx_total_norm and bx_total_norm_info (with_info: info is required). */
static bx_status norm_call(const char *fn, const bx_group *groups, size_t ngroups,
                           const bx_comm *comm, const bx_norm_opts *opts, double *total_norm,
                           double *group_norms, int with_info, bx_norm_info *info) {
  /* struct sizes before anything else; a comm of another layout is never
   * called (abi.h) */
  bx_status st = bx_check_comm_size(fn, comm);
  if (st != BX_OK) return st;
  bx_status opts_size = bx_check_norm_opts_size(fn, opts), sizes = opts_size;
  if (sizes == BX_OK && with_info) sizes = bx_check_norm_info_size(fn, info);
  if (sizes != BX_OK && !comm) return sizes;
  bx_call c;
  st = bx_call_enter(&c, fn);
  if (st != BX_OK) return st;
  /* with a communicator, structs of another layout are a local failure:
   * the rank still joins the agreement step so that no rank waits */
  bx_norm_dtype nd = BX_NORM_F64;
  st = bx_norm_run(fn, groups, ngroups, comm, opts_size == BX_OK ? opts : NULL, NULL, sizes,
                   total_norm, group_norms, &nd);
  if (st == BX_OK && with_info) info->norm_dtype = nd;
  bx_call_leave(&c);
  return st;
}

bx_status bx_total_norm(const bx_group *groups, size_t ngroups, const bx_comm *comm,
                        const bx_norm_opts *opts, double *total_norm, double *group_norms) {
  return norm_call("bx_total_norm", groups, ngroups, comm, opts, total_norm, group_norms, 0,
                   NULL);
}

bx_status bx_total_norm_info(const bx_group *groups, size_t ngroups, const bx_comm *comm,
                             const bx_norm_opts *opts, double *total_norm, double *group_norms,
                             bx_norm_info *info) {
  return norm_call("bx_total_norm_info", groups, ngroups, comm, opts, total_norm, group_norms,
                   1, info);
}

/* ---- public accumulator entry points (calling thread only) ---------- */

static bx_status acc_add(bx_acc *acc, const DLTensor *t, int squares, const char *fn) {
  bx_call c;
  bx_status st = bx_call_enter(&c, fn);
  if (st != BX_OK) return st;
  bx_span s;
  if (!acc) st = bx_fail(BX_EINVAL, "%s: acc is NULL", fn);
  else st = bx_tensor_span(t, fn, BX_NO_GROUP, 0, &s);
  if (st == BX_OK) {
    const bx_kernels *k = bx_kernels_active();
    size_t es = bx_dtype_size(s.dtype);
    for (size_t off = 0; off < s.n; off += BX_CHUNK) {
      size_t n = s.n - off < BX_CHUNK ? s.n - off : BX_CHUNK;
      const void *p = (const char *)s.data + off * es;
      if (squares) k->sumsq[s.dtype](p, n, acc);
      else k->sumabs[s.dtype](p, n, acc);
      bx_acc_normalize(acc);
    }
  }
  bx_call_leave(&c);
  return st;
}

bx_status bx_acc_add_squares(bx_acc *acc, const DLTensor *t) {
  return acc_add(acc, t, 1, "bx_acc_add_squares");
}

bx_status bx_acc_add_abs(bx_acc *acc, const DLTensor *t) {
  return acc_add(acc, t, 0, "bx_acc_add_abs");
}
