/*
 * workspace.c — per-thread, per-nesting-level grow-only scratch memory
 * (workspace.h), freed by a thread-exit destructor so that programs
 * starting many threads do not leak.
 */
#include <pthread.h>
#include <stdlib.h>

#include "call.h"
#include "workspace.h"

typedef struct frame {
  void *p;
  size_t cap;
} frame;

typedef struct frames {
  frame f[BX_MAX_NESTING + 1];
} frames;

static pthread_key_t key;
static pthread_once_t once = PTHREAD_ONCE_INIT;
static int key_ok;

static void frames_free(void *v) {
  frames *fs = v;
  for (int i = 0; i <= BX_MAX_NESTING; i++) free(fs->f[i].p);
  free(fs);
}

static void key_init(void) { key_ok = pthread_key_create(&key, frames_free) == 0; }

void *bx_workspace(size_t bytes) {
  pthread_once(&once, key_init);
  if (!key_ok) return NULL;
  frames *fs = pthread_getspecific(key);
  if (!fs) {
    fs = calloc(1, sizeof *fs);
    if (!fs || pthread_setspecific(key, fs) != 0) {
      free(fs);
      return NULL;
    }
  }
  int level = bx_call_depth();
  frame *w = &fs->f[level > BX_MAX_NESTING ? BX_MAX_NESTING : level];
  if (bytes > w->cap || !w->p) {
    void *q = realloc(w->p, bytes ? bytes : 1);
    if (!q) return NULL;
    w->p = q;
    w->cap = bytes ? bytes : 1;
  }
  return w->p;
}
