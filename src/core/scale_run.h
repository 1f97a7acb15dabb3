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

struct bx_layout;

/* A piece: n elements of one tensor. lay == NULL: the contiguous elements
 * data[0..n) (a dense tensor, read in place: the fast path); else logical
 * elements [first, first + n) of the strided layout lay (tensor.h), which
 * the drivers read in place run by run when its runs are long, else
 * gather into a small buffer for the same kernels (and, scaling, scatter
 * back). */
typedef struct bx_piece {
  void *data;   /* first element (lay == NULL) */
  size_t n;     /* elements */
  bx_dtype dt;
  size_t group; /* the group (norms) */
  const struct bx_layout *lay;
  size_t first;
} bx_piece;

#define BX_GATHER 2048 /* elements per gathered kernel call */
#define BX_DIRECT 256  /* runs of at least this many elements are used in place */

/* Scale every piece (host memory, validated by bx_check_writable:
 * writable, every logical element once, no shared bytes)
 * by coef with o's rounding, on o->num_threads workers. Cannot fail. */
bx_status bx_scale_pieces(const bx_piece *pieces, size_t npieces, double coef,
                          const bx_scale_opts *o);

#ifdef __cplusplus
}
#endif

#endif /* BX_SCALE_RUN_H */
