/*
 * sim_comm.h — ranks simulated by threads of this process, with a bx_comm
 * whose all-reduce combines their int64 buffers (SUM or MAX) as MPI would:
 * the tests of the distributed paths (test_ranks.c, test_tokred.c) without
 * mpirun. A rank that never reaches the collective is reported as a hang
 * (the barrier gives up after 5 s and timed_out is set) instead of waiting
 * forever.
 */
#ifndef BX_TEST_SIM_COMM_H
#define BX_TEST_SIM_COMM_H

#include <pthread.h>
#include <stdint.h>

#include "bitexact.h"

#define BXT_SIM_MAX_RANKS 8

typedef struct bxt_world {
  int n;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int arrived;
  unsigned gen;
  int timed_out;
  int64_t *slot[BXT_SIM_MAX_RANKS];
  size_t len[BXT_SIM_MAX_RANKS];
  bx_op op[BXT_SIM_MAX_RANKS];
  float *fslot[BXT_SIM_MAX_RANKS];
  int fail_rank; /* this rank's all-reduce reports failure (-1: none; n: all) */
} bxt_world;

typedef struct bxt_rank_ctx {
  bxt_world *w;
  int rank;
} bxt_rank_ctx;

/* n ranks (<= BXT_SIM_MAX_RANKS), none failing; bxt_world_free after. */
void bxt_world_init(bxt_world *w, int n);
void bxt_world_free(bxt_world *w);

/* The all-reduce of rank ctx->rank (ctx: a bxt_rank_ctx): every rank's
 * buffer replaced by the element-wise SUM/MAX over all ranks; non-zero when
 * the ranks disagree on n or op, on a timeout, or for w->fail_rank. */
int bxt_sim_allreduce(int64_t *buf, size_t n, bx_op op, void *ctx);

/* A float SUM all-reduce (bx_comm.allreduce_f32) that adds the ranks'
 * buffers in reverse rank order, ((x[n-1] + x[n-2]) + ...) + x[0]: a
 * transport's own order, not the rank order of the gather. */
int bxt_sim_allreduce_f32(float *buf, size_t n, void *ctx);

/* A communicator for rank r of w, through ctx (which must outlive it). */
bx_comm bxt_sim_comm(bxt_world *w, bxt_rank_ctx *ctx, int r);

#endif /* BX_TEST_SIM_COMM_H */
