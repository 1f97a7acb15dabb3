/*
 * test_device_agree.c — the blocking calls over a device communicator
 * (bitexact_nccl.h's bx_comm_nccl: on_device, words staged through device
 * memory) when one rank fails its local checks (issue 29 item 6): every
 * rank must still reach the agreement's collective, so all fail with a
 * status and none waits forever. Runs on the CPU: the ranks are threads
 * (sim_comm.h, whose all-reduce reports a rank that never arrives as a
 * hang after 5 s), the device communicator's async all-reduce is the
 * simulated one, and a simulated backend (bx_backend_cuda_override) stages
 * the words in host memory the way src/cuda/backend.cu stages them in
 * device memory: reserved by prepare, before the first collective.
 */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "bitexact_train.h"
#include "dl_view.h"
#include "checks.h"
#include "harness.h"
#include "sim_comm.h"
#include "tests.h"
#include "util.h"

/* ---- the simulated backend: staging only (host tensors, a device communicator) ---- */
struct bx_device_call {
  int64_t *stage;
  size_t words;
};
static _Thread_local struct bx_device_call sim_call;
static _Thread_local int sim_prepares; /* prepares on this thread (rank) */

static bx_status sim_available(void) { return BX_OK; }

static bx_status sim_prepare(const char *fn, const bx_device_prep *prep, bx_device_call **out) {
  (void)fn;
  if (prep->reduce || prep->scale) return BX_EDEVICE; /* no device tensors here */
  sim_prepares++;
  free(sim_call.stage);
  sim_call.words = prep->stage_words;
  sim_call.stage = calloc(prep->stage_words ? prep->stage_words : 1, sizeof(int64_t));
  if (!sim_call.stage) return BX_ENOMEM;
  *out = &sim_call;
  return BX_OK;
}

static bx_status sim_partials(bx_device_call *c, bx_partial *p, int64_t *off, unsigned *dt) {
  (void)c, (void)p, (void)off, (void)dt;
  return BX_EDEVICE;
}

/* as bx_cu_allreduce_staged: the host words into the stage, the communicator's
 * async all-reduce on it, back */
static int sim_staged(bx_device_call *c, const bx_comm *comm, int64_t *buf, size_t n, bx_op op) {
  if (!c || !c->stage || n > c->words || !comm->allreduce_i64_async) return -1;
  memcpy(c->stage, buf, n * sizeof *buf);
  int rc = comm->allreduce_i64_async(c->stage, n, op, comm->ctx, comm->stream);
  if (rc == 0) memcpy(buf, c->stage, n * sizeof *buf);
  return rc;
}

static bx_status sim_scale(bx_device_call *c, double coef, const bx_scale_opts *o) {
  (void)c, (void)coef, (void)o;
  return BX_EDEVICE;
}

static void sim_release(bx_device_call *c) {
  free(c->stage);
  c->stage = NULL;
  c->words = 0;
}

static const bx_device_backend sim_backend = {"sim", sim_available, sim_prepare, sim_partials,
                                              sim_staged, sim_scale, sim_release};

static int sim_async(int64_t *buf, size_t n, bx_op op, void *ctx, void *stream) {
  (void)stream;
  return bxt_sim_allreduce(buf, n, op, ctx);
}

/* ---- one call per rank ------------------------------------------------------------ */
enum { FINE, NULL_OUTPUT, BAD_P, MIXED_DEVICES };

typedef struct job {
  bxt_rank_ctx ctx;
  bx_comm comm;
  int fault;
  bx_status st;
  double total;
  int prepares;
  char err[512];
} job;

static bxt_tensor g_x[2];

static void *rank_main(void *arg) {
  job *j = arg;
  DLTensor t[2] = {g_x[j->ctx.rank].t, g_x[j->ctx.rank].t};
  int64_t shape = 4;
  if (j->fault == MIXED_DEVICES) { /* a CUDA tensor beside a host one: refused first */
    t[1].data = (void *)(uintptr_t)0x10000;
    t[1].device.device_type = kDLCUDA;
    t[1].shape = &shape;
  }
  bx_group g = {t, j->fault == MIXED_DEVICES ? 2 : 1};
  bx_norm_opts o = BX_NORM_OPTS_DEFAULT;
  if (j->fault == BAD_P) o.norm_type = NAN;
  j->total = -1;
  sim_prepares = 0;
  j->st = bx_total_norm(&g, 1, &j->comm, &o, j->fault == NULL_OUTPUT ? NULL : &j->total, NULL);
  j->prepares = sim_prepares;
  snprintf(j->err, sizeof j->err, "%s", j->st == BX_OK ? "" : bx_last_error());
  return NULL;
}

/* Two ranks; rank 1 has the fault. */
static void two_ranks(int fault, bx_status want1, const char *what) {
  bxt_world w;
  bxt_world_init(&w, 2);
  job jobs[2];
  pthread_t th[2];
  memset(jobs, 0, sizeof jobs);
  for (int r = 0; r < 2; r++) {
    jobs[r].ctx.w = &w;
    jobs[r].ctx.rank = r;
    jobs[r].comm = (bx_comm)BX_COMM_DEFAULT;
    jobs[r].comm.allreduce_i64 = bxt_sim_allreduce; /* set by bx_comm_nccl too */
    jobs[r].comm.allreduce_i64_async = sim_async;
    jobs[r].comm.on_device = 1;
    jobs[r].comm.ctx = &jobs[r].ctx;
    jobs[r].comm.rank = r;
    jobs[r].fault = r == 1 ? fault : FINE;
    pthread_create(&th[r], NULL, rank_main, &jobs[r]);
  }
  for (int r = 0; r < 2; r++) pthread_join(th[r], NULL);
  CHECK(!w.timed_out, "%s: a rank waited 5 s in the agreement for the failed one: a hang", what);
  if (fault == FINE) {
    for (int r = 0; r < 2; r++)
      CHECK(jobs[r].st == BX_OK && jobs[r].total == 5.0, "%s: rank %d: %s (%s), norm %g", what, r,
            bx_status_str(jobs[r].st), jobs[r].err, jobs[r].total);
  } else {
    CHECK(jobs[1].st == want1, "%s: rank 1: %s (%s)", what, bx_status_str(jobs[1].st), jobs[1].err);
    CHECK(jobs[0].st == want1 && strstr(jobs[0].err, "rank 1 failed its local checks") != NULL,
          "%s: rank 0 learns rank 1's failure: %s (%s)", what, bx_status_str(jobs[0].st), jobs[0].err);
    CHECK(jobs[0].total == -1, "%s: rank 0's output untouched", what);
    CHECK(jobs[1].prepares == 1, "%s: rank 1 reserved the agreement's staging (%d prepares)", what,
          jobs[1].prepares);
  }
  bxt_world_free(&w);
}

void test_device_comm_local_failure_agreed(void) {
  /* rank 0 holds 3,0,0,0 and rank 1 4,0,0,0: the norm is 5 */
  bxt_tensor_alloc(&g_x[0], REF_F32, 4);
  bxt_tensor_alloc(&g_x[1], REF_F32, 4);
  for (size_t i = 0; i < 4; i++) bxt_set(&g_x[0], i, i ? 0.0 : 3.0), bxt_set(&g_x[1], i, i ? 0.0 : 4.0);
  bx_backend_cuda_override(&sim_backend);
  two_ranks(FINE, BX_OK, "no failure (the staging works)");
  two_ranks(NULL_OUTPUT, BX_EINVAL, "rank 1 passes total_norm NULL");
  two_ranks(BAD_P, BX_EINVAL, "rank 1 asks for p = NaN");
  two_ranks(MIXED_DEVICES, BX_EDEVICE, "rank 1 mixes host and CUDA tensors");
  bx_backend_cuda_override(NULL);
  bxt_tensor_free(&g_x[0]);
  bxt_tensor_free(&g_x[1]);
}

/* ---- the token reduction over a device communicator ------------------------------------ */

/* Rank r of a 2-rank token reduction (one [10, 10] tensor, 4 chunks of 3
 * tokens in a batch of 12; rank r holds chunks 2r, 2r + 1), through comm:
 * bound, agree, add, allreduce, finish into out[100]. fault 1: rank 1
 * resets its state before bx_tokred_allreduce (a state not agreed: a local
 * failure that every rank must learn of in the agreement's collective). */
typedef struct tk_job {
  bxt_rank_ctx ctx;
  bx_comm comm;
  int mode, fault;
  bx_status st;
  float out[100];
  int prepares;
  char err[512];
} tk_job;

static void tk_partial(float *p, int64_t chunk) {
  for (int i = 0; i < 100; i++) /* a wide range, negatives, a tie-maker: rank-independent */
    p[i] = (float)ldexp((double)((i * 37 + chunk * 11) % 23) - 11.0, (int)((i + chunk) % 9) - 4) +
           (i % 7 == 0 ? 1e-7f * (float)chunk : 0.0f);
}

static void *tk_rank_main(void *arg) {
  tk_job *j = arg;
  int64_t shape[2] = {10, 10};
  float p[100];
  DLTensor g = bxt_f32_view(NULL, 2, shape), tp = bxt_f32_view(p, 2, shape),
           to = bxt_f32_view(j->out, 2, shape);
  bx_tokred_opts o = BX_TOKRED_OPTS_DEFAULT;
  o.mode = (bx_tokred_mode)j->mode;
  bx_tokred *s = NULL;
  sim_prepares = 0;
  j->st = bx_tokred_create(&g, 1, 3, 12, &o, &s);
  int r = j->ctx.rank;
  for (int64_t c = 2 * r; j->st == BX_OK && c < 2 * r + 2; c++) {
    tk_partial(p, c);
    j->st = bx_tokred_bound(s, 0, c, &tp);
  }
  if (j->st == BX_OK) j->st = bx_tokred_agree(s, &j->comm);
  for (int64_t c = 2 * r; j->st == BX_OK && c < 2 * r + 2; c++) {
    tk_partial(p, c);
    j->st = bx_tokred_add(s, 0, c, &tp);
  }
  if (j->st == BX_OK && j->fault && r == 1) j->st = bx_tokred_reset(s, NULL); /* not agreed now */
  if (j->st == BX_OK) j->st = bx_tokred_allreduce(s, &j->comm);
  if (j->st == BX_OK) j->st = bx_tokred_finish(s, &to, 1, 1);
  j->prepares = sim_prepares;
  snprintf(j->err, sizeof j->err, "%s", j->st == BX_OK ? "" : bx_last_error());
  bx_tokred_destroy(s);
  return NULL;
}

/* Two ranks through device (1: the device communicator, staged by the
 * simulated backend) or host communicators; returns rank 0's output. */
static void tk_two_ranks(int device, int mode, int fault, tk_job *jobs) {
  bxt_world w;
  bxt_world_init(&w, 2);
  pthread_t th[2];
  memset(jobs, 0, 2 * sizeof *jobs);
  for (int r = 0; r < 2; r++) {
    jobs[r].comm = bxt_sim_comm(&w, &jobs[r].ctx, r);
    if (device) {
      jobs[r].comm.allreduce_i64_async = sim_async;
      jobs[r].comm.on_device = 1;
    }
    jobs[r].mode = mode;
    jobs[r].fault = fault;
    pthread_create(&th[r], NULL, tk_rank_main, &jobs[r]);
  }
  for (int r = 0; r < 2; r++) pthread_join(th[r], NULL);
  CHECK(!w.timed_out, "tokred device=%d mode %d fault %d: a rank waited 5 s: a hang", device,
        mode, fault);
  bxt_world_free(&w);
}

void test_device_comm_tokred(void) {
  bx_backend_cuda_override(&sim_backend);
  for (int mode = 0; mode < 2 && !bxt_failures(); mode++) {
    tk_job host[2], dev[2];
    tk_two_ranks(0, mode, 0, host);
    tk_two_ranks(1, mode, 0, dev);
    for (int r = 0; r < 2; r++) {
      CHECK(host[r].st == BX_OK && dev[r].st == BX_OK, "mode %d rank %d: host %s (%s), device %s (%s)",
            mode, r, bx_status_str(host[r].st), host[r].err, bx_status_str(dev[r].st), dev[r].err);
      CHECK(memcmp(host[r].out, dev[r].out, sizeof host[r].out) == 0 &&
                memcmp(dev[r].out, dev[0].out, sizeof dev[0].out) == 0,
            "mode %d rank %d: the device communicator's result differs from the host one's", mode, r);
      /* agree and allreduce each stage through one prepare (the gather of the
       * ordinary mode, 200 words over a 105-word staging, goes in pieces) */
      CHECK(dev[r].prepares == 2, "mode %d rank %d: %d prepares (2 expected)", mode, r,
            dev[r].prepares);
    }
  }
  /* rank 1 fails locally in the allreduce: both ranks fail, nobody waits */
  tk_job f[2];
  tk_two_ranks(1, 0, 1, f);
  CHECK(f[1].st == BX_EINVAL, "the unagreed rank: %s (%s)", bx_status_str(f[1].st), f[1].err);
  CHECK(f[0].st == BX_EINVAL && strstr(f[0].err, "rank 1 failed its local checks"),
        "rank 0 learns rank 1's failure: %s (%s)", bx_status_str(f[0].st), f[0].err);
  bx_backend_cuda_override(NULL);
  /* no backend (the real one, without a usable device, or none built): a local
   * failure that names the device communicator or the device, not a hang of one rank alone */
  bx_tokred *s = NULL;
  int64_t shape[1] = {4};
  DLTensor g = bxt_f32_view(NULL, 1, shape);
  CHECK_STATUS(bx_tokred_create(&g, 1, 1, 1, NULL, &s), BX_OK, "create");
  bx_comm c = BX_COMM_DEFAULT;
  c.allreduce_i64 = bxt_sim_allreduce;
  c.on_device = 1;
  if (bx_cuda_available() != BX_OK) {
    bx_status st = bx_tokred_agree(s, &c);
    CHECK(st == BX_EDEVICE, "a device communicator without a device: %s (%s)", bx_status_str(st),
          bx_last_error());
    CHECK(strstr(bx_last_error(), "bx_tokred_agree"), "names the call: %s", bx_last_error());
  }
  bx_tokred_destroy(s);
}
