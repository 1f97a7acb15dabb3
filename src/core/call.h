/*
 * call.h — entering and leaving a public call on the calling thread: the
 * library's floating-point environment (fpenv.h) and a nesting level of
 * its own, so a call made from a communicator callback of another call
 * (re-entry) gets its own scratch memory (workspace.h) and the outer
 * call's state is left alone.
 *
 *   bx_call c;
 *   bx_status st = bx_call_enter(&c, fn);   // BX_EINVAL past BX_MAX_NESTING
 *   if (st != BX_OK) return st;             // nothing entered
 *   ... the call ...
 *   bx_call_leave(&c);                      // the caller's environment back
 *
 * Between bx_call_user_begin() and bx_call_user_end() (around a user
 * callback) the caller's environment is in force.
 */
#ifndef BX_CALL_H
#define BX_CALL_H

#include "bitexact.h"
#include "fpenv.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct bx_call {
  int entered;
} bx_call;

bx_status bx_call_enter(bx_call *c, const char *fn);
void bx_call_leave(bx_call *c);

/* Around a callback into user code (a communicator's all-reduce) inside a
 * call: the caller's floating-point environment, and afterwards the
 * library's again (what the callback left becomes what the call gives
 * back). No-ops outside a call. */
void bx_call_user_begin(void);
void bx_call_user_end(void);

/* Nesting level of the innermost call on this thread (0 outside calls). */
int bx_call_depth(void);

#ifdef __cplusplus
}
#endif

#endif /* BX_CALL_H */
