/*
 * swiglu.c — bx_swiglu_forward(_fused) / bx_swiglu_backward(_fused)
 * (bitexact_train.h, "Layers"): SiLU(gate) * up and its gradients in torch
 * eager's order with bitexact's correctly rounded SiLU and sigmoid. Each
 * output element depends on the same element of the inputs only; threads
 * take whole rows, so the bits depend on nothing else. The two-tensor and
 * the fused ([T, 2F]: gate then up) forms share one row loop, given the
 * row strides of each operand.
 */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "abi.h"
#include "bitexact_train.h"
#include "call.h"
#include "error.h"
#include "kernels.h"
#include "swiglu_hd.h"
#include "train_check.h"
#include "train_device.h"
#include "pool.h"

/* Elements per call of the vector math kernels (a stack buffer). */
#define SWIGLU_BLOCK 256

typedef struct swiglu_job {
  const float *g, *u, *dh;
  float *h, *dg, *du;
  size_t ldg, ldu, ldh, lddg, lddu; /* row strides, in elements */
  size_t rows, f, piece;
} swiglu_job;

static void fwd_piece(void *ctx, size_t task, int worker) {
  (void)worker;
  const swiglu_job *j = ctx;
  size_t r0 = task * j->piece, r1 = j->rows - r0 < j->piece ? j->rows : r0 + j->piece;
  const bx_math_kernels *mk = bx_math_kernels_active(); /* the scalar bits, vectorised */
  float sl[SWIGLU_BLOCK];
  for (size_t r = r0; r < r1; r++) {
    const float *g = j->g + r * j->ldg, *u = j->u + r * j->ldu;
    float *h = j->h + r * j->ldh;
    for (size_t k0 = 0; k0 < j->f; k0 += SWIGLU_BLOCK) {
      size_t n = j->f - k0 < SWIGLU_BLOCK ? j->f - k0 : SWIGLU_BLOCK;
      mk->silu(g + k0, sl, n); /* bx_siluf_det of each element */
      for (size_t k = 0; k < n; k++) h[k0 + k] = bx_swiglu_fwd_combine_f32(sl[k], u[k0 + k]);
    }
  }
}

static void bwd_piece(void *ctx, size_t task, int worker) {
  (void)worker;
  const swiglu_job *j = ctx;
  size_t r0 = task * j->piece, r1 = j->rows - r0 < j->piece ? j->rows : r0 + j->piece;
  const bx_math_kernels *mk = bx_math_kernels_active(); /* the scalar bits, vectorised */
  float sg[SWIGLU_BLOCK], sl[SWIGLU_BLOCK];
  for (size_t r = r0; r < r1; r++) {
    const float *g = j->g + r * j->ldg, *u = j->u + r * j->ldu, *dh = j->dh + r * j->ldh;
    float *dg = j->dg + r * j->lddg, *du = j->du + r * j->lddu;
    for (size_t k0 = 0; k0 < j->f; k0 += SWIGLU_BLOCK) {
      size_t n = j->f - k0 < SWIGLU_BLOCK ? j->f - k0 : SWIGLU_BLOCK;
      mk->sigmoid(g + k0, sg, n); /* bx_sigmoidf_det, before dg may overwrite g */
      mk->silu(g + k0, sl, n);    /* bx_siluf_det */
      for (size_t k = 0; k < n; k++) {
        float x = g[k0 + k], up = u[k0 + k], d = dh[k0 + k]; /* read before dg / du overwrite them */
        bx_swiglu_bwd_combine_f32(x, up, d, sg[k], sl[k], &dg[k0 + k], &du[k0 + k]);
      }
    }
  }
}

/* struct_size (first), num_threads, then the call is entered */
static bx_status enter(bx_call *c, const char *fn, const bx_swiglu_opts *opts, int *threads) {
  return bx_tc_enter(c, fn, opts, sizeof *opts, offsetof(bx_swiglu_opts, num_threads),
                     "bx_swiglu_opts", "BX_SWIGLU_OPTS_DEFAULT", threads);
}

/* the job on the host's threads, or on the call's CUDA device */
static bx_status run(const char *fn, const bx_tc_place *pl, swiglu_job *j, int threads,
                     bx_task_fn task) {
  if (!j->rows || !j->f) return BX_OK;
  if (pl->cuda) {
    const bx_train_device *dev;
    bx_status st = bx_train_cuda(fn, &dev);
    if (st != BX_OK) return st;
    if (task == fwd_piece)
      return dev->swiglu_fwd(fn, pl->device, j->g, j->u, j->h, j->rows, j->f, j->ldg, j->ldu,
                             j->ldh);
    return dev->swiglu_bwd(fn, pl->device, j->g, j->u, j->dh, j->dg, j->du, j->rows, j->f, j->ldg,
                           j->ldu, j->ldh, j->lddg, j->lddu);
  }
  j->piece = bx_tc_piece_rows(j->f);
  size_t pieces = (j->rows + j->piece - 1) / j->piece;
  bx_parallel_run(bx_tc_threads(threads, pieces), pieces, task, j);
  return BX_OK;
}

/* the checks of count tensors: all fp32, 1-3 dimensions; shape of each
 * against tensor 0's rows and cols[i]; overlap rules */
static bx_status check_all(const char *fn, const bx_tc_place *pl, const DLTensor *const *ts,
                           const char *const *names, size_t count, const size_t *cols_mult,
                           const int *writable, const int *inplace, bx_tc_tensor *a) {
  bx_status st = BX_OK;
  memset(a, 0, count * sizeof *a);
  for (size_t i = 0; st == BX_OK && i < count; i++) {
    st = bx_tc_check_in(pl, fn, i, names[i], ts[i], BX_TC_F32, 1, 3, NULL, writable[i], &a[i]);
    a[i].inplace = inplace[i];
  }
  if (st != BX_OK) return st;
  /* tensor 0 has cols_mult[0] * F columns */
  if (a[0].cols % cols_mult[0])
    return bx_fail_at(BX_EINVAL, -1, BX_NO_INDEX, 0,
                      "%s: tensor 0 (%s) has %zu columns, not even (gate then up halves)", fn,
                      names[0], a[0].cols);
  size_t f = a[0].cols / cols_mult[0];
  for (size_t i = 1; st == BX_OK && i < count; i++)
    st = bx_tc_shape(fn, &a[i], a[0].rows, f * cols_mult[i],
                        cols_mult[i] == 2 ? "[T, 2F] =" : "[T, F] =");
  if (st != BX_OK) return st;
  const bx_tc_tensor *all[5];
  for (size_t i = 0; i < count; i++) all[i] = &a[i];
  return bx_tc_overlap(fn, all, count);
}

bx_status bx_swiglu_forward(const DLTensor *gate, const DLTensor *up, DLTensor *h,
                            const bx_swiglu_opts *opts) {
  static const char *fn = "bx_swiglu_forward";
  int threads;
  bx_call c;
  bx_status st = enter(&c, fn, opts, &threads);
  if (st != BX_OK) return st;
  const DLTensor *ts[3] = {gate, up, h};
  const bx_tc_place pl = bx_tc_place_of(ts, 3);
  const char *names[3] = {"gate", "up", "h"};
  const size_t mult[3] = {1, 1, 1};
  const int writable[3] = {0, 0, 1};
  /* h may be gate or up exactly: checked as "h in place of gate", then up */
  int inplace[3] = {-1, -1, 0};
  bx_tc_tensor a[3];
  st = check_all(fn, &pl, ts, names, 3, mult, writable, inplace, a);
  if (st == BX_ELAYOUT && a[2].data == a[1].data && a[2].n == a[1].n) {
    inplace[2] = 1;
    st = check_all(fn, &pl, ts, names, 3, mult, writable, inplace, a);
  }
  if (st == BX_OK) {
    swiglu_job j = {0};
    j.g = a[0].data;
    j.u = a[1].data;
    j.h = a[2].data;
    j.ldg = j.ldu = j.ldh = j.f = a[0].cols;
    j.rows = a[0].rows;
    st = run(fn, &pl, &j, threads, fwd_piece);
  }
  bx_call_leave(&c);
  return st;
}

bx_status bx_swiglu_forward_fused(const DLTensor *gate_up, DLTensor *h,
                                  const bx_swiglu_opts *opts) {
  static const char *fn = "bx_swiglu_forward_fused";
  int threads;
  bx_call c;
  bx_status st = enter(&c, fn, opts, &threads);
  if (st != BX_OK) return st;
  const DLTensor *ts[2] = {gate_up, h};
  const bx_tc_place pl = bx_tc_place_of(ts, 2);
  const char *names[2] = {"gate_up", "h"};
  const size_t mult[2] = {2, 1};
  const int writable[2] = {0, 1}, inplace[2] = {-1, -1};
  bx_tc_tensor a[2];
  st = check_all(fn, &pl, ts, names, 2, mult, writable, inplace, a);
  if (st == BX_OK) {
    swiglu_job j = {0};
    j.f = a[1].cols;
    j.g = a[0].data;
    j.u = a[0].data ? (const float *)a[0].data + j.f : NULL;
    j.h = a[1].data;
    j.ldg = j.ldu = 2 * j.f;
    j.ldh = j.f;
    j.rows = a[0].rows;
    st = run(fn, &pl, &j, threads, fwd_piece);
  }
  bx_call_leave(&c);
  return st;
}

bx_status bx_swiglu_backward(const DLTensor *gate, const DLTensor *up, const DLTensor *dh,
                             DLTensor *dgate, DLTensor *dup, const bx_swiglu_opts *opts) {
  static const char *fn = "bx_swiglu_backward";
  int threads;
  bx_call c;
  bx_status st = enter(&c, fn, opts, &threads);
  if (st != BX_OK) return st;
  const DLTensor *ts[5] = {gate, up, dh, dgate, dup};
  const bx_tc_place pl = bx_tc_place_of(ts, 5);
  const char *names[5] = {"gate", "up", "dh", "dgate", "dup"};
  const size_t mult[5] = {1, 1, 1, 1, 1};
  const int writable[5] = {0, 0, 0, 1, 1}, inplace[5] = {-1, -1, -1, 0, 1};
  bx_tc_tensor a[5];
  st = check_all(fn, &pl, ts, names, 5, mult, writable, inplace, a);
  if (st == BX_OK) {
    swiglu_job j = {0};
    j.g = a[0].data;
    j.u = a[1].data;
    j.dh = a[2].data;
    j.dg = a[3].data;
    j.du = a[4].data;
    j.f = j.ldg = j.ldu = j.ldh = j.lddg = j.lddu = a[0].cols;
    j.rows = a[0].rows;
    st = run(fn, &pl, &j, threads, bwd_piece);
  }
  bx_call_leave(&c);
  return st;
}

bx_status bx_swiglu_backward_fused(const DLTensor *gate_up, const DLTensor *dh,
                                   DLTensor *dgate_up, const bx_swiglu_opts *opts) {
  static const char *fn = "bx_swiglu_backward_fused";
  int threads;
  bx_call c;
  bx_status st = enter(&c, fn, opts, &threads);
  if (st != BX_OK) return st;
  const DLTensor *ts[3] = {gate_up, dh, dgate_up};
  const bx_tc_place pl = bx_tc_place_of(ts, 3);
  const char *names[3] = {"gate_up", "dh", "dgate_up"};
  const size_t mult[3] = {2, 1, 2};
  const int writable[3] = {0, 0, 1}, inplace[3] = {-1, -1, 0};
  bx_tc_tensor a[3];
  st = check_all(fn, &pl, ts, names, 3, mult, writable, inplace, a);
  if (st == BX_OK) {
    swiglu_job j = {0};
    j.f = a[1].cols;
    j.g = a[0].data;
    j.u = a[0].data ? (const float *)a[0].data + j.f : NULL;
    j.dh = a[1].data;
    j.dg = a[2].data;
    j.du = a[2].data ? (float *)a[2].data + j.f : NULL;
    j.ldg = j.ldu = j.lddg = j.lddu = 2 * j.f;
    j.ldh = j.f;
    j.rows = a[0].rows;
    st = run(fn, &pl, &j, threads, bwd_piece);
  }
  bx_call_leave(&c);
  return st;
}
