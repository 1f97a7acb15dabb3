/*
 * test_ranks.c — several ranks in one process: each rank is a thread with
 * its own bx_comm whose all-reduce sums (or maxes) the int64 buffers of all
 * rank threads, as MPI_Allreduce would. No MPI needed, so `make test` checks
 * the distributed contract (DESIGN §5): every rank gets the same bits as
 * one process holding all the data, for any rank count and ownership
 * split; errors (non-finite with error_if_nonfinite, disagreeing ranks, a
 * failing collective) come back on every rank, never as a hang — the
 * simulated collective times out after a few seconds and fails the test.
 */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "checks.h"
#include "harness.h"
#include "sim_comm.h"
#include "tests.h"
#include "util.h"

#define MAX_RANKS 8
#define NGROUPS 3
#define SENTINEL -999.0

/* ---- the simulated communicator: sim_comm.h ------------------------- */
typedef bxt_world world;
typedef bxt_rank_ctx rank_ctx;

/* ---- one call per rank, run concurrently ----------------------------- */
typedef struct rank_job {
  rank_ctx ctx;
  bx_comm comm;
  bx_group groups[NGROUPS + 1];
  size_t ngroups;
  DLTensor dl[NGROUPS][64];
  int64_t shapes[NGROUPS][64];
  bx_norm_opts opts;
  int clip;          /* bx_clip_grad_norm instead of bx_total_norm */
  double max_norm;
  bx_status st;
  double total, gn[NGROUPS + 1], coef;
  char err[512];
  bx_error_location loc;
} rank_job;

static void *rank_main(void *arg) {
  rank_job *j = arg;
  j->total = j->coef = SENTINEL;
  for (int g = 0; g <= NGROUPS; g++) j->gn[g] = SENTINEL;
  if (j->clip) {
    bx_clip_opts co = BX_CLIP_OPTS_DEFAULT;
    co.norm = j->opts;
    j->st = bx_clip_grad_norm(j->groups, j->ngroups, &j->comm, j->max_norm, &co, &j->total,
                              &j->coef);
  } else {
    j->st = bx_total_norm(j->groups, j->ngroups, &j->comm, &j->opts, &j->total, j->gn);
  }
  snprintf(j->err, sizeof j->err, "%s", j->st == BX_OK ? "" : bx_last_error());
  j->loc = *bx_last_error_location();
  return NULL;
}

static void run_ranks(world *w, rank_job *jobs) {
  pthread_t th[MAX_RANKS];
  w->arrived = 0;
  w->timed_out = 0;
  for (int r = 0; r < w->n; r++) {
    jobs[r].ctx.w = w;
    jobs[r].ctx.rank = r;
    jobs[r].comm = (bx_comm)BX_COMM_DEFAULT;
    jobs[r].comm.allreduce_i64 = bxt_sim_allreduce;
    jobs[r].comm.ctx = &jobs[r].ctx;
    jobs[r].comm.rank = r;
    pthread_create(&th[r], NULL, rank_main, &jobs[r]);
  }
  for (int r = 0; r < w->n; r++) pthread_join(th[r], NULL);
  CHECK(!w->timed_out, "a rank waited 5 s in the collective for another: a hang");
}

/* The data: tensors in NGROUPS groups; each tensor cut into pieces (views)
 * owned by random ranks. */
typedef struct model {
  bxt_tensor x[12];
  int group_of[12];
  size_t n;
} model;

static void model_make(bxt_rng *r, model *m) {
  m->n = 12;
  bxt_tensors_random(r, m->x, m->n, 30000);
  for (size_t k = 0; k < m->n; k++) m->group_of[k] = (int)(k % NGROUPS);
}

static void distribute(bxt_rng *r, const model *m, rank_job *jobs, int nranks) {
  for (int q = 0; q < nranks; q++) {
    memset(&jobs[q], 0, sizeof jobs[q]);
    jobs[q].ngroups = NGROUPS;
    jobs[q].opts = (bx_norm_opts)BX_NORM_OPTS_DEFAULT;
    for (int g = 0; g < NGROUPS; g++) {
      jobs[q].groups[g].tensors = jobs[q].dl[g];
      jobs[q].groups[g].count = 0;
    }
  }
  for (size_t k = 0; k < m->n; k++) {
    const bxt_tensor *x = &m->x[k];
    int g = m->group_of[k];
    size_t at = 0;
    do {
      size_t len = x->n - at;
      if (len > 1 && bxt_below(r, 2)) len = 1 + bxt_below(r, len);
      int q = (int)bxt_below(r, (uint64_t)nranks);
      rank_job *j = &jobs[q];
      size_t c = j->groups[g].count++;
      j->dl[g][c] = x->t;
      j->shapes[g][c] = (int64_t)len;
      j->dl[g][c].shape = &j->shapes[g][c];
      j->dl[g][c].byte_offset = at * bxt_dt_size(x->dt);
      at += len;
    } while (at < x->n);
  }
}

/* Every rank gets the single-process answer, for several rank counts,
 * ownership splits, p and thread counts. */
void test_ranks_invariance(void) {
  bxt_rng r;
  bxt_rng_init(&r);
  static const int nranks[] = {1, 2, 3, 5, 8};
  static const double ps[] = {2.0, 1.0, INFINITY, 0.0, 3.0};
  for (int rep = 0; rep < 10 && bxt_failures() < 10; rep++) {
    model m;
    model_make(&r, &m);
    /* the single-process answer, total and per group */
    bxt_layout l;
    bxt_layout_single(&l, m.x, m.n);
    DLTensor dl[12];
    bx_group g1[NGROUPS];
    size_t cnt = 0;
    for (int g = 0; g < NGROUPS; g++) {
      g1[g].tensors = &dl[cnt];
      g1[g].count = 0;
      for (size_t k = 0; k < m.n; k++)
        if (m.group_of[k] == g) {
          dl[cnt++] = m.x[k].t;
          g1[g].count++;
        }
    }
    for (size_t pi = 0; pi < sizeof ps / sizeof ps[0]; pi++) {
      int megatron = rep % 5 == 4 && pi == 0;
      bx_norm_opts o = BX_NORM_OPTS_DEFAULT;
      o.norm_type = ps[pi];
      if (megatron) o.flavor = BX_MEGATRON_FP32;
      double want = SENTINEL, wgn[NGROUPS];
      CHECK_STATUS(bx_total_norm(g1, NGROUPS, NULL, &o, &want, wgn), BX_OK, "one process");
      if (!megatron && (ps[pi] == 2 || ps[pi] == 1 || ps[pi] == 0 || isinf(ps[pi])))
        CHECK_BITS_D(want, bxt_ref_norm(l.src, l.n, ps[pi]), "one process vs reference");
      int n = nranks[rep % 5];
      world w;
      bxt_world_init(&w, n);
      rank_job jobs[MAX_RANKS];
      distribute(&r, &m, jobs, n);
      for (int q = 0; q < n; q++) {
        jobs[q].opts = o;
        jobs[q].opts.num_threads = 1 + (int)bxt_below(&r, 2);
      }
      run_ranks(&w, jobs);
      for (int q = 0; q < n; q++) {
        CHECK_STATUS(jobs[q].st, BX_OK, "rep %d, %d ranks, rank %d, p=%g: %s", rep, n, q, ps[pi],
                     jobs[q].err);
        CHECK_BITS_D(jobs[q].total, want, "rep %d, %d ranks, rank %d, p=%g%s: total", rep, n, q,
                     ps[pi], megatron ? " (Megatron)" : "");
        for (int g = 0; g < NGROUPS; g++)
          CHECK_BITS_D(jobs[q].gn[g], wgn[g], "rep %d, %d ranks, rank %d, p=%g: group %d", rep,
                       n, q, ps[pi], g);
      }
      bxt_world_free(&w);
    }
    bxt_tensors_free(m.x, m.n);
  }
}

/* Clipping across ranks: every rank gets the same total and coefficient and
 * scales its own shards with it. */
void test_ranks_clip(void) {
  bxt_rng r;
  bxt_rng_init(&r);
  for (int rep = 0; rep < 6 && bxt_failures() < 10; rep++) {
    model m;
    model_make(&r, &m);
    bxt_tensor before[12];
    for (size_t k = 0; k < m.n; k++) bxt_tensor_clone(&before[k], &m.x[k]);
    bxt_layout l;
    bxt_layout_single(&l, m.x, m.n);
    double total = bxt_ref_norm(l.src, l.n, 2.0);
    double max_norm = isfinite(total) && total > 0 ? total / 3 : 1.0;
    double want_coef = max_norm / (total + 1e-6);
    if (want_coef > 1) want_coef = 1;
    int n = 2 + rep % 4;
    world w;
    bxt_world_init(&w, n);
    rank_job jobs[MAX_RANKS];
    distribute(&r, &m, jobs, n);
    for (int q = 0; q < n; q++) {
      jobs[q].clip = 1;
      jobs[q].max_norm = max_norm;
    }
    run_ranks(&w, jobs);
    for (int q = 0; q < n; q++) {
      CHECK_STATUS(jobs[q].st, BX_OK, "rep %d rank %d: %s", rep, q, jobs[q].err);
      CHECK_BITS_D(jobs[q].total, total, "rep %d rank %d: total", rep, q);
      CHECK_BITS_D(jobs[q].coef, want_coef, "rep %d rank %d: coefficient", rep, q);
    }
    for (size_t k = 0; k < m.n; k++) {
      char what[96];
      snprintf(what, sizeof what, "rep %d tensor %zu (scaled piecewise by its owners)", rep, k);
      bxt_check_scaled(what, &before[k], &m.x[k], want_coef, BX_SCALE_TORCH, 0);
      bxt_tensor_free(&before[k]);
    }
    bxt_world_free(&w);
    bxt_tensors_free(m.x, m.n);
  }
}

/* Errors come back on every rank: a NaN owned by rank 2 with
 * error_if_nonfinite (named, with its rank, everywhere); ranks disagreeing
 * on the group count or the options; a failing collective; one rank whose
 * options have another struct_size (a program built against another
 * bitexact). Nothing is written on any rank. */
void test_ranks_errors(void) {
  bxt_rng r;
  bxt_rng_init(&r);
  const int n = 4;
  for (int c = 0; c < 10; c++) {
    model m;
    model_make(&r, &m);
    world w;
    bxt_world_init(&w, n);
    rank_job jobs[MAX_RANKS];
    distribute(&r, &m, jobs, n);
    bx_status want = BX_OK;
    const char *what = "";
    bxt_tensor nan1;
    double one_nan = NAN;
    bxt_tensor_from(&nan1, REF_F32, &one_nan, 1);
    switch (c) {
    case 0: /* rank 2 owns a NaN, in group 1 */
      jobs[2].dl[1][jobs[2].groups[1].count++] = nan1.t;
      for (int q = 0; q < n; q++) jobs[q].opts.error_if_nonfinite = 1;
      want = BX_ENONFINITE;
      what = "NaN on rank 2 with error_if_nonfinite";
      break;
    case 1: /* the same without the flag: NaN everywhere, BX_OK */
      jobs[2].dl[1][jobs[2].groups[1].count++] = nan1.t;
      want = BX_OK;
      what = "NaN on rank 2";
      break;
    case 2:
      jobs[1].ngroups = NGROUPS - 1;
      want = BX_EMISMATCH;
      what = "rank 1 passes one group fewer";
      break;
    case 3:
      jobs[3].opts.norm_type = 1.0;
      want = BX_EMISMATCH;
      what = "rank 3 asks for p = 1";
      break;
    case 4:
      jobs[0].opts.flavor = BX_MEGATRON_FP32;
      want = BX_EMISMATCH;
      what = "rank 0 asks for the Megatron flavour";
      break;
    case 8: /* rank 2 was built against a newer bitexact: its options are
             * refused, and the others fail with it instead of waiting */
      jobs[2].opts.struct_size += 8;
      want = BX_EINVAL;
      what = "rank 2's norm options have another struct_size";
      break;
    case 9: /* the same in a clip (the options nested in bx_clip_opts) */
      for (int q = 0; q < n; q++) {
        jobs[q].clip = 1;
        jobs[q].max_norm = 1e-3;
      }
      jobs[2].opts.struct_size = 0;
      want = BX_EINVAL;
      what = "rank 2's clip has norm options of struct_size 0";
      break;
    case 6:
    case 7: /* rank 1 fails its own checks (an int32 tensor in group 2); in
             * case 7 its collective fails too: its own message stays */
      jobs[1].dl[2][jobs[1].groups[2].count] = nan1.t;
      jobs[1].dl[2][jobs[1].groups[2].count++].dtype.code = kDLInt;
      if (c == 7) w.fail_rank = 1;
      want = BX_EDTYPE;
      what = c == 6 ? "rank 1 passes an int32 tensor" : "rank 1 passes an int32 tensor, its collective fails";
      break;
    default:
      w.fail_rank = n; /* every rank's all-reduce fails */
      want = BX_ECOMM;
      what = "the collective fails";
    }
    run_ranks(&w, jobs);
    for (int q = 0; q < n; q++) {
      CHECK_STATUS(jobs[q].st, want, "%s: rank %d (\"%s\")", what, q, jobs[q].err);
      if (want != BX_OK)
        CHECK(jobs[q].total == SENTINEL && jobs[q].gn[0] == SENTINEL,
              "%s: rank %d wrote an output", what, q);
      else
        CHECK(isnan(jobs[q].total) && isnan(jobs[q].gn[1]),
              "%s: rank %d total %g, group 1 %g (want NaN)", what, q, jobs[q].total,
              jobs[q].gn[1]);
    }
    if (c == 0)
      for (int q = 0; q < n; q++) {
        CHECK(bxt_mentions(jobs[q].err, "rank", 2) && bxt_mentions(jobs[q].err, "group", 1),
              "%s: rank %d's message names rank 2, group 1: \"%s\"", what, q, jobs[q].err);
        CHECK(jobs[q].loc.rank == 2 && jobs[q].loc.group == 1 &&
                  jobs[q].loc.tensor == (long long)jobs[2].groups[1].count - 1,
              "%s: rank %d's location: rank %d group %lld tensor %lld", what, q, jobs[q].loc.rank,
              jobs[q].loc.group, jobs[q].loc.tensor);
      }
    if (c == 8 || c == 9) {
      CHECK(strstr(jobs[2].err, c == 8 ? "opts->struct_size is" : "opts->norm.struct_size is 0"),
            "%s: rank 2 keeps its own message: \"%s\"", what, jobs[2].err);
      for (int q = 0; q < n; q++) {
        CHECK(jobs[q].loc.rank == 2 && jobs[q].loc.group == -1 && jobs[q].loc.tensor == -1,
              "%s: rank %d's location: rank %d group %lld tensor %lld (want 2, -1, -1)", what, q,
              jobs[q].loc.rank, jobs[q].loc.group, jobs[q].loc.tensor);
        if (q != 2)
          CHECK(bxt_mentions(jobs[q].err, "rank", 2), "%s: rank %d names rank 2: \"%s\"", what,
                q, jobs[q].err);
      }
    }
    if (c == 6 || c == 7) {
      long long t = (long long)jobs[1].groups[2].count - 1;
      CHECK(strstr(jobs[1].err, "is not supported") && bxt_mentions(jobs[1].err, "group", 2) &&
                bxt_mentions(jobs[1].err, "tensor", t),
            "%s: the failing rank keeps its own message: \"%s\"", what, jobs[1].err);
      for (int q = 0; q < n; q++) {
        CHECK(jobs[q].loc.rank == 1 && jobs[q].loc.group == 2 && jobs[q].loc.tensor == t,
              "%s: rank %d's location: rank %d group %lld tensor %lld (want 1, 2, %lld)", what, q,
              jobs[q].loc.rank, jobs[q].loc.group, jobs[q].loc.tensor, t);
        if (q != 1)
          CHECK(bxt_mentions(jobs[q].err, "rank", 1) && bxt_mentions(jobs[q].err, "group", 2),
                "%s: rank %d names rank 1 and where: \"%s\"", what, q, jobs[q].err);
      }
    }
    bxt_tensor_free(&nan1);
    bxt_world_free(&w);
    bxt_tensors_free(m.x, m.n);
  }
}

/* BX_NORM_GRADS across ranks: rank 0 holds only bf16 gradients, rank 1
 * only fp16: torch's promotion over all ranks is fp32, on every rank. */
void test_ranks_norm_dtype(void) {
  bxt_rng r;
  bxt_rng_init(&r);
  world w;
  bxt_world_init(&w, 2);
  rank_job jobs[MAX_RANKS];
  bxt_tensor x[2];
  memset(jobs, 0, sizeof jobs);
  for (int q = 0; q < 2; q++) {
    bxt_tensor_alloc(&x[q], q == 0 ? REF_BF16 : REF_F16, 5000);
    bxt_fill_gradient(&r, &x[q], 2.0);
    jobs[q].ngroups = 1;
    jobs[q].opts = (bx_norm_opts)BX_NORM_OPTS_DEFAULT;
    jobs[q].opts.norm_dtype = BX_NORM_GRADS;
    jobs[q].dl[0][0] = x[q].t;
    jobs[q].groups[0] = (bx_group){jobs[q].dl[0], 1};
  }
  run_ranks(&w, jobs);
  DLTensor both[2] = {x[0].t, x[1].t};
  bx_group g = {both, 2};
  bx_norm_opts o = BX_NORM_OPTS_DEFAULT;
  o.norm_dtype = BX_NORM_F32;
  double want = -1;
  CHECK_STATUS(bx_total_norm(&g, 1, NULL, &o, &want, NULL), BX_OK, "one process");
  for (int q = 0; q < 2; q++) {
    CHECK_STATUS(jobs[q].st, BX_OK, "rank %d: %s", q, jobs[q].err);
    CHECK_BITS_D(jobs[q].total, want, "rank %d: the norm in fp32 (bf16 on one rank, fp16 on the other)", q);
  }
  for (int q = 0; q < 2; q++) bxt_tensor_free(&x[q]);
  bxt_world_free(&w);
}
