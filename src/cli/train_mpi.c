/*
 * train_mpi.c — the ranks of `bitexact train`: MPI when this binary was
 * built with it (BX_CLI_MPI=1, as demo_mpi.c) and runs under mpirun (its
 * environment says so); else one process. train.c sees only a bx_comm.
 */
#include <stdlib.h>

#include "train_mpi.h"

#if defined(BX_CLI_MPI) && BX_CLI_MPI

#include <mpi.h>

#include <bitexact_mpi.h>

static bx_comm world;
static int active;

int trm_init(int *rank, int *size, const bx_comm **comm) {
  *rank = 0;
  *size = 1;
  *comm = NULL;
  if (!getenv("OMPI_COMM_WORLD_SIZE") && !getenv("PMI_SIZE") && !getenv("PMIX_RANK")) return 0;
  if (MPI_Init(NULL, NULL) != MPI_SUCCESS) return 0;
  active = 1;
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  MPI_Comm_rank(MPI_COMM_WORLD, rank);
  MPI_Comm_size(MPI_COMM_WORLD, size);
  world = bx_comm_mpi(MPI_COMM_WORLD);
  if (*size > 1) *comm = &world;
  return 1;
}

int trm_finish(int status) {
  if (!active) return status;
  int worst = status;
  MPI_Allreduce(&status, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  active = 0;
  return worst;
}

#else

int trm_init(int *rank, int *size, const bx_comm **comm) {
  *rank = 0;
  *size = 1;
  *comm = NULL;
  return 0;
}

int trm_finish(int status) { return status; }

#endif
