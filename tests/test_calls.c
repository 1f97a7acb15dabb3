/*
 * test_calls.c — what a call does besides its numerics: a forked child
 * works after a multi-threaded call in the parent; a call made from a
 * communicator callback (re-entry) works, each level with its own scratch
 * memory, and nesting past BX_MAX_NESTING is refused by name; error texts
 * are never garbled (an argument may be the current text); a call that
 * succeeds leaves the last error alone; error locations come as numbers.
 */
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "error.h"
#include "harness.h"
#include "tests.h"
#include "util.h"

static double norm_of(bx_group *g, size_t ng, int threads, double p) {
  bx_norm_opts o = BX_NORM_OPTS_DEFAULT;
  o.num_threads = threads;
  o.norm_type = p;
  double v = -1.0;
  if (bx_total_norm(g, ng, NULL, &o, &v, NULL) != BX_OK) return -2.0;
  return v;
}

/* ---- fork -------------------------------------------------------------- */

void test_fork_after_threads(void) {
  bxt_rng r;
  bxt_rng_init(&r);
  bxt_tensor x[2];
  bxt_tensor_alloc(&x[0], REF_F32, (size_t)1 << 20);
  bxt_tensor_alloc(&x[1], REF_BF16, (size_t)1 << 19);
  bxt_fill_gradient(&r, &x[0], 1e-2);
  bxt_fill_gradient(&r, &x[1], 1e-2);
  DLTensor dl[2] = {x[0].t, x[1].t};
  bx_group g = {dl, 2};
  double want2 = norm_of(&g, 1, 4, 2.0), want0 = norm_of(&g, 1, 4, 0.0);
  CHECK(want2 > 0 && want0 > 0, "parent: the multi-threaded calls work");
  fflush(NULL);
  for (int round = 0; round < 2; round++) {
    pid_t pid = fork();
    if (pid == 0) {
      alarm(20); /* a deadlock in the child's pool ends it here, not in CI's timeout */
      int bad = 0;
      for (int t = 1; t <= 4; t *= 2) {
        double v2 = norm_of(&g, 1, t, 2.0), v0 = norm_of(&g, 1, t, 0.0);
        bad |= memcmp(&v2, &want2, 8) != 0 || memcmp(&v0, &want0, 8) != 0;
      }
      /* and the child's own child (its pool was started by the child) */
      pid_t grand = fork();
      if (grand == 0) {
        alarm(20);
        double v = norm_of(&g, 1, 2, 2.0);
        _exit(memcmp(&v, &want2, 8) != 0);
      }
      int gs = 0;
      bad |= waitpid(grand, &gs, 0) != grand || !WIFEXITED(gs) || WEXITSTATUS(gs) != 0;
      _exit(bad ? 1 : 0);
    }
    CHECK(pid > 0, "fork");
    if (pid <= 0) break;
    int status = 0;
    CHECK(waitpid(pid, &status, 0) == pid, "waitpid");
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0,
          "round %d: the forked child %s", round,
          WIFSIGNALED(status) ? (WTERMSIG(status) == SIGALRM ? "hung (deadlock in the pool)"
                                                             : "was killed")
                              : "got other bits");
    /* the parent's pool still works after the fork */
    CHECK_BITS_D(norm_of(&g, 1, 2, 2.0), want2, "round %d: parent after fork", round);
  }
  bxt_tensor_free(&x[0]);
  bxt_tensor_free(&x[1]);
}

/* ---- re-entry from a communicator callback ----------------------------- */

typedef struct nest_ctx {
  bx_group *inner;      /* what the callback's call reduces */
  size_t ninner;
  int depth, max_depth; /* this level, and how deep to go */
  struct nest_ctx *next;
  bx_status st;         /* the inner call's status */
  double norm;          /* its result */
  char err[512];
} nest_ctx;

static int nesting_allreduce(int64_t *buf, size_t n, bx_op op, void *ctx) {
  (void)buf, (void)n, (void)op; /* one rank: the words are already the sum */
  nest_ctx *c = ctx;
  if (!c->next || c->st != (bx_status)-1) return 0; /* once per level (the first collective) */
  nest_ctx *in = c->next;
  bx_comm comm = BX_COMM_DEFAULT;
  comm.allreduce_i64 = nesting_allreduce;
  comm.ctx = in;
  comm.rank = 0;
  bx_norm_opts o = BX_NORM_OPTS_DEFAULT;
  o.num_threads = 2;
  c->st = bx_total_norm(in->inner, in->ninner, in->depth < in->max_depth ? &comm : NULL, &o,
                        &c->norm, NULL);
  snprintf(c->err, sizeof c->err, "%s", c->st == BX_OK ? "" : bx_last_error());
  return 0;
}

void test_reentry_from_callback(void) {
  bxt_rng r;
  bxt_rng_init(&r);
  /* the outer call: few groups; the inner ones: many groups and more data,
   * so an inner workspace at the outer's level would have to grow (and
   * move) under the outer call */
  enum { LEVELS = BX_MAX_NESTING + 2 };
  bxt_tensor xs[LEVELS][40];
  DLTensor dl[LEVELS][40];
  bx_group gs[LEVELS][40];
  size_t ng[LEVELS];
  double want[LEVELS];
  for (int l = 0; l < LEVELS; l++) {
    ng[l] = 2 + 7 * (size_t)l;
    if (ng[l] > 40) ng[l] = 40;
    for (size_t k = 0; k < ng[l]; k++) {
      bxt_tensor_alloc(&xs[l][k], (int)(k % 4), 3000 + 5000 * (size_t)l + k);
      bxt_fill_mixed(&r, &xs[l][k]);
      dl[l][k] = xs[l][k].t;
      gs[l][k] = (bx_group){&dl[l][k], 1};
    }
    want[l] = norm_of(gs[l], ng[l], 1, 2.0);
  }
  nest_ctx ctx[LEVELS];
  for (int l = 0; l < LEVELS; l++) {
    ctx[l].inner = gs[l];
    ctx[l].ninner = ng[l];
    ctx[l].depth = l + 1; /* the call at level l runs at nesting depth l + 1 */
    ctx[l].max_depth = LEVELS;
    ctx[l].next = l + 1 < LEVELS ? &ctx[l + 1] : NULL;
    ctx[l].st = (bx_status)-1;
    ctx[l].norm = -1.0;
    ctx[l].err[0] = 0;
  }
  bx_comm comm = BX_COMM_DEFAULT;
  comm.allreduce_i64 = nesting_allreduce;
  comm.ctx = &ctx[0];
  comm.rank = 0;
  bx_norm_opts o = BX_NORM_OPTS_DEFAULT;
  o.num_threads = 2;
  double got = -1.0;
  CHECK_STATUS(bx_total_norm(gs[0], ng[0], &comm, &o, &got, NULL), BX_OK, "the outer call");
  CHECK_BITS_D(got, want[0], "the outer call's norm, with calls nested under it");
  /* levels 1 .. BX_MAX_NESTING - 1 work; the one past the limit is refused */
  for (int l = 0; l + 1 < LEVELS; l++) {
    int depth = l + 2; /* of the call this callback made */
    if (depth <= BX_MAX_NESTING) {
      CHECK_STATUS(ctx[l].st, BX_OK, "nested call at depth %d: %s", depth, ctx[l].err);
      CHECK_BITS_D(ctx[l].norm, want[l + 1], "nested call at depth %d: its norm", depth);
    } else if (depth == BX_MAX_NESTING + 1) {
      CHECK_STATUS(ctx[l].st, BX_EINVAL, "the call at depth %d (past BX_MAX_NESTING) is refused",
                   depth);
      CHECK(strstr(ctx[l].err, "nested") != NULL, "the refusal names the cause: \"%s\"",
            ctx[l].err);
    }
  }
  for (int l = 0; l < LEVELS; l++)
    for (size_t k = 0; k < ng[l]; k++) bxt_tensor_free(&xs[l][k]);
}

/* ---- error texts and locations ----------------------------------------- */

void test_error_text_not_garbled(void) {
  /* the pattern of a wrapper: "outer: <the inner message>" */
  bx_fail(BX_EDEVICE, "inner: the device is gone");
  bx_fail(BX_EDEVICE, "%s: %s", "bx_total_norm", bx_last_error());
  CHECK(strcmp(bx_last_error(), "bx_total_norm: inner: the device is gone") == 0,
        "an argument that is the current text: \"%s\"", bx_last_error());
  bx_fail(BX_EINVAL, "%s|%s|%s", bx_last_error(), "x", bx_last_error());
  CHECK(strcmp(bx_last_error(),
               "bx_total_norm: inner: the device is gone|x|bx_total_norm: inner: the device is gone") == 0,
        "twice: \"%s\"", bx_last_error());
  /* a CUDA tensor in a build or on a machine without a usable device: the
   * call's name once, then the reason */
  int64_t shape = 4;
  DLTensor d;
  memset(&d, 0, sizeof d);
  d.data = (void *)(uintptr_t)0x10000;
  d.device.device_type = kDLCUDA;
  d.ndim = 1;
  d.shape = &shape;
  d.dtype = bxt_dl_dtype(REF_F32);
  bx_group g = {&d, 1};
  double v;
  if (bx_cuda_available() != BX_OK) {
    CHECK_STATUS(bx_total_norm(&g, 1, NULL, NULL, &v, NULL), BX_EDEVICE, "CUDA tensor");
    const char *m = bx_last_error();
    CHECK(strncmp(m, "bx_total_norm: ", 15) == 0 && strstr(m + 15, "bx_total_norm") == NULL &&
              strstr(m, "CUDA") != NULL,
          "the message names the call once and says why: \"%s\"", m);
  }
}

/* Every public call that succeeds leaves bx_last_error() and its location
 * as they were. */
void test_success_keeps_last_error(void) {
  bxt_rng r;
  bxt_rng_init(&r);
  bxt_tensor x[3];
  for (int k = 0; k < 3; k++) {
    bxt_tensor_alloc(&x[k], k + 1, 5000);
    bxt_fill_gradient(&r, &x[k], 1.0);
  }
  DLTensor dl[3] = {x[0].t, x[1].t, x[2].t};
  DLTensor twice[2] = {x[0].t, x[0].t}; /* shares memory: fine for a norm */
  bx_group g = {dl, 3}, g2 = {twice, 2};
  /* a failure to remember */
  DLTensor bad = x[1].t;
  bad.dtype.code = kDLInt;
  bx_group gb[2] = {{dl, 1}, {&bad, 1}};
  double v, c;
  CHECK_STATUS(bx_total_norm(gb, 2, NULL, NULL, &v, NULL), BX_EDTYPE, "the remembered failure");
  char text[512];
  snprintf(text, sizeof text, "%s", bx_last_error());
  bx_error_location loc = *bx_last_error_location();
  CHECK(loc.rank == -1 && loc.group == 1 && loc.tensor == 0, "its location: rank %d group %lld tensor %lld",
        loc.rank, loc.group, loc.tensor);
  bx_acc acc;
  bx_acc_init(&acc);
  bx_clip_opts co = BX_CLIP_OPTS_DEFAULT;
  bx_norm_opts no = BX_NORM_OPTS_DEFAULT;
  bx_status sts[9];
  int k = 0;
  sts[k++] = bx_total_norm(&g, 1, NULL, NULL, &v, NULL);
  sts[k++] = bx_total_norm(&g2, 1, NULL, NULL, &v, NULL); /* shared memory, norm only */
  sts[k++] = bx_clip_grad_norm(&g, 1, NULL, 1e-3, &co, &v, &c); /* scales */
  sts[k++] = bx_clip_grad_norm(&g, 1, NULL, 1e30, &co, &v, &c); /* does not */
  sts[k++] = bx_scale(dl, 3, 0.5, NULL);
  sts[k++] = bx_acc_add_squares(&acc, &dl[0]);
  DLDataType f32 = {kDLFloat, 32, 1};
  float f;
  sts[k++] = bx_acc_norm(&acc, 2.0, f32, &f);
  sts[k++] = bx_clip_coef(1.0, 0.5, &co, &c);
  no.norm_type = 0.0;
  no.error_if_nonfinite = 1;
  sts[k++] = bx_total_norm(&g, 1, NULL, &no, &v, NULL);
  for (int i = 0; i < k; i++) CHECK_STATUS(sts[i], BX_OK, "call %d", i);
  CHECK(strcmp(bx_last_error(), text) == 0, "succeeding calls left the last error: \"%s\"",
        bx_last_error());
  const bx_error_location *now = bx_last_error_location();
  CHECK(now->rank == loc.rank && now->group == loc.group && now->tensor == loc.tensor,
        "and its location");
  for (int i = 0; i < 3; i++) bxt_tensor_free(&x[i]);
}

void test_error_locations(void) {
  bxt_rng r;
  bxt_rng_init(&r);
  bxt_tensor x[5];
  for (int k = 0; k < 5; k++) {
    bxt_tensor_alloc(&x[k], k % 4, 700);
    bxt_fill_gradient(&r, &x[k], 1.0);
  }
  DLTensor dl[5];
  for (int k = 0; k < 5; k++) dl[k] = x[k].t;
  double v = -1, c;
  const bx_error_location *loc = bx_last_error_location();
  /* group 1, tensor 2: a bad layout (misaligned) */
  DLTensor saved = dl[4];
  dl[4].byte_offset = 1;
  bx_group g[2] = {{dl, 2}, {dl + 2, 3}};
  CHECK_STATUS(bx_total_norm(g, 2, NULL, NULL, &v, NULL), BX_ELAYOUT, "a misaligned view");
  CHECK(loc->rank == -1 && loc->group == 1 && loc->tensor == 2, "norm: group 1, tensor 2: %d %lld %lld",
        loc->rank, loc->group, loc->tensor);
  CHECK_STATUS(bx_scale(dl, 5, 0.5, NULL), BX_ELAYOUT, "bx_scale");
  CHECK(loc->group == -1 && loc->tensor == 4, "bx_scale: tensor 4 of the array: %lld %lld",
        loc->group, loc->tensor);
  dl[4] = saved;
  /* NaN with error_if_nonfinite: the offender */
  bxt_set(&x[3], 17, NAN);
  dl[3] = x[3].t;
  bx_norm_opts o = BX_NORM_OPTS_DEFAULT;
  o.error_if_nonfinite = 1;
  CHECK_STATUS(bx_total_norm(g, 2, NULL, &o, &v, NULL), BX_ENONFINITE, "NaN");
  CHECK(loc->group == 1 && loc->tensor == 1, "NaN in group 1, tensor 1: %lld %lld", loc->group,
        loc->tensor);
  bxt_set(&x[3], 17, 1.0);
  /* the same tensor twice in a clip: the second occurrence */
  DLTensor dup[3] = {dl[0], dl[1], dl[0]};
  bx_group gd = {dup, 3};
  CHECK_STATUS(bx_clip_grad_norm(&gd, 1, NULL, 1.0, NULL, &v, &c), BX_ELAYOUT, "shared memory");
  CHECK(loc->group == 0 && (loc->tensor == 0 || loc->tensor == 2), "clip overlap: group 0, tensor %lld",
        loc->tensor);
  CHECK(strstr(bx_last_error(), "tensor 0") && strstr(bx_last_error(), "tensor 2"),
        "names both: %s", bx_last_error());
  /* an accumulator call */
  DLTensor bad = dl[0];
  bad.dtype.bits = 8;
  bx_acc acc;
  bx_acc_init(&acc);
  CHECK_STATUS(bx_acc_add_squares(&acc, &bad), BX_EDTYPE, "acc");
  CHECK(loc->group == -1 && loc->tensor == 0, "acc: tensor 0: %lld %lld", loc->group, loc->tensor);
  for (int k = 0; k < 5; k++) bxt_tensor_free(&x[k]);
}

/* Negative thread counts are refused (nothing written, nothing scaled);
 * absurdly large ones give the same bits. */
void test_threads_extreme(void) {
  bxt_rng r;
  bxt_rng_init(&r);
  bxt_tensor xs[3];
  for (int k = 0; k < 3; k++) {
    bxt_tensor_alloc(&xs[k], k + 1, 150000);
    bxt_fill_mixed(&r, &xs[k]);
  }
  DLTensor dl[3] = {xs[0].t, xs[1].t, xs[2].t};
  bx_group g = {dl, 3};
  bx_norm_opts o = BX_NORM_OPTS_DEFAULT;
  o.num_threads = 1;
  double want = -1;
  CHECK_STATUS(bx_total_norm(&g, 1, NULL, &o, &want, NULL), BX_OK, "1 thread");
  bxt_tensor y1;
  bxt_tensor_clone(&y1, &xs[0]);
  bx_scale_opts s1 = BX_SCALE_OPTS_DEFAULT;
  s1.mode = BX_SCALE_EXACT;
  s1.num_threads = 1;
  CHECK_STATUS(bx_scale(&y1.t, 1, 0.3, &s1), BX_OK, "scale, 1 thread");
  static const int counts[] = {1000, 100000, -1, -1000};
  for (size_t i = 0; i < sizeof counts / sizeof counts[0]; i++) {
    int n = counts[i];
    o.num_threads = n;
    double got = -1;
    bx_status st = bx_total_norm(&g, 1, NULL, &o, &got, NULL);
    bxt_tensor y;
    bxt_tensor_clone(&y, &xs[0]);
    bx_scale_opts so = BX_SCALE_OPTS_DEFAULT;
    so.mode = BX_SCALE_EXACT;
    so.num_threads = n;
    bx_status ss = bx_scale(&y.t, 1, 0.3, &so);
    if (n < 0) {
      CHECK_STATUS(st, BX_EINVAL, "norm, %d threads", n);
      CHECK(got == -1, "%d threads refused: nothing written", n);
      CHECK(strstr(bx_last_error(), "num_threads") != NULL, "names num_threads: %s", bx_last_error());
      CHECK_STATUS(ss, BX_EINVAL, "scale, %d threads", n);
      CHECK(memcmp(y.buf, xs[0].buf, xs[0].n * bxt_dt_size(xs[0].dt)) == 0,
            "scale with %d threads refused: nothing modified", n);
    } else {
      CHECK_STATUS(st, BX_OK, "%d threads", n);
      CHECK_BITS_D(got, want, "%d threads: same norm", n);
      CHECK_STATUS(ss, BX_OK, "scale, %d threads", n);
      CHECK(memcmp(y.buf, y1.buf, xs[0].n * bxt_dt_size(xs[0].dt)) == 0,
            "scale with %d threads: the 1-thread bits", n);
    }
    bxt_tensor_free(&y);
  }
  bxt_tensor_free(&y1);
  for (int k = 0; k < 3; k++) bxt_tensor_free(&xs[k]);
}
