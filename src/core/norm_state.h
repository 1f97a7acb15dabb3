/*
 * norm_state.h — a group's partial result on the host (what the CPU
 * kernels and the device backend fill, and what goes on the wire), and the
 * norm driver's entry points shared by norm.c and scale.c.
 */
#ifndef BX_NORM_STATE_H
#define BX_NORM_STATE_H

#include <stddef.h>
#include <stdint.h>

#include "bitexact.h"
#include "dtype.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct bx_partial {
  bx_acc acc;
  double maxabs, minabs;
  int64_t nan, nonzero;
  int64_t pending; /* deposit budget used since the last normalisation */
} bx_partial;

void bx_partial_init(bx_partial *q);

/* Check norm options (p, flavor, threads, norm_dtype) and pick the
 * reduction mode. */
bx_status bx_check_norm_opts(const char *fn, const bx_norm_opts *o, bx_mode *m);

/* Check a clip's options besides max_norm and the norm options: eps,
 * formula, scale mode and threads (bx_clip_grad_norm, CUDA plans). */
bx_status bx_check_clip_opts(const char *fn, const bx_clip_opts *o);

/* What a collective call adds to the norm: the clip's agreement items and
 * its scaling (run by the driver after the norm, with every byte it needs
 * reserved before the first collective). NULL for a plain norm. */
typedef struct bx_clip_step {
  double max_norm;
  const bx_clip_opts *opts;
  double coef; /* out: the coefficient used */
} bx_clip_step;

/* bx_total_norm, and bx_clip_grad_norm with clip != NULL; fn names the
 * public function in messages. prior != BX_OK: this rank has already
 * failed its own checks: it only joins the agreement step (so that every
 * rank fails) and returns prior. */
bx_status bx_norm_run(const char *fn, const bx_group *groups, size_t ngroups,
                      const bx_comm *comm, const bx_norm_opts *opts, bx_clip_step *clip,
                      bx_status prior, double *total_norm, double *group_norms,
                      bx_norm_dtype *norm_dtype);

#ifdef __cplusplus
}
#endif

#endif /* BX_NORM_STATE_H */
