/*
 * verified.h — when the block drivers run verified windows (exact_grid.h,
 * VERIFIED WINDOWS: fp32 and fp64 on ISAs that suppress exceptions per
 * instruction), shared by drive_f32.c and drive_f64.c. It decides only
 * speed: every verified block is proven exact or redone checked.
 *
 * Blocks start checked. After `need` checked blocks in a row that the
 * verified window could have taken ("plain": finite, inside one window),
 * the driver switches to verified windows: groups of BX_V_GROUP blocks
 * when calm (one read of the inexact flag per group), one at a time after
 * a failure, so rare spikes or NaNs cost one block each, not a group. A
 * failed block is redone checked and costs BX_V_DEBT of debt that good
 * blocks repay one each; more than BX_V_DEBT_MAX (spiky or wide data)
 * goes back to checked blocks and doubles `need` (a good group resets it),
 * so data whose pass 1 says they do not fit rarely try.
 */
#ifndef BX_VERIFIED_H
#define BX_VERIFIED_H

#include <stddef.h>

#define BX_V_GROUP 4       /* verified blocks per read of the flags, when calm */
#define BX_V_CALM 16       /* good blocks since the last failure that make it calm */
#define BX_V_DEBT 8        /* a failed block costs this much debt, a good one repays 1 */
#define BX_V_DEBT_MAX 32   /* more debt: back to checked blocks */
#define BX_V_STREAK_MAX 16 /* most plain checked blocks asked for before a retry */

typedef struct bx_vrun {
  int on;     /* the next full blocks are verified */
  int streak; /* plain checked blocks in a row */
  int need;   /* streak that starts a try */
  int calm;   /* good blocks since the last failure */
  int debt;
} bx_vrun;

static inline void bx_vrun_init(bx_vrun *v) {
  v->on = v->streak = v->calm = v->debt = 0;
  v->need = 2;
}

/* A checked block, plain or not: 1 if the verified windows start after
 * it (then the caller clears the flags its checked windows raised). */
static inline int bx_vrun_checked(bx_vrun *v, int plain, int can) {
  v->streak = plain ? v->streak + 1 : 0;
  if (!can || v->streak < v->need) return 0;
  v->on = 1;
  v->debt = BX_V_DEBT_MAX - BX_V_DEBT + 1; /* a failure before any success ends the try */
  return 1;
}

/* Blocks in the next group, given the full blocks left. */
static inline int bx_vrun_group(const bx_vrun *v, size_t blocks_left) {
  return v->calm >= BX_V_CALM && blocks_left >= BX_V_GROUP ? BX_V_GROUP : 1;
}

static inline void bx_vrun_good(bx_vrun *v) {
  v->calm++;
  v->debt -= v->debt > 0;
}

static inline void bx_vrun_bad(bx_vrun *v) {
  v->calm = 0;
  v->debt += BX_V_DEBT;
}

/* After a group: back to checked blocks on too much debt (or when the
 * driver says the data turned wide). Returns 1 if the windows stay on. */
static inline int bx_vrun_group_done(bx_vrun *v, int failed, int give_up) {
  if (v->debt > BX_V_DEBT_MAX || give_up) {
    v->on = v->streak = v->debt = 0;
    v->need = v->need * 2 > BX_V_STREAK_MAX ? BX_V_STREAK_MAX : v->need * 2;
    return 0;
  }
  if (!failed) v->need = 2;
  return 1;
}

#endif /* BX_VERIFIED_H */
