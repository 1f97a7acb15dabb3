/*
 * glm_ops.c — the bottom of the model module: what every other file of
 * src/glm uses and nothing here uses back. DLTensor views of the model's
 * buffers, the status check, fl(y + x), the bf16 operands (rounding, the
 * weights' bf16 copies once per step, workspaces) and the one GEMM entry
 * every GEMM of the model goes through.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train_model_internal.h"

/* ---- views, status, fl(y + x) ---------------------------------------------------------- */

static DLTensor *tr_view_init(tr_view *v, const void *p, uint8_t code, uint8_t bits, int ndim,
                              int64_t d0, int64_t d1, int64_t d2) {
  memset(v, 0, sizeof *v);
  v->shape[0] = d0;
  v->shape[1] = d1;
  v->shape[2] = d2;
  v->t.data = (void *)p;
  v->t.device.device_type = kDLCPU;
  v->t.ndim = ndim;
  v->t.dtype.code = code;
  v->t.dtype.bits = bits;
  v->t.dtype.lanes = 1;
  v->t.shape = v->shape;
  return &v->t;
}

DLTensor *tr_f32(tr_view *v, const float *p, int ndim, int64_t d0, int64_t d1, int64_t d2) {
  return tr_view_init(v, p, kDLFloat, 32, ndim, d0, d1, d2);
}

DLTensor *tr_bf16(tr_view *v, const uint16_t *p, int ndim, int64_t d0, int64_t d1) {
  return tr_view_init(v, p, kDLBfloat, 16, ndim, d0, d1, 0);
}

DLTensor *tr_i64(tr_view *v, const int64_t *p, int ndim, int64_t d0, int64_t d1) {
  return tr_view_init(v, p, kDLInt, 64, ndim, d0, d1, 0);
}

DLTensor *tr_i32(tr_view *v, const int32_t *p, int64_t d0) {
  return tr_view_init(v, p, kDLInt, 32, 1, d0, 0, 0);
}

int tr_ck(tr_ctx *c, bx_status st, const char *what) {
  if (st == BX_OK) return 0;
  snprintf(c->err, c->errlen, "%s: %s: %s", what, bx_status_str(st), bx_last_error());
  return -1;
}

void tr_add_inplace(float *y, const float *x, int64_t n) {
  for (int64_t i = 0; i < n; i++) y[i] = y[i] + x[i];
}

/* ---- bf16 compute (--compute-dtype bf16) -------------------------------------
 * fp32 -> bf16 keeps the top 16 bits of the fp32 word after rounding the
 * dropped 16 to nearest, ties to even: u + 0x7fff + ((u >> 16) & 1), then
 * >> 16 (an exact integer rule; a carry into the exponent gives the next
 * binade or Inf, as IEEE rounding does). NaN stays NaN (quiet bit set).
 * bf16 -> fp32 is exact (the 16 bits shifted up). */
uint16_t tr_bf16_round(float x) {
  uint32_t u;
  memcpy(&u, &x, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

float tr_bf16_widen(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float x;
  memcpy(&x, &u, 4);
  return x;
}

void tr_bf16_convert(const float *x, uint16_t *y, int64_t n) {
  for (int64_t i = 0; i < n; i++) y[i] = tr_bf16_round(x[i]);
}

static int is_router(const tr_model *m, int64_t idx) {
  for (int64_t l = 0; l < m->c.num_hidden_layers; l++)
    if (m->lx[l].moe && m->lx[l].router_w == idx) return 1;
  return 0;
}

int tr_bf16_weights(tr_model *m) {
  for (size_t i = 0; i < m->nparams; i++) {
    tr_param *p = &m->p[i];
    if (p->ndim != 2 || (int64_t)i == m->embed || is_router(m, (int64_t)i)) continue;
    if (!p->bf && !(p->bf = malloc((size_t)p->numel * sizeof *p->bf))) return -1;
    tr_bf16_convert(p->data, p->bf, p->numel);
  }
  return 0;
}

uint16_t *tr_bf16_ws(tr_model *m, int slot, int64_t n) {
  if (n > m->cvtcap[slot]) {
    uint16_t *q = realloc(m->cvt[slot], (size_t)(n > 0 ? n : 1) * sizeof *q);
    if (!q) return NULL;
    m->cvt[slot] = q;
    m->cvtcap[slot] = n;
  }
  return m->cvt[slot];
}

int tr_bf16_on(const tr_ctx *c, int64_t idx) {
  return c->bf16 && idx >= 0 && c->m->p[idx].bf != NULL;
}

int tr_gemm_op(tr_ctx *c, int bf, bx_gemm_layout layout, const float *a, int64_t ar, int64_t ac,
               const float *b, const uint16_t *bbf, int64_t br, int64_t bc, float *out,
               int64_t orow, int64_t ocol, int accumulate, const char *what) {
  tr_view va, vb, vc;
  bx_gemm_opts go = BX_GEMM_OPTS_DEFAULT;
  go.num_threads = c->threads;
  go.accumulate = accumulate;
  const DLTensor *ta, *tb;
  if (bf) {
    uint16_t *wa = tr_bf16_ws(c->m, 0, ar * ac);
    uint16_t *wb = bf == 2 ? tr_bf16_ws(c->m, 1, br * bc) : NULL;
    if (!wa || (bf == 2 && !wb)) {
      snprintf(c->err, c->errlen, "%s: out of memory (bf16 operand)", what);
      return -1;
    }
    tr_bf16_convert(a, wa, ar * ac);
    ta = tr_bf16(&va, wa, 2, ar, ac);
    if (bf == 2) {
      tr_bf16_convert(b, wb, br * bc);
      bbf = wb;
    }
    tb = tr_bf16(&vb, bbf, 2, br, bc);
  } else {
    ta = tr_f32(&va, a, 2, ar, ac, 0);
    tb = tr_f32(&vb, b, 2, br, bc, 0);
  }
  return tr_ck(c, bx_gemm(ta, tb, layout, tr_f32(&vc, out, 2, orow, ocol, 0), &go), what);
}

/* C[T,n] = A[T,k] · W[n,k]ᵀ (accumulate: C +=) */
int tr_gemm_nt(tr_ctx *c, const float *a, int64_t T, int64_t k, int64_t w, int64_t n,
               float *out, const char *what) {
  const tr_param *p = &c->m->p[w];
  return tr_gemm_op(c, tr_bf16_on(c, w), BX_GEMM_NT, a, T, k, p->data, p->bf, n, k, out, T, n, 0,
                    what);
}

/* dX[T,k] (+)= dY[T,n] · W[n,k] */
int tr_gemm_nn(tr_ctx *c, const float *dy, int64_t T, int64_t n, int64_t w, int64_t k,
               float *dx, int accumulate, const char *what) {
  const tr_param *p = &c->m->p[w];
  return tr_gemm_op(c, tr_bf16_on(c, w), BX_GEMM_NN, dy, T, n, p->data, p->bf, n, k, dx, T, k,
                    accumulate, what);
}

