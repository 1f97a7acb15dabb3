/*
 * sim_comm.c — ranks simulated by threads: the communicator of sim_comm.h.
 */
#include "sim_comm.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* A generation barrier that gives up after 5 s (a rank that never comes is
 * a hang in the library: report it instead of waiting forever). */
static int barrier(bxt_world *w) {
  pthread_mutex_lock(&w->mu);
  unsigned g = w->gen;
  if (++w->arrived == w->n) {
    w->arrived = 0;
    w->gen++;
    pthread_cond_broadcast(&w->cv);
  } else {
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 5;
    while (g == w->gen && !w->timed_out)
      if (pthread_cond_timedwait(&w->cv, &w->mu, &until) == ETIMEDOUT) {
        w->timed_out = 1;
        pthread_cond_broadcast(&w->cv);
      }
  }
  int bad = w->timed_out;
  pthread_mutex_unlock(&w->mu);
  return bad;
}

int bxt_sim_allreduce(int64_t *buf, size_t n, bx_op op, void *ctx) {
  bxt_rank_ctx *c = ctx;
  bxt_world *w = c->w;
  w->slot[c->rank] = buf;
  w->len[c->rank] = n;
  w->op[c->rank] = op;
  if (barrier(w)) return 1;
  int agree = 1;
  for (int r = 0; r < w->n; r++) agree &= w->len[r] == n && w->op[r] == op;
  int64_t *tmp = NULL;
  if (agree) {
    tmp = malloc(n * sizeof *tmp + 1);
    for (size_t i = 0; i < n; i++) {
      int64_t v = w->slot[0][i];
      for (int r = 1; r < w->n; r++)
        v = op == BX_OP_SUM ? v + w->slot[r][i] : (w->slot[r][i] > v ? w->slot[r][i] : v);
      tmp[i] = v;
    }
  }
  if (barrier(w)) { /* everyone has read every slot before anyone writes */
    free(tmp);
    return 1;
  }
  if (tmp) memcpy(buf, tmp, n * sizeof *tmp);
  free(tmp);
  if (w->fail_rank == c->rank || w->fail_rank == w->n) return 1;
  return agree ? 0 : 1;
}

int bxt_sim_allreduce_f32(float *buf, size_t n, void *ctx) {
  bxt_rank_ctx *c = ctx;
  bxt_world *w = c->w;
  w->fslot[c->rank] = buf;
  w->len[c->rank] = n;
  if (barrier(w)) return 1;
  int agree = 1;
  for (int r = 0; r < w->n; r++) agree &= w->len[r] == n;
  float *tmp = NULL;
  if (agree) {
    tmp = malloc(n * sizeof *tmp + 1);
    for (size_t i = 0; i < n; i++) {
      float v = w->fslot[w->n - 1][i];
      for (int r = w->n - 2; r >= 0; r--) v += w->fslot[r][i];
      tmp[i] = v;
    }
  }
  if (barrier(w)) {
    free(tmp);
    return 1;
  }
  if (tmp) memcpy(buf, tmp, n * sizeof *tmp);
  free(tmp);
  if (w->fail_rank == c->rank || w->fail_rank == w->n) return 1;
  return agree ? 0 : 1;
}

void bxt_world_init(bxt_world *w, int n) {
  memset(w, 0, sizeof *w);
  w->n = n;
  w->fail_rank = -1;
  pthread_mutex_init(&w->mu, NULL);
  pthread_cond_init(&w->cv, NULL);
}

void bxt_world_free(bxt_world *w) {
  pthread_mutex_destroy(&w->mu);
  pthread_cond_destroy(&w->cv);
}

bx_comm bxt_sim_comm(bxt_world *w, bxt_rank_ctx *ctx, int r) {
  ctx->w = w;
  ctx->rank = r;
  bx_comm c = BX_COMM_DEFAULT;
  c.allreduce_i64 = bxt_sim_allreduce;
  c.ctx = ctx;
  c.rank = r;
  return c;
}
