/*
 * scale.c — bx_scale (multi-tensor g *= coef with a documented rounding),
 * bx_clip_coef and bx_clip_grad_norm (whose norm, agreement and scaling the
 * norm driver runs: norm.c). Every check runs before the first write, so a
 * failing call leaves all gradients as they were.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "abi.h"
#include "backend.h"
#include "call.h"
#include "error.h"
#include "kernels.h"
#include "norm_finish.h"
#include "norm_state.h"
#include "pool.h"
#include "scale_run.h"
#include "tensor.h"
#include "workspace.h"

#define PIECE ((size_t)1 << 16) /* elements per scaling piece */

typedef struct scale_job {
  const bx_piece *pieces;
  double coef;
  bx_scale_mode mode;
  const bx_scale_kernels *k;
} scale_job;

/* A strided piece run by run (long runs) or gathered, scaled by the same
 * kernel and scattered back (the kernels are elementwise: the bits are
 * those of scaling a dense copy). The layout's logical elements are
 * distinct (bx_check_writable), so each is written once and the bytes
 * between them are not touched. Not inlined: the dense path keeps its
 * small frame. */
static __attribute__((noinline)) void scale_strided(const bx_piece *it, bx_scale_fn f,
                                                    double coef) {
  bx_layout_cursor c, back;
  bx_layout_seek(&c, it->lay, it->first);
  if (it->lay->inner >= BX_DIRECT) {
    for (size_t done = 0, k; done < it->n; done += k) {
      char *at = bx_layout_run(&c, it->n - done, &k);
      f(at, k, coef);
    }
    return;
  }
  uint64_t buf[BX_GATHER];
  for (size_t done = 0, k; done < it->n; done += k) {
    k = it->n - done < BX_GATHER ? it->n - done : BX_GATHER;
    back = c;
    bx_layout_copy(&c, k, buf, 0);
    f(buf, k, coef);
    bx_layout_copy(&back, k, buf, 1);
  }
}

static void run_scale(void *ctx, size_t t, int worker) {
  (void)worker;
  const scale_job *j = ctx;
  const bx_piece *it = &j->pieces[t];
  bx_scale_fn f = j->mode == BX_SCALE_EXACT ? j->k->exact[it->dt] : j->k->torch[it->dt];
  if (!it->lay) f(it->data, it->n, j->coef);
  else scale_strided(it, f, j->coef);
}

bx_status bx_scale_pieces(const bx_piece *pieces, size_t npieces, double coef,
                          const bx_scale_opts *o) {
  size_t total = 0;
  for (size_t i = 0; i < npieces; i++) total += pieces[i].n;
  int nthreads = o->num_threads > 0 ? o->num_threads : bx_default_threads();
  if ((size_t)nthreads > total / PIECE + 1) nthreads = (int)(total / PIECE + 1);
  scale_job j = {pieces, coef, o->mode, bx_scale_kernels_active()};
  bx_parallel_run(nthreads, npieces, run_scale, &j);
  return BX_OK;
}

static bx_status check_scale_opts(const char *fn, const bx_scale_opts *o) {
  if (o->mode != BX_SCALE_TORCH && o->mode != BX_SCALE_EXACT)
    return bx_fail(BX_EINVAL, "%s: unknown scale mode %d", fn, o->mode);
  if (o->num_threads < 0)
    return bx_fail(BX_EINVAL, "%s: num_threads %d is negative", fn, o->num_threads);
  return BX_OK;
}

/* The pieces of flat[0..count) (validated) in the workspace, followed by
 * the layouts of the strided tensors (their pieces point there). */
static bx_status flat_pieces(const char *fn, DLTensor *tensors, size_t count, bx_piece **out,
                             size_t *nout) {
  size_t n = 0, nlays = 0;
  for (size_t i = 0; i < count; i++) {
    bx_layout s;
    bx_tensor_layout(&tensors[i], fn, BX_NO_GROUP, i, &s);
    n += (s.n + PIECE - 1) / PIECE;
    nlays += s.ndims > 0;
  }
  size_t b_pieces = (n ? n : 1) * sizeof(bx_piece);
  bx_piece *p = bx_workspace(b_pieces + nlays * sizeof(bx_layout));
  if (!p) return bx_fail(BX_ENOMEM, "%s: cannot allocate workspace for %zu pieces", fn, n);
  bx_layout *lays = (bx_layout *)((char *)p + b_pieces);
  size_t k = 0, nl = 0;
  for (size_t i = 0; i < count; i++) {
    bx_layout s;
    bx_tensor_layout(&tensors[i], fn, BX_NO_GROUP, i, &s);
    size_t es = bx_dtype_size(s.dtype);
    const bx_layout *lay = NULL;
    if (s.ndims > 0) {
      lays[nl] = s;
      lay = &lays[nl++];
    }
    for (size_t off = 0; off < s.n; off += PIECE, k++) {
      p[k].data = lay ? NULL : s.base + off * es;
      p[k].n = s.n - off < PIECE ? s.n - off : PIECE;
      p[k].dt = s.dtype;
      p[k].group = 0;
      p[k].lay = lay;
      p[k].first = off;
    }
  }
  *out = p;
  *nout = k;
  return BX_OK;
}

static bx_status scale_impl(const char *fn, DLTensor *tensors, size_t count, double coef,
                            const bx_scale_opts *opts) {
  bx_scale_opts o = BX_SCALE_OPTS_DEFAULT;
  if (opts) o = *opts;
  bx_status st = check_scale_opts(fn, &o);
  if (st != BX_OK) return st;
  if (coef != coef) return bx_fail(BX_EINVAL, "%s: coef is NaN", fn);
  bx_where where;
  st = bx_tensors_where(fn, NULL, 0, tensors, count, &where);
  if (st == BX_OK) st = bx_check_writable(fn, tensors, count, NULL, 0, where == BX_ON_CUDA);
  if (st != BX_OK) return st;
  if (where == BX_ON_CUDA) {
    const bx_device_backend *be = bx_backend_cuda();
    if (!be)
      return bx_fail(BX_EDEVICE, "%s: CUDA tensors, but this build of bitexact has no CUDA "
                     "backend (built without nvcc, or CUDA=0)", fn);
    bx_device_prep prep = {NULL, 0, tensors, count, 0, BX_M_SQ, 2.0, 1, 0, -1};
    bx_device_call *dev;
    st = be->prepare(fn, &prep, &dev);
    if (st != BX_OK) return st;
    st = be->scale(dev, coef, &o);
    be->release(dev);
    return st;
  }
  bx_piece *pieces = NULL;
  size_t npieces = 0;
  st = flat_pieces(fn, tensors, count, &pieces, &npieces);
  if (st != BX_OK) return st;
  return bx_scale_pieces(pieces, npieces, coef, &o);
}

bx_status bx_scale(DLTensor *tensors, size_t count, double coef, const bx_scale_opts *opts) {
  static const char *fn = "bx_scale";
  bx_status st = bx_check_scale_opts_size(fn, opts); /* before anything else */
  if (st != BX_OK) return st;
  bx_call c;
  st = bx_call_enter(&c, fn);
  if (st != BX_OK) return st;
  st = scale_impl(fn, tensors, count, coef, opts);
  bx_call_leave(&c);
  return st;
}

/* ---- clipping ---------------------------------------------------------- */

bx_status bx_check_clip_opts(const char *fn, const bx_clip_opts *o) {
  if (!(o->eps >= 0)) return bx_fail(BX_EINVAL, "%s: eps %g is negative or NaN", fn, o->eps);
  if (o->formula != BX_COEF_TORCH && o->formula != BX_COEF_MAX)
    return bx_fail(BX_EINVAL, "%s: unknown formula %d", fn, o->formula);
  return check_scale_opts(fn, &o->scale);
}

static bx_status check_clip(const char *fn, double max_norm, const bx_clip_opts *o) {
  if (!(max_norm >= 0)) return bx_fail(BX_EINVAL, "%s: max_norm %g is negative or NaN", fn, max_norm);
  return bx_check_clip_opts(fn, o);
}

bx_status bx_clip_coef(double total_norm, double max_norm, const bx_clip_opts *opts,
                       double *coef) {
  static const char *fn = "bx_clip_coef";
  bx_status st = bx_check_clip_opts_size(fn, opts); /* before anything else */
  if (st != BX_OK) return st;
  bx_clip_opts o = BX_CLIP_OPTS_DEFAULT;
  if (opts) o = *opts;
  bx_call c;
  st = bx_call_enter(&c, fn);
  if (st != BX_OK) return st;
  if (!coef) st = bx_fail(BX_EINVAL, "%s: coef is NULL", fn);
  else st = check_clip(fn, max_norm, &o);
  if (st == BX_OK) *coef = bx_clip_coef_of(total_norm, max_norm, o.eps, (int)o.formula);
  bx_call_leave(&c);
  return st;
}

bx_status bx_clip_grad_norm(const bx_group *groups, size_t ngroups, const bx_comm *comm,
                            double max_norm, const bx_clip_opts *opts, double *total_norm,
                            double *coef) {
  static const char *fn = "bx_clip_grad_norm";
  /* struct sizes before anything else; a comm of another layout is never
   * called (abi.h) */
  bx_status st = bx_check_comm_size(fn, comm);
  if (st != BX_OK) return st;
  bx_status sizes = bx_check_clip_opts_size(fn, opts);
  if (sizes != BX_OK && !comm) return sizes;
  bx_clip_opts o = BX_CLIP_OPTS_DEFAULT;
  if (opts && sizes == BX_OK) o = *opts;
  bx_call c;
  st = bx_call_enter(&c, fn);
  if (st != BX_OK) return st;
  /* Local checks. With a communicator a failure here (options of another
   * layout included) still goes through the agreement step (prior !=
   * BX_OK), so the other ranks fail too instead of waiting in the
   * collective. */
  st = sizes != BX_OK ? sizes : check_clip(fn, max_norm, &o);
  if (st != BX_OK && !comm) {
    bx_call_leave(&c);
    return st;
  }
  bx_clip_step clip = {max_norm, &o, 1.0};
  double norm = 0.0;
  st = bx_norm_run(fn, groups, ngroups, comm, &o.norm, &clip, st, total_norm ? &norm : NULL,
                   NULL, NULL);
  if (st == BX_OK) {
    *total_norm = norm;
    if (coef) *coef = clip.coef;
  }
  bx_call_leave(&c);
  return st;
}
