/*
 * train_mpi.c — the ranks of `bitexact train`: MPI when this binary was
 * built with it (BX_CLI_MPI=1, as demo_mpi.c) and runs under mpirun (its
 * environment says so); else one process. train.c sees only a bx_comm.
 */
#include <stdlib.h>

#include <string.h>

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


/* ---- expert parallelism: the EP group and the replica communicators ---- */

static MPI_Comm ep_comm = MPI_COMM_NULL, rep_comm = MPI_COMM_NULL;
static bx_comm rep;
static int ep_size;

static int ep_alltoall_i64(const int64_t *send, int64_t *recv, void *ctx) {
  (void)ctx;
  return MPI_Alltoall((void *)send, 1, MPI_INT64_T, recv, 1, MPI_INT64_T, ep_comm) != MPI_SUCCESS;
}

static int ep_alltoallv(const void *send, const int64_t *sbytes, void *recv, const int64_t *rbytes,
                        void *ctx) {
  (void)ctx;
  int n = ep_size, *sc = malloc(4 * (size_t)n * sizeof *sc);
  if (!sc) return 1;
  int *rc = sc + n, *sd = rc + n, *rd = sd + n, bad = 0;
  int64_t so = 0, ro = 0;
  for (int i = 0; i < n; i++) {
    if (sbytes[i] > 0x7fffffff || rbytes[i] > 0x7fffffff || so > 0x7fffffff || ro > 0x7fffffff) bad = 1;
    sc[i] = (int)sbytes[i], rc[i] = (int)rbytes[i], sd[i] = (int)so, rd[i] = (int)ro;
    so += sbytes[i], ro += rbytes[i];
  }
  /* every rank takes part, even one whose counts overflow (no hang) */
  int err = MPI_Alltoallv((void *)send, sc, sd, MPI_BYTE, recv, rc, rd, MPI_BYTE, ep_comm) != MPI_SUCCESS;
  free(sc);
  return err || bad;
}

int trm_ep_init(int E, tr_ep *ep) {
  int rank = 0, size = 1;
  memset(ep, 0, sizeof *ep);
  ep->size = 1;
  if (!active || E <= 1) return 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (MPI_Comm_split(MPI_COMM_WORLD, rank / E, rank % E, &ep_comm) != MPI_SUCCESS ||
      MPI_Comm_split(MPI_COMM_WORLD, rank % E, rank / E, &rep_comm) != MPI_SUCCESS)
    return -1;
  MPI_Comm_set_errhandler(ep_comm, MPI_ERRORS_RETURN);
  MPI_Comm_set_errhandler(rep_comm, MPI_ERRORS_RETURN);
  ep_size = E;
  ep->size = E;
  ep->rank = rank % E;
  if (size / E > 1) {
    rep = bx_comm_mpi(rep_comm);
    ep->replica = &rep;
  }
  ep->alltoall_i64 = ep_alltoall_i64;
  ep->alltoallv = ep_alltoallv;
  return 0;
}

int trm_to_root(void *buf, size_t bytes, int src) {
  int rank = 0;
  if (!active || src == 0) return 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank == src) return MPI_Send(buf, (int)bytes, MPI_BYTE, 0, 77, MPI_COMM_WORLD) != MPI_SUCCESS;
  if (rank == 0)
    return MPI_Recv(buf, (int)bytes, MPI_BYTE, src, 77, MPI_COMM_WORLD, MPI_STATUS_IGNORE) != MPI_SUCCESS;
  return 0;
}

int trm_finish(int status) {
  if (!active) return status;
  int worst = status;
  MPI_Allreduce(&status, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (ep_comm != MPI_COMM_NULL) MPI_Comm_free(&ep_comm);
  if (rep_comm != MPI_COMM_NULL) MPI_Comm_free(&rep_comm);
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

int trm_ep_init(int E, tr_ep *ep) {
  memset(ep, 0, sizeof *ep);
  ep->size = 1;
  return E > 1 ? -1 : 0;
}

int trm_to_root(void *buf, size_t bytes, int src) {
  (void)buf, (void)bytes;
  return src != 0;
}

#endif
