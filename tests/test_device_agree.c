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
