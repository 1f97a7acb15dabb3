/*
 * demo.h — what demo.c (model, layouts, simulated ranks, table) shares with
 * demo_mpi.c (the same layouts over real MPI ranks, when built with MPI).
 */
#ifndef BX_CLI_DEMO_H
#define BX_CLI_DEMO_H

#include <stddef.h>
#include <stdint.h>

#include <bitexact.h>

#define DEMO_MAX_TENSORS 160
#define DEMO_MAX_RANKS 8

/* One layout's outcome (on rank 0 / the simulating thread). */
typedef struct demo_result {
  int ranks, threads, shuffled;
  const char *via;      /* "mpi", "threads" (simulated ranks) */
  float naive;          /* fp32 sums per thread, per rank, all-reduced in fp32 */
  double exact;         /* bx_total_norm */
  double groups[2];     /* dense, expert */
  double coef;          /* bx_clip_coef(exact, 1.0) */
  int ranks_agree;      /* every rank got the same bits */
  int ok;               /* no bitexact error */
  char error[256];
} demo_result;

/* The views rank r of R owns (groups: 0 dense, 1 expert), in model or
 * shuffled order. views and shapes need DEMO_MAX_TENSORS entries each. */
void demo_rank_groups(int R, int r, int shuffled, DLTensor *views, int64_t *shapes,
                      bx_group groups[2]);

/* Rank r's naive fp32 sum of squares with T threads (each thread sums its
 * contiguous part of every owned view, the rank adds the thread sums). */
float demo_naive_rank(int R, int r, int T, int shuffled);

/* Rank-count reduction of fp32 partials as a tree (what a float
 * all-reduce does), used by the simulated layouts. */
float demo_tree_sum(const float *v, int n);

/* MPI (demo_mpi.c, or stubs when built without MPI). */
/* 1 when this process runs under mpirun (MPI initialised), else 0. */
int demo_mpi_init(int *rank, int *size);
/* Runs layout (R, T, shuffled) over MPI ranks 0..R-1 of the world
 * (collective over the world; R <= world size); fills *res on rank 0. */
void demo_mpi_layout(int R, int T, int shuffled, demo_result *res);
/* Broadcasts rank 0's status, finalises MPI, returns the status. */
int demo_mpi_finish(int status);

#endif /* BX_CLI_DEMO_H */
