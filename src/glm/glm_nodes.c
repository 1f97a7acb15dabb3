/*
 * glm_nodes.c — the autograd nodes (glm_node.h): linear, the q/k/v
 * projections, RMSNorm and the SwiGLU MLP, forward and backward, from
 * bitexact_train.h's kernels through glm_node.c's GEMM entry and weight
 * gradients. The model's layers (train_layers.c) and the bindings'
 * autograd functions (python/csrc/_glm.c) call these; neither orders
 * these kernels itself.
 */
#include "glm_node.h"

static int bf_of(const glm_lin *l) { return l->wbf != NULL; }

int glm_linear_fwd(glm_nctx *c, const glm_lin *l, const float *x, int64_t T, float *y,
                   const char *what) {
  if (glm_gemm(c, bf_of(l), BX_GEMM_NT, x, T, l->k, l->w, l->wbf, l->n, l->k, y, T, l->n, 0, what))
    return -1;
  if (l->b) /* the bias after the product: one rounding per element */
    for (int64_t t = 0; t < T; t++)
      for (int64_t j = 0; j < l->n; j++) y[t * l->n + j] = y[t * l->n + j] + l->b[j];
  return 0;
}

int glm_linear_dx(glm_nctx *c, const glm_lin *l, const float *dy, int64_t T, float *dx,
                  int accumulate, const char *what) {
  return glm_gemm(c, bf_of(l), BX_GEMM_NN, dy, T, l->n, l->w, l->wbf, l->n, l->k, dx, T, l->k,
                  accumulate, what);
}

int glm_linear_bwd(glm_nctx *c, const glm_lin *l, const float *dy, const float *x, int64_t T,
                   float *dx, int accumulate, const char *what) {
  if (dx && glm_linear_dx(c, l, dy, T, dx, accumulate, what)) return -1;
  return glm_wg_linear(c, l->gi, bf_of(l), l->bi, dy, T, l->n, x, l->k, what);
}

static const char *const QKV[3] = {"q_proj", "k_proj", "v_proj"};

int glm_qkv_fwd(glm_nctx *c, const glm_lin l[3], const float *x, int64_t T, float *const y[3]) {
  glm_bfws_hold(c->ws, x); /* x rounded to bf16 once for the three products */
  int rc = 0;
  for (int i = 0; i < 3 && !rc; i++) rc = glm_linear_fwd(c, &l[i], x, T, y[i], QKV[i]);
  glm_bfws_release(c->ws);
  return rc ? -1 : 0;
}

int glm_qkv_bwd(glm_nctx *c, const glm_lin l[3], const float *const dy[3], const float *x,
                int64_t T, float *dx) {
  static const char *const back[3] = {"q_proj backward", "k_proj backward", "v_proj backward"};
  static const char *const wg[3] = {"q_proj wgrad", "k_proj wgrad", "v_proj wgrad"};
  for (int i = 0; dx && i < 3; i++)
    if (glm_linear_dx(c, &l[i], dy[i], T, dx, i > 0, back[i])) return -1;
  glm_bfws_hold(c->ws, x);
  int rc = 0;
  for (int i = 0; i < 3 && !rc; i++)
    rc = glm_wg_linear(c, l[i].gi, bf_of(&l[i]), l[i].bi, dy[i], T, l[i].n, x, l[i].k, wg[i]);
  glm_bfws_release(c->ws);
  return rc ? -1 : 0;
}

int glm_rmsnorm_fwd(glm_nctx *c, const float *x, int64_t rows, int64_t h, const float *w,
                    double eps, float *y, float *rstd, const char *what) {
  glm_view vx, vw, vy, vr;
  bx_rmsnorm_opts no = BX_RMSNORM_OPTS_DEFAULT;
  no.num_threads = c->threads;
  return glm_ck(c, bx_rmsnorm_forward(glm_f32(&vx, x, 2, rows, h, 0), glm_f32(&vw, w, 1, h, 0, 0),
                                      eps, glm_f32(&vy, y, 2, rows, h, 0),
                                      rstd ? glm_f32(&vr, rstd, 1, rows, 0, 0) : NULL, &no),
                what);
}

int glm_rmsnorm_bwd(glm_nctx *c, const float *x, int64_t rows, int64_t h, const float *w,
                    const float *dy, const float *rstd, int64_t rows_per_chunk, float *dx,
                    float *parts, int64_t gi, const char *what) {
  glm_view vx, vw, vd, vr, vdx, vp;
  bx_rmsnorm_opts no = BX_RMSNORM_OPTS_DEFAULT;
  no.num_threads = c->threads;
  int want = c->s && gi >= 0 && parts;
  int64_t nch = rows_per_chunk > 0 ? (rows + rows_per_chunk - 1) / rows_per_chunk : 0;
  bx_status st = bx_rmsnorm_backward(
      glm_f32(&vx, x, 2, rows, h, 0), glm_f32(&vw, w, 1, h, 0, 0), glm_f32(&vd, dy, 2, rows, h, 0),
      glm_f32(&vr, rstd, 1, rows, 0, 0), rows_per_chunk, glm_f32(&vdx, dx, 2, rows, h, 0),
      want ? glm_f32(&vp, parts, 2, nch, h, 0) : NULL, &no);
  if (glm_ck(c, st, what)) return -1;
  return want ? glm_wg_partials(c, gi, parts, nch, 1, &h, what) : 0;
}

int glm_swiglu_fwd(glm_nctx *c, const float *g, const float *u, float *h, int64_t rows, int64_t n,
                   const char *what) {
  glm_view vg, vu, vh;
  bx_swiglu_opts so = BX_SWIGLU_OPTS_DEFAULT;
  so.num_threads = c->threads;
  return glm_ck(c, bx_swiglu_forward(glm_f32(&vg, g, 2, rows, n, 0), glm_f32(&vu, u, 2, rows, n, 0),
                                     glm_f32(&vh, h, 2, rows, n, 0), &so), what);
}

int glm_swiglu_bwd(glm_nctx *c, const float *g, const float *u, const float *dh, float *dg,
                   float *du, int64_t rows, int64_t n, const char *what) {
  glm_view v[5];
  bx_swiglu_opts so = BX_SWIGLU_OPTS_DEFAULT;
  so.num_threads = c->threads;
  return glm_ck(c, bx_swiglu_backward(glm_f32(&v[0], g, 2, rows, n, 0), glm_f32(&v[1], u, 2, rows, n, 0),
                                      glm_f32(&v[2], dh, 2, rows, n, 0), glm_f32(&v[3], dg, 2, rows, n, 0),
                                      glm_f32(&v[4], du, 2, rows, n, 0), &so), what);
}

int glm_mlp_fwd(glm_nctx *c, const glm_lin l[3], const float *x, int64_t T, float *g, float *u,
                float *a, float *y) {
  glm_bfws_hold(c->ws, x); /* one rounding of x for gate and up */
  int rc = glm_linear_fwd(c, &l[0], x, T, g, "mlp.gate_proj") ||
           glm_linear_fwd(c, &l[1], x, T, u, "mlp.up_proj");
  glm_bfws_release(c->ws);
  return rc || glm_swiglu_fwd(c, g, u, a, T, l[0].n, "mlp swiglu") ||
         glm_linear_fwd(c, &l[2], a, T, y, "mlp.down_proj") ? -1 : 0;
}

int glm_mlp_bwd(glm_nctx *c, const glm_lin l[3], const float *dy, const float *x, int64_t T,
                const float *g, const float *u, const float *a, float *da, float *dg, float *du,
                float *dx, int accumulate) {
  int64_t I = l[0].n;
  if (glm_linear_bwd(c, &l[2], dy, a, T, da, 0, "mlp.down_proj backward") ||
      glm_swiglu_bwd(c, g, u, da, dg, du, T, I, "mlp swiglu backward"))
    return -1;
  if (dx && (glm_linear_dx(c, &l[0], dg, T, dx, accumulate, "mlp.gate_proj backward") ||
             glm_linear_dx(c, &l[1], du, T, dx, 1, "mlp.up_proj backward")))
    return -1;
  glm_bfws_hold(c->ws, x);
  int rc = glm_wg_linear(c, l[0].gi, bf_of(&l[0]), l[0].bi, dg, T, I, x, l[0].k, "mlp.gate_proj wgrad") ||
           glm_wg_linear(c, l[1].gi, bf_of(&l[1]), l[1].bi, du, T, I, x, l[1].k, "mlp.up_proj wgrad");
  glm_bfws_release(c->ws);
  return rc ? -1 : 0;
}

int glm_embedding_bwd(glm_nctx *c, const DLTensor *ids, const float *dy, int64_t T, int64_t H,
                      int64_t V, int64_t C, int64_t padding_idx, int64_t *row_ids, float *rows,
                      int64_t *offsets, int64_t gi) {
  glm_view v[4];
  bx_embedding_opts eo = BX_EMBEDDING_OPTS_DEFAULT;
  eo.num_threads = c->threads;
  eo.padding_idx = padding_idx;
  int64_t nch = C > 0 ? (T + C - 1) / C : 0;
  DLTensor *trid = glm_i64(&v[0], row_ids, 1, T, 0), *trows = glm_f32(&v[1], rows, 2, T, H, 0);
  DLTensor *toff = glm_i64(&v[2], offsets, 1, nch + 1, 0);
  if (glm_ck(c, bx_embedding_backward(ids, glm_f32(&v[3], dy, 2, T, H, 0), V, C, trid, trows, toff,
                                      &eo), "embed_tokens backward"))
    return -1;
  bx_tokred *s;
  size_t ti;
  int h = glm_gidx(c, gi, 0, &s, &ti, "embed_tokens wgrad");
  if (h <= 0) return h;
  bx_status st = c->pass == 0 ? bx_embedding_grad_bound(s, ti, trows, toff)
                              : bx_embedding_grad_add(s, c->grads, c->ngrads, ti,
                                                      c->chunk0, trid, trows, toff);
  return glm_ck(c, st, "embed_tokens wgrad");
}

int glm_exact_mean(glm_nctx *c, const float *parts, int64_t n, int64_t per, int64_t stride,
                   int64_t first, int64_t C, int64_t total, int64_t divisor, const bx_comm *comm,
                   float *mean) {
  glm_view vm, vp;
  bx_tokred *s = NULL;
  bx_tokred_opts to = BX_TOKRED_OPTS_DEFAULT;
  float m = 0;
  DLTensor *tm = glm_f32_host(&vm, &m, 0, 0, 0, 0);
  if (per < 1) return glm_fail(c, BX_EINVAL, "exact mean: per %lld < 1", (long long)per);
  int rc = glm_ck(c, bx_tokred_create(tm, 1, C, total, &to, &s), "exact mean");
  for (int64_t j = 0; !rc && j < n; j++)
    rc = glm_ck(c, bx_tokred_bound(s, 0, (j / per) * stride + first + j % per,
                                   glm_f32_host(&vp, parts + j, 0, 0, 0, 0)),
                "exact mean");
  /* the agreement carries a local failure to every rank (none waits) */
  bx_status ag = s ? bx_tokred_agree(s, comm) : BX_OK;
  if (!rc) rc = glm_ck(c, ag, "exact mean");
  for (int64_t j = 0; !rc && j < n; j++)
    rc = glm_ck(c, bx_tokred_add(s, 0, (j / per) * stride + first + j % per,
                                 glm_f32_host(&vp, parts + j, 0, 0, 0, 0)),
                "exact mean");
  if (!rc && comm) rc = glm_ck(c, bx_tokred_allreduce(s, comm), "exact mean");
  if (!rc) rc = glm_ck(c, bx_tokred_finish(s, tm, 1, divisor), "exact mean");
  bx_tokred_destroy(s);
  if (!rc) *mean = m;
  return rc;
}

int glm_xent_fwd(glm_nctx *c, bx_tokred *sl, const float *logits, int64_t T, int64_t V,
                 const DLTensor *targets, int64_t n_global, int64_t C, int64_t ignore_index,
                 float *losses, float *parts, float *dlogits, float *mean) {
  glm_view v[4];
  bx_xent_opts xo = BX_XENT_OPTS_DEFAULT;
  xo.num_threads = c->threads;
  xo.ignore_index = ignore_index;
  int64_t nch = C > 0 ? (T + C - 1) / C : 0;
  if (glm_ck(c, bx_xent_forward_backward(glm_f32(&v[0], logits, 2, T, V, 0), targets, n_global, C,
                                         glm_f32(&v[1], losses, 1, T, 0, 0),
                                         glm_f32(&v[2], parts, 1, nch, 0, 0), NULL,
                                         glm_f32(&v[3], dlogits, 2, T, V, 0), &xo),
             "cross-entropy"))
    return -1;
  if (sl) {
    glm_nctx cl = *c;
    cl.s = sl;
    if (glm_wg_partials(&cl, 0, parts, nch, 0, NULL, "loss")) {
      c->st = cl.st;
      return -1;
    }
  }
  return mean ? glm_exact_mean(c, parts, nch, nch > 0 ? nch : 1, 0, 0, C, T, n_global, NULL, mean) : 0;
}
