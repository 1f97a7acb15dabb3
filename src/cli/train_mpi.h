/*
 * train_mpi.h — the ranks of `bitexact train` (train_mpi.c).
 */
#ifndef BX_CLI_TRAIN_MPI_H
#define BX_CLI_TRAIN_MPI_H

#include <bitexact.h>

/* This process's rank and the number of ranks; *comm the communicator
 * over all of them (NULL for one process). 1 if MPI was initialised. */
int trm_init(int *rank, int *size, const bx_comm **comm);

/* The worst status over the ranks (the exit status of every rank); MPI
 * finalised. */
int trm_finish(int status);

#endif /* BX_CLI_TRAIN_MPI_H */
