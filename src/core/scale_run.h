/*
 * scale_run.h — pieces of tensors, the drivers' unit of work (norm.c cuts
 * them for the reduction, scale.c for the scaling; a clip scales the
 * pieces its norm cut), and the host scaling driver.
 */
#ifndef BX_SCALE_RUN_H
#define BX_SCALE_RUN_H

#include <stddef.h>

#include "bitexact.h"
#include "dtype.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct bx_piece {
  void *data;   /* first element */
  size_t n;     /* elements */
  bx_dtype dt;
  size_t group; /* the group (norms) */
} bx_piece;

/* Scale every piece (host memory, validated: writable, no shared bytes)
 * by coef with o's rounding, on o->num_threads workers. Cannot fail. */
bx_status bx_scale_pieces(const bx_piece *pieces, size_t npieces, double coef,
                          const bx_scale_opts *o);

#ifdef __cplusplus
}
#endif

#endif /* BX_SCALE_RUN_H */
