/*
 * demo_mpi.c — the demo's layouts over real MPI ranks (built with mpicc and
 * BX_CLI_MPI=1 when the Makefile finds MPI; stubs otherwise). MPI is
 * initialised only when the process was started by mpirun (its environment
 * says so), so a plain `bitexact demo` never touches MPI.
 *
 * For a layout of R ranks, world ranks 0..R-1 form a communicator
 * (MPI_Comm_split); each computes its shards' norm with bx_total_norm over
 * bx_comm_mpi, and its naive fp32 partial, reduced with MPI_Allreduce on
 * MPI_FLOAT (a real float all-reduce). The ranks' bits are compared with a
 * MAX and a MIN all-reduce of the result's bit pattern.
 */
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "demo.h"

#if defined(BX_CLI_MPI) && BX_CLI_MPI

#include <math.h>
#include <mpi.h>

#include <bitexact_mpi.h>

static int mpi_rank, mpi_size;

int demo_mpi_init(int *rank, int *size) {
  if (!getenv("OMPI_COMM_WORLD_SIZE") && !getenv("PMI_SIZE") && !getenv("PMIX_RANK")) return 0;
  if (MPI_Init(NULL, NULL) != MPI_SUCCESS) return 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &mpi_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &mpi_size);
  *rank = mpi_rank;
  *size = mpi_size;
  return 1;
}

void demo_mpi_layout(int R, int T, int shuffled, demo_result *res) {
  MPI_Comm sub = MPI_COMM_NULL;
  res->via = "mpi";
  MPI_Comm_split(MPI_COMM_WORLD, mpi_rank < R ? 0 : MPI_UNDEFINED, mpi_rank, &sub);
  if (sub == MPI_COMM_NULL) return;
  MPI_Comm_set_errhandler(sub, MPI_ERRORS_RETURN);
  DLTensor views[DEMO_MAX_TENSORS];
  int64_t shapes[DEMO_MAX_TENSORS];
  bx_group groups[2];
  demo_rank_groups(R, mpi_rank, shuffled, views, shapes, groups);
  bx_comm comm = bx_comm_mpi(sub);
  bx_norm_opts o = BX_NORM_OPTS_DEFAULT;
  o.num_threads = T;
  double total = NAN, g[2] = {NAN, NAN};
  bx_status st = bx_total_norm(groups, 2, &comm, &o, &total, g);
  float part = demo_naive_rank(R, mpi_rank, T, shuffled), sum = 0;
  int failed = st != BX_OK || MPI_Allreduce(&part, &sum, 1, MPI_FLOAT, MPI_SUM, sub) != MPI_SUCCESS;
  int64_t bits = (int64_t)cli_bits_f64(total), hi = 0, lo = 0;
  int anyfail = 1;
  MPI_Allreduce(&bits, &hi, 1, MPI_INT64_T, MPI_MAX, sub);
  MPI_Allreduce(&bits, &lo, 1, MPI_INT64_T, MPI_MIN, sub);
  MPI_Allreduce(&failed, &anyfail, 1, MPI_INT, MPI_MAX, sub);
  if (mpi_rank == 0) {
    res->ok = !anyfail;
    if (st != BX_OK) snprintf(res->error, sizeof res->error, "%s: %s", bx_status_str(st), bx_last_error());
    else if (anyfail) snprintf(res->error, sizeof res->error, "a rank failed (MPI or bitexact error)");
    res->naive = sqrtf(sum);
    res->exact = total;
    res->groups[0] = g[0];
    res->groups[1] = g[1];
    res->ranks_agree = hi == lo;
  }
  MPI_Comm_free(&sub);
}

int demo_mpi_finish(int status) {
  MPI_Bcast(&status, 1, MPI_INT, 0, MPI_COMM_WORLD);
  MPI_Finalize();
  return status;
}

#else /* built without MPI: ranks are always simulated */

int demo_mpi_init(int *rank, int *size) {
  *rank = 0;
  *size = 1;
  return 0;
}

void demo_mpi_layout(int R, int T, int shuffled, demo_result *res) {
  (void)R, (void)T, (void)shuffled;
  snprintf(res->error, sizeof res->error, "built without MPI");
}

int demo_mpi_finish(int status) { return status; }

#endif
