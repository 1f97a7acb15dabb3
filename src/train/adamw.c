/*
 * adamw.c — bx_adamw_step: one torch.optim.AdamW step on fp32 tensors with
 * the roundings of torch's CPU kernels (bitexact_train.h states the
 * formula). The scalars are formed once per call in double as torch's
 * Python code forms them, then rounded to fp32 as torch's kernels take
 * their scalar arguments; the per-element update is a fixed sequence of
 * fp32 operations (src/cpu/adamw_body.h, run by the active ISA's table),
 * so the bits do not depend on threads or ISA (fmaf is one rounding
 * whether the CPU has an fma instruction or not).
 */
#include <math.h>
#include <stdint.h>

#include "abi.h"
#include "bitexact_train.h"
#include "call.h"
#include "error.h"
#include "kernels.h"
#include "pool.h"
#include "pow_det.h"
#include "tensor.h"
#include "train_check.h"
#include "train_device.h"
#include "train_elementwise.h"

typedef bx_adamw_scalars adamw_scalars; /* kernels.h */

typedef struct adamw_job {
  float *p, *m, *v;
  const float *g;
  size_t n;
  adamw_scalars s;
  bx_adamw_fn k; /* the active ISA's loop (kernels.h) */
} adamw_job;

static void adamw_piece(void *ctx, size_t task, int worker) {
  (void)worker;
  const adamw_job *j = ctx;
  size_t off = task * BX_EW_PIECE;
  size_t end = j->n - off < BX_EW_PIECE ? j->n : off + BX_EW_PIECE;
  j->k(j->p + off, j->g + off, j->m + off, j->v + off, end - off, &j->s);
}

static int finite_d(double x) { return x - x == 0.0; }

void bx_adamw_form_scalars(const bx_adamw_opts *o, int64_t step, bx_adamw_scalars *s) {
  /* the scalars, as torch's _single_tensor_adam forms them in Python
   * doubles (beta^t: bx_pow_det where torch has C's pow; both are
   * correctly rounded in practice — pow_det.h), then f32() as its kernels
   * take scalar arguments */
  double t = (double)step;
  double bc1 = 1.0 - bx_pow_det(o->beta1, t);
  double bc2 = 1.0 - bx_pow_det(o->beta2, t);
  double step_size = o->lr / bc1;
  double bc2_sqrt = sqrt(bc2); /* torch: bc2 ** 0.5, C's pow(bc2, 0.5) = sqrt */
  s->do_decay = o->weight_decay != 0.0;
  s->decay = (float)(1.0 - o->lr * o->weight_decay);
  s->w = (float)(1.0 - o->beta1);
  s->beta2 = (float)o->beta2;
  s->one_m_b2 = (float)(1.0 - o->beta2);
  s->bc2_sqrt = (float)bc2_sqrt;
  s->eps = (float)o->eps;
  s->neg_step = (float)(-step_size);
}

bx_status bx_adamw_step(DLTensor *param, const DLTensor *grad, DLTensor *exp_avg,
                        DLTensor *exp_avg_sq, int64_t step, const bx_adamw_opts *opts) {
  static const char *fn = "bx_adamw_step";
  bx_status st = opts ? bx_check_struct_size(fn, "opts->struct_size", opts->struct_size,
                                             sizeof(bx_adamw_opts), "bx_adamw_opts",
                                             "BX_ADAMW_OPTS_DEFAULT")
                      : BX_OK;
  if (st != BX_OK) return st;
  bx_adamw_opts o = BX_ADAMW_OPTS_DEFAULT;
  if (opts) o = *opts;
  bx_call c;
  st = bx_call_enter(&c, fn);
  if (st != BX_OK) return st;
  if (!(finite_d(o.lr) && o.lr >= 0))
    st = bx_fail(BX_EINVAL, "%s: lr %g is negative or not finite", fn, o.lr);
  else if (!(o.beta1 >= 0 && o.beta1 < 1))
    st = bx_fail(BX_EINVAL, "%s: beta1 %g is not in [0, 1)", fn, o.beta1);
  else if (!(o.beta2 >= 0 && o.beta2 < 1))
    st = bx_fail(BX_EINVAL, "%s: beta2 %g is not in [0, 1)", fn, o.beta2);
  else if (!(finite_d(o.eps) && o.eps >= 0))
    st = bx_fail(BX_EINVAL, "%s: eps %g is negative or not finite", fn, o.eps);
  else if (!(finite_d(o.weight_decay) && o.weight_decay >= 0))
    st = bx_fail(BX_EINVAL, "%s: weight_decay %g is negative or not finite", fn,
                 o.weight_decay);
  else if (o.num_threads < 0)
    st = bx_fail(BX_EINVAL, "%s: num_threads %d is negative", fn, o.num_threads);
  else if (step < 1)
    st = bx_fail(BX_EINVAL, "%s: step %lld is below 1 (the count after this step)", fn,
                 (long long)step);
  if (st != BX_OK) goto done;
  const DLTensor *ts[4] = {param, grad, exp_avg, exp_avg_sq};
  const int writable[4] = {1, 0, 1, 1};
  bx_span sp[4];
  const int cuda = bx_ew_all_cuda(ts, 4); /* kDLCUDA: the device's checks */
  /* managed memory (host-readable, checked as host memory) where it runs on the device */
  const bx_tc_place pl = bx_tc_place_of(ts, 4);
  st = bx_ew_check_in(fn, ts, 4, writable, 0, cuda, sp);
  if (st != BX_OK) goto done;

  adamw_job j;
  j.p = sp[0].data;
  j.g = sp[1].data;
  j.m = sp[2].data;
  j.v = sp[3].data;
  j.n = sp[0].n;
  bx_adamw_form_scalars(&o, step, &j.s);
  if (cuda || pl.cuda) {
    const bx_train_device *dev;
    st = bx_train_cuda(fn, &dev);
    if (st == BX_OK && j.n) st = dev->adamw(fn, pl.device, j.p, j.g, j.m, j.v, j.n, &j.s);
    goto done;
  }
  j.k = bx_math_kernels_active()->adamw;
  if (j.n)
    bx_parallel_run(bx_ew_threads(o.num_threads, j.n), (j.n + BX_EW_PIECE - 1) / BX_EW_PIECE,
                    adamw_piece, &j);
done:
  bx_call_leave(&c);
  return st;
}
