/*
 * call.c — entering and leaving a public call (call.h): the library's
 * floating-point environment on the calling thread and the nesting level
 * that gives a re-entrant call its own scratch memory.
 */
#include "call.h"

#include "error.h"

static _Thread_local int depth;
static _Thread_local bx_fpenv saved[BX_MAX_NESTING]; /* the environment each level found */

bx_status bx_call_enter(bx_call *c, const char *fn) {
  c->entered = 0;
  if (depth >= BX_MAX_NESTING)
    return bx_fail(BX_EINVAL,
                   "%s: called from inside %d nested bitexact calls on this thread (a "
                   "communicator callback that calls bitexact, whose callback calls it "
                   "again, ...); at most %d levels are allowed",
                   fn, depth, BX_MAX_NESTING);
  bx_fpenv_enter(&saved[depth]);
  depth++;
  c->entered = 1;
  return BX_OK;
}

void bx_call_leave(bx_call *c) {
  if (!c->entered) return;
  c->entered = 0;
  depth--;
  bx_fpenv_leave(&saved[depth]);
}

void bx_call_user_begin(void) {
  if (depth > 0) bx_fpenv_leave(&saved[depth - 1]);
}

void bx_call_user_end(void) {
  if (depth > 0) bx_fpenv_enter(&saved[depth - 1]); /* what the callback left is given back */
}

int bx_call_depth(void) { return depth; }
