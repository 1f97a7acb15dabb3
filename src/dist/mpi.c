/*
 * mpi.c — bx_comm over MPI: int64 words, MPI_SUM or MPI_MAX, in place.
 * Integer all-reduce is exact and associative, so whatever reduction
 * algorithm (ring, tree, recursive doubling) MPI picks, every rank gets the
 * same words. The float all-reduce (allreduce_f32) is the ordinary
 * training mode's negative control only: MPI's order, its bits vary.
 */
#include <string.h>

#include "bitexact_mpi.h"

_Static_assert(sizeof(MPI_Comm) <= sizeof(void *), "MPI_Comm must fit in a pointer");

static MPI_Comm comm_of(void *ctx) {
  MPI_Comm c;
  memcpy(&c, &ctx, sizeof c);
  return c;
}

static int mpi_allreduce_i64(int64_t *buf, size_t n, bx_op op, void *ctx) {
  if (n > (size_t)0x7FFFFFFF) return -1; /* MPI counts are int */
  int rc = MPI_Allreduce(MPI_IN_PLACE, buf, (int)n, MPI_INT64_T,
                         op == BX_OP_MAX ? MPI_MAX : MPI_SUM, comm_of(ctx));
  return rc == MPI_SUCCESS ? 0 : (rc ? rc : -1);
}

/* The ordinary mode's float all-reduce: MPI's own order, not exact. */
static int mpi_allreduce_f32(float *buf, size_t n, void *ctx) {
  if (n > (size_t)0x7FFFFFFF) return -1;
  int rc = MPI_Allreduce(MPI_IN_PLACE, buf, (int)n, MPI_FLOAT, MPI_SUM, comm_of(ctx));
  return rc == MPI_SUCCESS ? 0 : (rc ? rc : -1);
}

bx_comm bx_comm_mpi(MPI_Comm comm) {
  bx_comm c = BX_COMM_DEFAULT; /* struct_size: this build's sizeof(bx_comm) */
  c.allreduce_i64 = mpi_allreduce_i64;
  c.allreduce_f32 = mpi_allreduce_f32;
  memcpy(&c.ctx, &comm, sizeof comm);
  if (MPI_Comm_rank(comm, &c.rank) != MPI_SUCCESS) c.rank = -1;
  return c;
}
