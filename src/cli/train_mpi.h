/*
 * train_mpi.h — the ranks of `bitexact train` (train_mpi.c).
 */
#ifndef BX_CLI_TRAIN_MPI_H
#define BX_CLI_TRAIN_MPI_H

#include <bitexact.h>

#include "train_model.h"

/* This process's rank and the number of ranks; *comm the communicator
 * over all of them (NULL for one process). 1 if MPI was initialised. */
int trm_init(int *rank, int *size, const bx_comm **comm);

/* The worst status over the ranks (the exit status of every rank); MPI
 * finalised. */
int trm_finish(int status);

/* Expert parallelism over groups of E consecutive ranks (E divides the
 * rank count, checked by the caller): the EP group's all-to-alls and the
 * replica communicator (same EP rank) in *ep; E = 1: ep->size 1, nothing
 * else. 0 / -1. */
int trm_ep_init(int E, tr_ep *ep);

/* Rank src sends bytes of buf to rank 0 (the other ranks: nothing);
 * called on every rank. 0 / nonzero on failure. */
int trm_to_root(void *buf, size_t bytes, int src);

#endif /* BX_CLI_TRAIN_MPI_H */
