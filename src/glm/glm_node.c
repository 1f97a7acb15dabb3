/*
 * glm_node.c — the bottom of the model module (glm_node.h): DLTensor
 * views, the status text, the bindings' argument checks, bf16 rounding and
 * workspaces, the one GEMM entry, and the weight gradients' part of the
 * two-pass protocol. Nothing here calls another file of src/glm.
 *
 * Weight-gradient bounds (train_model.c's scheme): a linear weight and
 * bias take the a-priori bound of the TN chain (bx_linear_wgrad_bound)
 * from the chunk's rows of dY and X, so pass 0 skips their GEMMs; small
 * tensors (norm gains, the loss) are bounded on their computed partials
 * (bx_tokred_bound). Both are functions of one chunk's data, so the agreed
 * grid (the max over chunks) is the same for every layout.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "glm_node.h"

/* ---- memory ------------------------------------------------------------------------------ */

static _Thread_local int g_managed, g_device;

int glm_mem_use(int managed, int device, char *err, size_t errlen) {
  if (managed) { /* one probe allocation: the backend and a device are there */
    void *p;
    DLDevice d = {kDLCUDAManaged, device};
    bx_status st = bx_train_alloc(d, 1, &p);
    if (st != BX_OK) {
      snprintf(err, errlen, "%s", bx_last_error());
      return -1;
    }
    bx_train_free(d, p);
  }
  g_managed = managed != 0;
  g_device = managed ? device : 0;
  return 0;
}

DLDevice glm_mem_device(void) {
  DLDevice d = {g_managed ? kDLCUDAManaged : kDLCPU, g_device};
  return d;
}

/* A block: a 64-byte header (its size and memory), then the bytes. */
typedef struct glm_mem_head {
  size_t bytes;
  DLDevice device;
} glm_mem_head;
#define GLM_MEM_HEAD 64

void *glm_mem_alloc(size_t bytes) {
  if (bytes > SIZE_MAX - GLM_MEM_HEAD) return NULL;
  DLDevice d = glm_mem_device();
  void *b;
  if (bx_train_alloc(d, bytes + GLM_MEM_HEAD, &b) != BX_OK) return NULL;
  glm_mem_head *h = b;
  h->bytes = bytes;
  h->device = d;
  return (char *)b + GLM_MEM_HEAD;
}

void *glm_mem_realloc(void *p, size_t bytes) {
  if (!p) return glm_mem_alloc(bytes);
  const glm_mem_head *h = (const glm_mem_head *)((char *)p - GLM_MEM_HEAD);
  void *q = glm_mem_alloc(bytes);
  if (!q) return NULL;
  memcpy(q, p, h->bytes < bytes ? h->bytes : bytes);
  glm_mem_free(p);
  return q;
}

void glm_mem_free(void *p) {
  if (!p) return;
  glm_mem_head *h = (glm_mem_head *)((char *)p - GLM_MEM_HEAD);
  bx_train_free(h->device, h);
}

/* ---- views, status ---------------------------------------------------------------------- */

static DLTensor *view_init(glm_view *v, const void *p, uint8_t code, uint8_t bits, int ndim,
                           int64_t d0, int64_t d1, int64_t d2) {
  memset(v, 0, sizeof *v);
  v->shape[0] = d0;
  v->shape[1] = d1;
  v->shape[2] = d2;
  v->t.data = (void *)p;
  v->t.device = glm_mem_device();
  v->t.ndim = ndim;
  v->t.dtype.code = code;
  v->t.dtype.bits = bits;
  v->t.dtype.lanes = 1;
  v->t.shape = v->shape;
  return &v->t;
}

DLTensor *glm_f32(glm_view *v, const float *p, int ndim, int64_t d0, int64_t d1, int64_t d2) {
  return view_init(v, p, kDLFloat, 32, ndim, d0, d1, d2);
}

DLTensor *glm_f32_host(glm_view *v, const float *p, int ndim, int64_t d0, int64_t d1, int64_t d2) {
  DLTensor *t = view_init(v, p, kDLFloat, 32, ndim, d0, d1, d2);
  t->device.device_type = kDLCPU;
  t->device.device_id = 0;
  return t;
}

DLTensor *glm_bf16(glm_view *v, const uint16_t *p, int ndim, int64_t d0, int64_t d1) {
  return view_init(v, p, kDLBfloat, 16, ndim, d0, d1, 0);
}

DLTensor *glm_i64(glm_view *v, const int64_t *p, int ndim, int64_t d0, int64_t d1) {
  return view_init(v, p, kDLInt, 64, ndim, d0, d1, 0);
}

DLTensor *glm_i32(glm_view *v, const int32_t *p, int64_t d0) {
  return view_init(v, p, kDLInt, 32, 1, d0, 0, 0);
}

int glm_fail(glm_nctx *c, bx_status st, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(c->err, c->errlen, fmt, ap);
  va_end(ap);
  c->st = st;
  return -1;
}

int glm_ck(glm_nctx *c, bx_status st, const char *what) {
  if (st == BX_OK) return 0;
  return glm_fail(c, st, "%s: %s: %s", what, bx_status_str(st), bx_last_error());
}

static const void *dl_data(glm_nctx *c, const DLTensor *t, const char *name, uint8_t code,
                           uint8_t bits, const char *dtype, int64_t rows, int64_t cols,
                           int64_t *rows_out) {
  if (!t) {
    glm_fail(c, BX_EINVAL, "argument '%s': a tensor is required", name);
    return NULL;
  }
  if (t->dtype.code != code || t->dtype.bits != bits || t->dtype.lanes != 1) {
    glm_fail(c, BX_EDTYPE, "argument '%s': must be %s", name, dtype);
    return NULL;
  }
  if (t->device.device_type != kDLCPU) {
    glm_fail(c, BX_EDEVICE, "argument '%s': must be a host (CPU) tensor", name);
    return NULL;
  }
  int64_t numel = 1, expect = 1;
  for (int d = t->ndim - 1; d >= 0; d--) {
    if (t->shape[d] < 0) {
      glm_fail(c, BX_EINVAL, "argument '%s': negative dimension", name);
      return NULL;
    }
    if (t->strides && t->shape[d] > 1 && t->strides[d] != expect) {
      glm_fail(c, BX_ELAYOUT, "argument '%s': must be compact row-major", name);
      return NULL;
    }
    expect *= t->shape[d];
    numel = expect;
  }
  int64_t r = rows;
  if (rows < 0) r = cols > 0 && numel % cols == 0 ? numel / cols : -1;
  if (r < 0 || r * cols != numel) {
    glm_fail(c, BX_EINVAL, "argument '%s': has %lld elements, expected %s%lld x %lld", name,
             (long long)numel, rows < 0 ? "a multiple of " : "", (long long)(rows < 0 ? 1 : rows),
             (long long)cols);
    return NULL;
  }
  if (numel > 0 && !t->data) {
    glm_fail(c, BX_EINVAL, "argument '%s': NULL data", name);
    return NULL;
  }
  if (rows_out) *rows_out = r;
  static const int64_t none[1] = {0}; /* an empty tensor's data: never read, never NULL */
  return numel == 0 ? (const void *)none : (const char *)t->data + t->byte_offset;
}

const float *glm_dl_f32(glm_nctx *c, const DLTensor *t, const char *name, int64_t rows,
                        int64_t cols, int64_t *rows_out) {
  return dl_data(c, t, name, kDLFloat, 32, "float32", rows, cols, rows_out);
}

const int64_t *glm_dl_i64(glm_nctx *c, const DLTensor *t, const char *name, int64_t rows,
                          int64_t cols) {
  return dl_data(c, t, name, kDLInt, 64, "int64", rows, cols, NULL);
}

const uint16_t *glm_dl_bf16(glm_nctx *c, const DLTensor *t, const char *name, int64_t rows,
                            int64_t cols) {
  return dl_data(c, t, name, kDLBfloat, 16, "bfloat16", rows, cols, NULL);
}

/* ---- bf16 operands -----------------------------------------------------------------------
 * fp32 -> bf16 keeps the top 16 bits of the fp32 word after rounding the
 * dropped 16 to nearest, ties to even: u + 0x7fff + ((u >> 16) & 1), then
 * >> 16 (an exact integer rule; a carry into the exponent gives the next
 * binade or Inf, as IEEE rounding does). Every NaN becomes 0x7fc0, the
 * library's canonical bf16 NaN (bx_round_bf16, docs/design.md "NaN").
 * bf16 -> fp32 is exact (the 16 bits shifted up). */
uint16_t glm_bf16_round(float x) {
  uint32_t u;
  memcpy(&u, &x, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)0x7fc0u;
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

float glm_bf16_widen(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float x;
  memcpy(&x, &u, 4);
  return x;
}

/* glm_bf16_round over an array: bx_round_bf16 (the same bits: one integer
 * loop in every ISA's table, vectorised, over `threads` threads; 0: the
 * library's default). */
void glm_bf16_convert(const float *x, uint16_t *y, int64_t n, int threads) {
  if (n <= 0) return;
  glm_view vx, vy;
  bx_math_opts o = BX_MATH_OPTS_DEFAULT;
  o.num_threads = threads;
  (void)bx_round_bf16(glm_f32(&vx, x, 1, n, 0, 0), glm_bf16(&vy, y, 1, n, 0), &o);
}

uint16_t *glm_bfws_get(glm_bfws *ws, int slot, int64_t n) {
  if (n > ws->cap[slot] || !ws->p[slot]) {
    uint16_t *q = glm_mem_realloc(ws->p[slot], (size_t)(n > 0 ? n : 1) * sizeof *q);
    if (!q) return NULL;
    ws->p[slot] = q;
    ws->cap[slot] = n > 0 ? n : 1;
  }
  return ws->p[slot];
}

void glm_bfws_free(glm_bfws *ws) {
  for (int i = 0; i < 2; i++) {
    glm_mem_free(ws->p[i]);
    ws->p[i] = NULL;
    ws->cap[i] = 0;
  }
  glm_bfws_release(ws);
}

void glm_bfws_hold(glm_bfws *ws, const float *x) {
  if (!ws) return;
  glm_bfws_release(ws);
  ws->held = x;
}

void glm_bfws_release(glm_bfws *ws) {
  if (!ws) return;
  ws->held = NULL;
  ws->src[0] = ws->src[1] = NULL;
  ws->srcn[0] = ws->srcn[1] = 0;
}

uint16_t *glm_bfws_convert(glm_bfws *ws, int slot, const float *x, int64_t n, int threads) {
  uint16_t *p = ws ? glm_bfws_get(ws, slot, n) : NULL;
  if (!p) return NULL;
  if (ws->held && x == ws->held && ws->src[slot] == x && ws->srcn[slot] == n) return p;
  glm_bf16_convert(x, p, n, threads);
  ws->src[slot] = ws->held && x == ws->held ? x : NULL;
  ws->srcn[slot] = n;
  return p;
}

/* ---- the GEMM entry ---------------------------------------------------------------------- */

int glm_gemm(glm_nctx *c, int bf, bx_gemm_layout layout, const float *a, int64_t ar, int64_t ac,
             const float *b, const uint16_t *bbf, int64_t br, int64_t bc, float *out, int64_t orow,
             int64_t ocol, int accumulate, const char *what) {
  glm_view va, vb, vc;
  bx_gemm_opts go = BX_GEMM_OPTS_DEFAULT;
  go.num_threads = c->threads;
  go.accumulate = accumulate;
  const DLTensor *ta, *tb;
  if (bf) {
    uint16_t *wa = glm_bfws_convert(c->ws, 0, a, ar * ac, c->threads);
    uint16_t *wb = bf == 2 && wa ? glm_bfws_convert(c->ws, 1, b, br * bc, c->threads) : NULL;
    if (!wa || (bf == 2 && !wb)) return glm_fail(c, BX_ENOMEM, "%s: out of memory (bf16 operand)", what);
    ta = glm_bf16(&va, wa, 2, ar, ac);
    if (bf == 2) bbf = wb;
    tb = glm_bf16(&vb, bbf, 2, br, bc);
  } else {
    ta = glm_f32(&va, a, 2, ar, ac, 0);
    tb = glm_f32(&vb, b, 2, br, bc, 0);
  }
  return glm_ck(c, bx_gemm(ta, tb, layout, glm_f32(&vc, out, 2, orow, ocol, 0), &go), what);
}

/* ---- weight gradients -------------------------------------------------------------------- */

/* With bf the weight's TN partials take dY and X rounded to bf16 (the same
 * rounding as the forward's operands), while the bias partial (a plain
 * sum, not a GEMM) keeps fp32 dY: two calls, one per tensor of the state.
 * The a-priori bound reads the bf16 operands it bounds. */
int glm_gidx(glm_nctx *c, int64_t gi, int local_ok, bx_tokred **s, size_t *t, const char *what) {
  if (!c->s || gi < 0) return 0;
  if (!c->gmap) {
    *s = c->s;
    *t = (size_t)gi;
    return 1;
  }
  if ((size_t)gi >= c->ngmap)
    return glm_fail(c, BX_EINVAL, "%s: gradient index %lld out of range (the reduction has %zu "
                    "tensors)", what, (long long)gi, c->ngmap);
  int64_t m = c->gmap[gi];
  if (m == -1)
    return glm_fail(c, BX_EINVAL, "%s: gradient tensor %lld is not held by this rank", what,
                    (long long)gi);
  if (m <= -2 && !local_ok)
    return glm_fail(c, BX_EINVAL, "%s: gradient tensor %lld is local (reduced over the expert "
                    "replicas): only routed experts' weights may be", what, (long long)gi);
  *s = m >= 0 ? c->s : c->sx;
  *t = (size_t)(m >= 0 ? m : -2 - m);
  return 1;
}

int glm_wg_linear(glm_nctx *c, int64_t w_idx, int bf, int64_t b_idx, const float *dy,
                  int64_t rows, int64_t n, const float *x, int64_t k, const char *what) {
  if (!c->s) return 0;
  glm_view vd, vx;
  bx_wgrad_opts wo = BX_WGRAD_OPTS_DEFAULT;
  wo.num_threads = c->threads;
  bx_tokred *sw = NULL, *sb = NULL;
  size_t wi = BX_WGRAD_NONE, bi = BX_WGRAD_NONE;
  int hw = glm_gidx(c, w_idx, 0, &sw, &wi, what), hb = glm_gidx(c, b_idx, 0, &sb, &bi, what);
  if (hw < 0 || hb < 0) return -1;
  if (!hw) wi = BX_WGRAD_NONE;
  if (!hb) bi = BX_WGRAD_NONE;
  if (wi == BX_WGRAD_NONE && bi == BX_WGRAD_NONE) return 0;
  bx_tokred *st0 = hw ? sw : sb; /* both of s: neither is local */
  if (wi != BX_WGRAD_NONE && x && bf) {
    uint16_t *bd = glm_bfws_convert(c->ws, 0, dy, rows * n, c->threads);
    uint16_t *bx = bd ? glm_bfws_convert(c->ws, 1, x, rows * k, c->threads) : NULL;
    if (!bd || !bx) return glm_fail(c, BX_ENOMEM, "%s: out of memory (bf16 operand)", what);
    const DLTensor *td = glm_bf16(&vd, bd, 2, rows, n), *tx = glm_bf16(&vx, bx, 2, rows, k);
    bx_status st = c->pass == 0 ? bx_linear_wgrad_bound(st0, wi, BX_WGRAD_NONE, td, tx, c->tok0, &wo)
                                : bx_linear_wgrad(st0, wi, BX_WGRAD_NONE, td, tx, c->tok0, &wo);
    if (glm_ck(c, st, what)) return -1;
    if (bi == BX_WGRAD_NONE) return 0;
    wi = BX_WGRAD_NONE;
    x = NULL;
  }
  const DLTensor *td = glm_f32(&vd, dy, 2, rows, n, 0);
  const DLTensor *tx = x ? glm_f32(&vx, x, 2, rows, k, 0) : NULL;
  bx_status st = c->pass == 0 ? bx_linear_wgrad_bound(st0, wi, bi, td, tx, c->tok0, &wo)
                              : bx_linear_wgrad(st0, wi, bi, td, tx, c->tok0, &wo);
  return glm_ck(c, st, what);
}

int glm_wg_partials(glm_nctx *c, int64_t idx, const float *partials, int64_t nch, int ndim,
                    const int64_t *shape, const char *what) {
  bx_tokred *s;
  size_t ti;
  int h = glm_gidx(c, idx, 0, &s, &ti, what);
  if (h <= 0) return h;
  int64_t numel = 1;
  for (int d = 0; d < ndim; d++) numel *= shape[d];
  for (int64_t j = 0; j < nch; j++) {
    glm_view v;
    DLTensor *t = glm_f32(&v, partials + j * numel, ndim, ndim > 0 ? shape[0] : 0,
                          ndim > 1 ? shape[1] : 0, 0);
    bx_status st = c->pass == 0 ? bx_tokred_bound(s, ti, c->chunk0 + j, t)
                                : bx_tokred_add(s, ti, c->chunk0 + j, t);
    if (glm_ck(c, st, what)) return -1;
  }
  return 0;
}

static float max_abs(const float *p, int64_t n) {
  float m = 0;
  for (int64_t i = 0; i < n; i++) {
    float a = fabsf(p[i]);
    if (a > m && a <= 3.402823466e38f) m = a; /* finite only (NaN fails both tests) */
  }
  return m;
}

/* With bf the bound of the rounded operands: rounding is monotone and odd,
 * so max |bf16(v)| = bf16(max |v|). */
int glm_wg_bound_exp(int bf, int64_t rows, const float *dy, int64_t n, const float *x, int64_t k) {
  float ma = max_abs(dy, rows * n), mb = max_abs(x, rows * k);
  if (bf) {
    ma = glm_bf16_widen(glm_bf16_round(ma));
    mb = glm_bf16_widen(glm_bf16_round(mb));
  }
  return bx_wgrad_bound_exp(rows, ma, mb);
}
