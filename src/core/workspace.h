/*
 * workspace.h — grow-only scratch memory of the calling thread, one frame
 * per nesting level of public calls (call.h), kept for the thread's life
 * and freed when it exits: a call allocates only when it needs more than
 * any earlier call of this thread at the same level.
 */
#ifndef BX_WORKSPACE_H
#define BX_WORKSPACE_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* bytes of scratch for the innermost call on this thread (level 0 outside
 * calls). NULL on allocation failure (the previous contents are then kept
 * and still valid). A later bx_workspace at the same level may move it. */
void *bx_workspace(size_t bytes);

#ifdef __cplusplus
}
#endif

#endif /* BX_WORKSPACE_H */
