/*
 * test_faults.c — every failure is collective and loses nothing:
 * NaN on one rank and Inf on another (error_if_nonfinite off: NaN/Inf
 * norms everywhere; on: BX_ENONFINITE on every rank naming the rank and
 * tensor), a rank passing a different group count or different options
 * (BX_EMISMATCH everywhere, never a hang), a communicator that fails
 * (BX_ECOMM) — and in every failing clip, no rank modifies a gradient.
 *   mpirun -np P build/tests/mpi/test_faults
 */
#include "dist_util.h"

#define NT 3
#define N 257

static tensor grads[NT], saved[NT];
static DLTensor views[NT];
static int64_t shapes[NT];

static void reset(void) {
  rng r = rng_seeded(77 + (uint64_t)g_rank);
  for (int i = 0; i < NT; i++) {
    if (!grads[i].data) grads[i] = tensor_new(i == 1 ? DT_BF16 : DT_F32, N, i % 2);
    tensor_fill(&grads[i], &r, 0.1);
    views[i] = view(&grads[i], 0, N, &shapes[i]);
    if (!saved[i].data) saved[i] = tensor_new(grads[i].dtype, N, 0);
    memcpy(saved[i].data, grads[i].data, N * grads[i].esize);
  }
}

static int unmodified(void) {
  for (int i = 0; i < NT; i++)
    if (memcmp(saved[i].data, grads[i].data, N * grads[i].esize)) return 0;
  return 1;
}

static void poke(int i, size_t k, float v) {
  ((float *)grads[i].data)[k] = v; /* tensors 0 and 2 are fp32 */
  memcpy(saved[i].data, grads[i].data, N * grads[i].esize);
}

/* every rank must see the same status: reduce min and max */
static void check_all_same(bx_status st, bx_status want, const char *what) {
  int s = (int)st, lo, hi;
  MPI_Allreduce(&s, &lo, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(&s, &hi, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  CHECK(lo == (int)want && hi == (int)want, "%s: statuses %d..%d on the ranks, want %d (%s)",
        what, lo, hi, (int)want, bx_last_error());
}

typedef struct failing {
  bx_comm inner;
  int calls, fail_at;
} failing;

static int failing_allreduce(int64_t *buf, size_t n, bx_op op, void *ctx) {
  failing *f = ctx;
  if (++f->calls == f->fail_at) return 42;
  return f->inner.allreduce_i64(buf, n, op, f->inner.ctx);
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_size);
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  MPI_Comm_set_errhandler(MPI_COMM_SELF, MPI_ERRORS_RETURN);
  bx_comm comm = bx_comm_mpi(MPI_COMM_WORLD);
  CHECK(comm.rank == g_rank, "bx_comm_mpi rank %d != %d", comm.rank, g_rank);
  bx_group g[2] = {{&views[0], 2}, {&views[2], 1}};
  bx_norm_opts o = BX_NORM_OPTS_DEFAULT;
  bx_clip_opts co = BX_CLIP_OPTS_DEFAULT;
  double v, c, gn[2];
  int nan_rank = g_size > 1 ? 1 : 0, inf_rank = g_size > 2 ? 2 : 0;

  /* 1. NaN on one rank, Inf on another, error_if_nonfinite off */
  reset();
  if (g_rank == nan_rank) poke(2, 5, NAN);
  if (g_rank == inf_rank) poke(0, 9, INFINITY);
  v = 0;
  bx_status st = bx_total_norm(g, 2, &comm, &o, &v, gn);
  check_all_same(st, BX_OK, "NaN+Inf, no error");
  CHECK(isnan(v), "NaN anywhere gives a NaN norm on every rank (%a)", v);
  CHECK(isnan(gn[1]) && isinf(gn[0]), "per group: Inf group %a, NaN group %a", gn[0], gn[1]);
  reset();
  if (g_rank == inf_rank) poke(0, 9, -INFINITY);
  st = bx_total_norm(g, 2, &comm, &o, &v, NULL);
  check_all_same(st, BX_OK, "Inf only");
  CHECK(v == INFINITY, "Inf gives +Inf (%a)", v);

  /* 2. error_if_nonfinite: all ranks fail together, naming rank and tensor */
  reset();
  if (g_rank == inf_rank) poke(0, 9, INFINITY);
  if (g_rank == nan_rank) poke(2, 5, NAN);
  co.norm.error_if_nonfinite = 1;
  v = c = -7;
  st = bx_clip_grad_norm(g, 2, &comm, 1e-3, &co, &v, &c);
  check_all_same(st, BX_ENONFINITE, "error_if_nonfinite");
  char want[64];
  int first = nan_rank < inf_rank ? nan_rank : inf_rank;
  /* lowest rank first, then lowest group: the Inf is in group 0, the NaN in group 1 */
  int first_group = first == inf_rank ? 0 : 1;
  snprintf(want, sizeof want, "rank %d, group %d, tensor 0", first, first_group);
  CHECK(strstr(bx_last_error(), want) != NULL, "message '%s' should name '%s'", bx_last_error(),
        want);
  CHECK(v == -7 && c == -7, "outputs untouched on error");
  CHECK(unmodified(), "no gradient modified after BX_ENONFINITE");
  co.norm.error_if_nonfinite = 0;

  /* 3. a rank with a different group count */
  reset();
  size_t ng = g_rank == g_size - 1 && g_size > 1 ? 1 : 2;
  st = bx_clip_grad_norm(g, ng, &comm, 1e-3, &co, &v, &c);
  check_all_same(st, g_size > 1 ? BX_EMISMATCH : BX_OK, "group count mismatch");
  if (g_size > 1) {
    CHECK(strstr(bx_last_error(), "number of groups") != NULL, "message: %s", bx_last_error());
    CHECK(unmodified(), "no gradient modified after BX_EMISMATCH");
  }

  /* 4. different options: norm_type on rank 0, max_norm on the last rank */
  reset();
  o.norm_type = g_rank == 0 && g_size > 1 ? 1.0 : 2.0;
  st = bx_total_norm(g, 2, &comm, &o, &v, NULL);
  check_all_same(st, g_size > 1 ? BX_EMISMATCH : BX_OK, "norm_type mismatch");
  o.norm_type = 2.0;
  double mn = g_rank == g_size - 1 && g_size > 1 ? 2e-3 : 1e-3;
  st = bx_clip_grad_norm(g, 2, &comm, mn, &co, &v, &c);
  check_all_same(st, g_size > 1 ? BX_EMISMATCH : BX_OK, "max_norm mismatch");
  if (g_size > 1) {
    CHECK(strstr(bx_last_error(), "max_norm") != NULL, "message: %s", bx_last_error());
    CHECK(unmodified(), "no gradient modified after a max_norm mismatch");
  }

  /* 4b. one rank fails its local checks (an int32 tensor; overlapping
   * tensors in a clip): every rank fails with that status, none hangs */
  if (g_size > 1) {
    reset();
    int bad_rank = g_size - 1;
    DLTensor bad[2] = {views[0], views[0]};
    if (g_rank == bad_rank) bad[0].dtype.code = kDLInt;
    bx_group gb[2] = {{bad, 1}, {&views[2], 1}};
    st = bx_total_norm(gb, 2, &comm, NULL, &v, NULL);
    check_all_same(st, BX_EDTYPE, "one rank with an int32 tensor");
    snprintf(want, sizeof want, "rank %d failed", bad_rank);
    if (g_rank == bad_rank)
      CHECK(strstr(bx_last_error(), "group 0, tensor 0") != NULL, "own message: %s", bx_last_error());
    else
      CHECK(strstr(bx_last_error(), want) != NULL, "message '%s' should say '%s'", bx_last_error(), want);
    bad[0] = views[0];
    gb[0].count = g_rank == bad_rank ? 2 : 1; /* the same tensor twice: overlap */
    st = bx_clip_grad_norm(gb, 2, &comm, 1e-3, &co, &v, &c);
    check_all_same(st, BX_ELAYOUT, "one rank passing a tensor twice to clip");
    CHECK(unmodified(), "no gradient modified after a local failure on one rank");
  }

  /* 5. a communicator failing at the agreement, then at the norm collective */
  for (int at = 1; at <= 2; at++) {
    reset();
    failing f = {comm, 0, at};
    bx_comm fc = BX_COMM_DEFAULT;
    fc.allreduce_i64 = failing_allreduce;
    fc.ctx = &f;
    fc.rank = g_rank;
    st = bx_clip_grad_norm(g, 2, &fc, 1e-3, &co, &v, &c);
    check_all_same(st, BX_ECOMM, "failing communicator");
    CHECK(strstr(bx_last_error(), "code 42") != NULL, "message: %s", bx_last_error());
    CHECK(unmodified(), "no gradient modified after BX_ECOMM (fail at call %d)", at);
  }

  /* 6. a real MPI error: MPI_COMM_NULL with MPI_ERRORS_RETURN */
  reset();
  bx_comm nullc = bx_comm_mpi(MPI_COMM_NULL);
  st = bx_clip_grad_norm(g, 2, &nullc, 1e-3, &co, &v, &c);
  CHECK(st == BX_ECOMM, "MPI_COMM_NULL gives BX_ECOMM (%d: %s)", (int)st, bx_last_error());
  CHECK(unmodified(), "no gradient modified after an MPI error");

  /* and a healthy clip afterwards does clip, identically on every rank */
  reset();
  st = bx_clip_grad_norm(g, 2, &comm, 1e-3, &co, &v, &c);
  check_all_same(st, BX_OK, "healthy clip");
  double lo, hi;
  MPI_Allreduce(&c, &lo, 1, MPI_DOUBLE, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(&c, &hi, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  CHECK(lo == hi && c < 1.0, "same coefficient on all ranks (%a..%a)", lo, hi);
  CHECK(!unmodified(), "the healthy clip scaled the gradients");

  int bad = dist_finish("test_faults");
  for (int i = 0; i < NT; i++) {
    free(grads[i].data);
    free(saved[i].data);
  }
  MPI_Finalize();
  return bad;
}
