/*
 * math.c — the elementwise tensor calls of bitexact_train.h (bx_exp,
 * bx_log, bx_sigmoid, bx_silu, bx_rsqrt, bx_sin, bx_cos) and their scalar
 * versions, over src/common/math_det.h (the tensor loops: the active ISA's
 * kernel table, kernels.h; every table gives the scalar bits). Every check
 * runs before the first write; the elements are split into fixed pieces
 * over the pool (each element's result depends on that element only, so
 * the thread count cannot change a bit).
 */
#include <stdint.h>
#include <string.h>

#include "abi.h"
#include "bitexact_train.h"
#include "call.h"
#include "error.h"
#include "fpenv.h"
#include "kernels.h"
#include "math_det.h"
#include "pool.h"
#include "tensor.h"
#include "train_check.h"
#include "train_device.h"
#include "train_elementwise.h"

#define PIECE BX_EW_PIECE /* elements per task */

/* ---- validation shared with adamw.c (train_elementwise.h) ----------------- */

/* Row-major strides for NULL; strides of size-1 dimensions do not matter. */
static int64_t stride_of(const DLTensor *t, int d) {
  if (t->strides) return t->strides[d];
  int64_t s = 1;
  for (int k = t->ndim - 1; k > d; k--) s *= t->shape[k];
  return s;
}

bx_status bx_ew_check(const char *fn, const DLTensor *const *ts, size_t count,
                      const int *writable, int allow_inplace, bx_span *spans) {
  return bx_ew_check_in(fn, ts, count, writable, allow_inplace, 0, spans);
}

int bx_ew_all_cuda(const DLTensor *const *ts, size_t count) {
  for (size_t i = 0; i < count; i++)
    if (!ts[i] || ts[i]->device.device_type != kDLCUDA) return 0;
  return count > 0;
}

bx_status bx_ew_check_in(const char *fn, const DLTensor *const *ts, size_t count,
                         const int *writable, int allow_inplace, int cuda, bx_span *spans) {
  for (size_t i = 0; i < count; i++) {
    bx_status st = cuda ? bx_tensor_span_cuda(ts[i], fn, BX_NO_GROUP, i, &spans[i])
                        : bx_tensor_span(ts[i], fn, BX_NO_GROUP, i, &spans[i]);
    if (st != BX_OK) return st;
    if (cuda && ts[i]->device.device_id != ts[0]->device.device_id)
      return bx_fail_at(BX_EDEVICE, -1, BX_NO_GROUP, i,
                        "%s: tensor %zu is on CUDA device %d, tensor 0 on device %d", fn, i,
                        (int)ts[i]->device.device_id, (int)ts[0]->device.device_id);
    if (spans[i].dtype != BX_DT_F32)
      return bx_fail_at(BX_EDTYPE, -1, BX_NO_GROUP, i, "%s: tensor %zu: dtype must be float32", fn,
                        i);
  }
  const DLTensor *a = ts[0];
  for (size_t i = 1; i < count; i++) {
    const DLTensor *b = ts[i];
    int same = a->ndim == b->ndim;
    for (int d = 0; same && d < a->ndim; d++) same = a->shape[d] == b->shape[d];
    if (!same)
      return bx_fail_at(BX_EINVAL, -1, BX_NO_GROUP, i,
                        "%s: tensor %zu: shape differs from tensor 0's", fn, i);
    for (int d = 0; d < a->ndim; d++)
      if (a->shape[d] > 1 && stride_of(a, d) != stride_of(b, d))
        return bx_fail_at(BX_ELAYOUT, -1, BX_NO_GROUP, i,
                          "%s: tensor %zu: strides differ from tensor 0's (dimension %d)", fn, i,
                          d);
  }
  /* overlap: a written tensor shares no byte with another tensor, except
   * itself exactly when allow_inplace (the same span: same shape and
   * strides were checked above) */
  for (size_t i = 0; i < count; i++) {
    if (!writable[i]) continue;
    const char *lo_i = spans[i].data;
    const char *hi_i = lo_i + spans[i].n * 4;
    for (size_t j = 0; j < count; j++) {
      if (j == i || spans[i].n == 0 || spans[j].n == 0) continue;
      const char *lo_j = spans[j].data;
      const char *hi_j = lo_j + spans[j].n * 4;
      if (lo_i < hi_j && lo_j < hi_i) {
        if (allow_inplace && lo_i == lo_j) continue;
        return bx_fail_at(BX_ELAYOUT, -1, BX_NO_GROUP, i,
                          "%s: tensor %zu overlaps tensor %zu%s", fn, i, j,
                          allow_inplace ? " (only exactly in place is allowed)" : "");
      }
    }
  }
  return BX_OK;
}

int bx_ew_threads(int num_threads, size_t n) {
  int t = num_threads > 0 ? num_threads : bx_default_threads();
  size_t pieces = (n + PIECE - 1) / PIECE;
  if (pieces < 1) pieces = 1;
  if ((size_t)t > pieces) t = (int)pieces;
  return t;
}

/* ---- the loops: the active ISA's kernel table (kernels.h) --------------------- */

typedef enum ew_op { EW_EXP, EW_LOG, EW_SIGMOID, EW_SILU, EW_RSQRT, EW_SIN, EW_COS } ew_op;

typedef void (*ew_loop)(const float *x, float *y, size_t n);

static ew_loop loop_of(ew_op op) {
  const bx_math_kernels *k = bx_math_kernels_active();
  switch (op) {
  case EW_EXP: return k->exp;
  case EW_LOG: return k->log;
  case EW_SIGMOID: return k->sigmoid;
  case EW_SILU: return k->silu;
  case EW_RSQRT: return k->rsqrt;
  case EW_SIN: return k->sin;
  default: return k->cos;
  }
}

typedef struct ew_job {
  const float *x;
  float *y;
  size_t n;
  ew_loop loop;
} ew_job;

static void run_piece(void *ctx, size_t task, int worker) {
  (void)worker;
  const ew_job *j = ctx;
  size_t off = task * PIECE;
  size_t len = j->n - off < PIECE ? j->n - off : PIECE;
  j->loop(j->x + off, j->y + off, len);
}

/* The device path (issue 30): every tensor kDLCUDA (cuda), or managed
 * memory where managed calls run on the device (pl->cuda); n elements of
 * x (fp32) into y (fp32, or bf16 for BX_TDEV_ROUND_BF16), checked. */
static bx_status ew_device(const char *fn, const bx_tc_place *pl, int op, const void *x, void *y,
                           size_t n) {
  const bx_train_device *dev;
  bx_status st = bx_train_cuda(fn, &dev);
  if (st == BX_OK && n) st = dev->math(fn, pl->device, op, x, y, n);
  return st;
}

/* The device op of a host op (the same order). */
static int device_op(ew_op op) {
  static const int ops[] = {BX_TDEV_EXP, BX_TDEV_LOG, BX_TDEV_SIGMOID, BX_TDEV_SILU,
                            BX_TDEV_RSQRT, BX_TDEV_SIN, BX_TDEV_COS};
  return ops[op];
}

static bx_status ew_run(const char *fn, ew_op op, const DLTensor *x, DLTensor *y,
                        const bx_math_opts *opts) {
  bx_status st = opts ? bx_check_struct_size(fn, "opts->struct_size", opts->struct_size,
                                             sizeof(bx_math_opts), "bx_math_opts",
                                             "BX_MATH_OPTS_DEFAULT")
                      : BX_OK;
  if (st != BX_OK) return st;
  bx_math_opts o = BX_MATH_OPTS_DEFAULT;
  if (opts) o = *opts;
  bx_call c;
  st = bx_call_enter(&c, fn);
  if (st != BX_OK) return st;
  if (o.num_threads < 0) {
    st = bx_fail(BX_EINVAL, "%s: num_threads %d is negative", fn, o.num_threads);
    goto done;
  }
  const DLTensor *ts[2] = {x, y};
  const int writable[2] = {0, 1};
  bx_span sp[2];
  const int cuda = bx_ew_all_cuda(ts, 2); /* kDLCUDA: the device's checks */
  /* managed memory (host-readable, checked as host memory) where it runs on the device */
  const bx_tc_place pl = bx_tc_place_of(ts, 2);
  st = bx_ew_check_in(fn, ts, 2, writable, 1, cuda, sp);
  if (st != BX_OK) goto done;
  if (cuda || pl.cuda) {
    st = ew_device(fn, &pl, device_op(op), sp[0].data, sp[1].data, sp[0].n);
    goto done;
  }
  ew_job j = {sp[0].data, sp[1].data, sp[0].n, loop_of(op)};
  if (j.n) bx_parallel_run(bx_ew_threads(o.num_threads, j.n), (j.n + PIECE - 1) / PIECE,
                           run_piece, &j);
done:
  bx_call_leave(&c);
  return st;
}

bx_status bx_exp(const DLTensor *x, DLTensor *y, const bx_math_opts *opts) {
  return ew_run("bx_exp", EW_EXP, x, y, opts);
}
bx_status bx_log(const DLTensor *x, DLTensor *y, const bx_math_opts *opts) {
  return ew_run("bx_log", EW_LOG, x, y, opts);
}
bx_status bx_sigmoid(const DLTensor *x, DLTensor *y, const bx_math_opts *opts) {
  return ew_run("bx_sigmoid", EW_SIGMOID, x, y, opts);
}
bx_status bx_silu(const DLTensor *x, DLTensor *y, const bx_math_opts *opts) {
  return ew_run("bx_silu", EW_SILU, x, y, opts);
}
bx_status bx_rsqrt(const DLTensor *x, DLTensor *y, const bx_math_opts *opts) {
  return ew_run("bx_rsqrt", EW_RSQRT, x, y, opts);
}
bx_status bx_sin(const DLTensor *x, DLTensor *y, const bx_math_opts *opts) {
  return ew_run("bx_sin", EW_SIN, x, y, opts);
}
bx_status bx_cos(const DLTensor *x, DLTensor *y, const bx_math_opts *opts) {
  return ew_run("bx_cos", EW_COS, x, y, opts);
}

/* ---- fp32 -> bf16 (bx_round_bf16) ------------------------------------------ */

typedef struct bf_job {
  const float *x;
  uint16_t *y;
  size_t n;
  bx_bf16_round_fn loop;
} bf_job;

static void bf_piece(void *ctx, size_t task, int worker) {
  (void)worker;
  const bf_job *j = ctx;
  size_t off = task * PIECE;
  size_t len = j->n - off < PIECE ? j->n - off : PIECE;
  j->loop(j->x + off, j->y + off, len);
}

static bx_status rowmajor(const char *fn, const DLTensor *t, size_t i) {
  if (!t->strides) return BX_OK;
  int64_t want = 1;
  for (int d = t->ndim - 1; d >= 0; d--) {
    if (t->shape[d] != 1 && t->strides[d] != want)
      return bx_fail_at(BX_ELAYOUT, -1, BX_NO_GROUP, i,
                        "%s: tensor %zu: not dense row-major (stride %lld in dimension %d, %lld "
                        "expected)", fn, i, (long long)t->strides[d], d, (long long)want);
    want *= t->shape[d];
  }
  return BX_OK;
}

bx_status bx_round_bf16(const DLTensor *x, DLTensor *y, const bx_math_opts *opts) {
  static const char *fn = "bx_round_bf16";
  bx_status st = opts ? bx_check_struct_size(fn, "opts->struct_size", opts->struct_size,
                                             sizeof(bx_math_opts), "bx_math_opts",
                                             "BX_MATH_OPTS_DEFAULT")
                      : BX_OK;
  if (st != BX_OK) return st;
  bx_math_opts o = BX_MATH_OPTS_DEFAULT;
  if (opts) o = *opts;
  bx_call c;
  st = bx_call_enter(&c, fn);
  if (st != BX_OK) return st;
  bx_span sx, sy;
  const DLTensor *ts[2] = {x, y};
  const int cuda = bx_ew_all_cuda(ts, 2); /* kDLCUDA: the device's checks */
  const bx_tc_place pl = bx_tc_place_of(ts, 2); /* managed: on the device where it runs there */
  if (o.num_threads < 0) st = bx_fail(BX_EINVAL, "%s: num_threads %d is negative", fn, o.num_threads);
  if (st == BX_OK)
    st = cuda ? bx_tensor_span_cuda(x, fn, BX_NO_GROUP, 0, &sx)
              : bx_tensor_span(x, fn, BX_NO_GROUP, 0, &sx);
  if (st == BX_OK)
    st = cuda ? bx_tensor_span_cuda(y, fn, BX_NO_GROUP, 1, &sy)
              : bx_tensor_span(y, fn, BX_NO_GROUP, 1, &sy);
  if (st == BX_OK && cuda && y->device.device_id != x->device.device_id)
    st = bx_fail_at(BX_EDEVICE, -1, BX_NO_GROUP, 1,
                    "%s: tensor 1 is on CUDA device %d, tensor 0 on device %d", fn,
                    (int)y->device.device_id, (int)x->device.device_id);
  if (st == BX_OK && sx.dtype != BX_DT_F32)
    st = bx_fail_at(BX_EDTYPE, -1, BX_NO_GROUP, 0, "%s: tensor 0: dtype must be float32", fn);
  if (st == BX_OK && sy.dtype != BX_DT_BF16)
    st = bx_fail_at(BX_EDTYPE, -1, BX_NO_GROUP, 1, "%s: tensor 1: dtype must be bfloat16", fn);
  if (st == BX_OK) {
    int same = x->ndim == y->ndim;
    for (int d = 0; same && d < x->ndim; d++) same = x->shape[d] == y->shape[d];
    if (!same) st = bx_fail_at(BX_EINVAL, -1, BX_NO_GROUP, 1, "%s: tensor 1: shape differs from tensor 0's", fn);
  }
  if (st == BX_OK) st = rowmajor(fn, x, 0);
  if (st == BX_OK) st = rowmajor(fn, y, 1);
  if (st == BX_OK && sx.n && sy.n) {
    const char *a0 = sx.data, *a1 = a0 + sx.n * 4, *b0 = sy.data, *b1 = b0 + sy.n * 2;
    if (a0 < b1 && b0 < a1)
      st = bx_fail_at(BX_ELAYOUT, -1, BX_NO_GROUP, 1, "%s: tensor 1 overlaps tensor 0", fn);
  }
  if (st == BX_OK && (cuda || pl.cuda)) {
    st = ew_device(fn, &pl, BX_TDEV_ROUND_BF16, sx.data, sy.data, sx.n);
  } else if (st == BX_OK && sx.n) {
    bf_job j = {sx.data, sy.data, sx.n, bx_math_kernels_active()->bf16_round};
    bx_parallel_run(bx_ew_threads(o.num_threads, j.n), (j.n + PIECE - 1) / PIECE, bf_piece, &j);
  }
  bx_call_leave(&c);
  return st;
}

/* ---- scalar versions: the library's floating-point environment around one
 * evaluation (no nesting level needed: nothing here calls back) ------------ */
#define EW_SCALAR(name, f)       \
  float name(float x) {          \
    bx_fpenv saved;              \
    bx_fpenv_enter(&saved);      \
    float r = f(x);              \
    bx_fpenv_leave(&saved);      \
    return r;                    \
  }
EW_SCALAR(bx_exp_f32, bx_expf_det)
EW_SCALAR(bx_log_f32, bx_logf_det)
EW_SCALAR(bx_sigmoid_f32, bx_sigmoidf_det)
EW_SCALAR(bx_silu_f32, bx_siluf_det)
EW_SCALAR(bx_rsqrt_f32, bx_rsqrtf_det)
EW_SCALAR(bx_sin_f32, bx_sinf_det)
EW_SCALAR(bx_cos_f32, bx_cosf_det)
#undef EW_SCALAR
