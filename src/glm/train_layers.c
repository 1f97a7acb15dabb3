/*
 * train_layers.c — the attention half of a decoder layer and the dense
 * MLP, forward and backward, from bitexact_train.h's kernels
 * (transformers' Glm4MoeDecoderLayer / Glm4MoeAttention / Glm4MoeMLP).
 *
 * Attention half, per micro-batch of T = B*L tokens:
 *   xn1 = RMSNorm(x_in; input_layernorm)
 *   q = xn1·Wqᵀ, then q[t][j] = fl(q[t][j] + bq[j]) (the bias added after
 *       the product, one rounding: what torch's addmm does with beta = 1,
 *       C + A·B; not a chain started from the bias); k, v alike
 *   use_qk_norm: q = RMSNorm per head (q viewed [T*Hq, D]; q_norm), k alike
 *   q, k = RoPE (rotate_half on the first rotary_dim features of each head)
 *   o = causal GQA eager attention (bx_attention_forward, seq_len L)
 *   h1 = fl(x_in + o·Woᵀ)     (o_proj has no bias)
 *   xn2 = RMSNorm(h1; post_attention_layernorm)
 * Backward in the reverse order; the residual's gradient is added after
 * the branch's: dx = fl(dh + dbranch).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train_model_internal.h"

#define W(idx) (c->m->p[(idx)].data)

static int norm_fwd(tr_ctx *c, const float *x, int64_t rows, int64_t h, int64_t w_idx, float *y,
                    float *rstd, const char *what) {
  return glm_rmsnorm_fwd(&c->n, x, rows, h, W(w_idx), c->m->c.rms_norm_eps, y, rstd, what);
}

/* dx (may be dy: in place) and the gain's chunk partials (rows_per_chunk
 * kernel rows per chunk), added to parameter w_idx. */
static int norm_bwd(tr_ctx *c, const float *x, int64_t rows, int64_t h, int64_t w_idx,
                    const float *dy, const float *rstd, int64_t rows_per_chunk, float *dx,
                    const char *what) {
  return glm_rmsnorm_bwd(&c->n, x, rows, h, W(w_idx), dy, rstd, rows_per_chunk, dx,
                         c->w->s.partials, w_idx, what);
}

static int rope(tr_ctx *c, float *x, int64_t width, int backward, const char *what) {
  glm_view vx, vp, vy;
  bx_rope_opts ro = BX_ROPE_OPTS_DEFAULT;
  ro.num_threads = c->n.threads;
  const tr_model *m = c->m;
  int64_t T = c->w->T;
  DLTensor *tx = glm_f32(&vx, x, 2, T, width, 0), *ty = glm_f32(&vy, x, 2, T, width, 0);
  const DLTensor *pos = glm_i64(&vp, c->w->positions, 1, T, 0);
  bx_status st = backward ? bx_rope_backward(tx, pos, m->c.head_dim, m->rotary_dim, m->c.rope_theta, ty, &ro)
                          : bx_rope_forward(tx, pos, m->c.head_dim, m->rotary_dim, m->c.rope_theta, ty, &ro);
  return tr_ck(c, st, what);
}

int tr_attention_forward(tr_ctx *c, int64_t layer) {
  const tr_model *m = c->m;
  const tr_layer_ix *x = &m->lx[layer];
  tr_layer_act *a = &c->w->act[layer];
  int64_t T = c->w->T, H = m->c.hidden_size, Q = m->qdim, KV = m->kvdim, D = m->c.head_dim;
  int64_t Hq = m->c.num_attention_heads, Hkv = m->c.num_key_value_heads;
  int qkn = m->c.use_qk_norm;
  float *qd = qkn ? a->q_raw : a->q, *kd = qkn ? a->k_raw : a->k;
  if (norm_fwd(c, a->x_in, T, H, x->in_norm, a->xn1, a->rstd1, "input_layernorm") ||
      tr_trace_rows(c, 0, layer, "input_layernorm", a->xn1, H))
    return -1;
  glm_lin qkv[3] = {tr_lin(c, x->q_w, x->q_b), tr_lin(c, x->k_w, x->k_b), tr_lin(c, x->v_w, x->v_b)};
  float *const y[3] = {qd, kd, a->v};
  if (glm_qkv_fwd(&c->n, qkv, a->xn1, T, y)) return -1;
  if (qkn && (norm_fwd(c, a->q_raw, T * Hq, D, x->q_norm, a->q, a->rstd_q, "q_norm") ||
              norm_fwd(c, a->k_raw, T * Hkv, D, x->k_norm, a->k, a->rstd_k, "k_norm")))
    return -1;
  if (rope(c, a->q, Q, 0, "rope q") || rope(c, a->k, KV, 0, "rope k")) return -1;
  glm_view vq, vk, vv, vo, vs;
  bx_attention_opts ao = BX_ATTENTION_OPTS_DEFAULT;
  ao.num_threads = c->n.threads;
  bx_status st = bx_attention_forward(glm_f32(&vq, a->q, 2, T, Q, 0), glm_f32(&vk, a->k, 2, T, KV, 0),
                                      glm_f32(&vv, a->v, 2, T, KV, 0), c->L, Hq, Hkv, D,
                                      glm_f32(&vo, a->o, 2, T, Q, 0),
                                      glm_f32(&vs, a->stats, 3, T, Hq, 2), &ao);
  if (tr_ck(c, st, "attention")) return -1;
  glm_lin o = tr_lin(c, x->o_w, -1);
  if (glm_linear_fwd(&c->n, &o, a->o, T, a->h1, "o_proj") ||
      tr_trace_rows(c, 0, layer, "self_attn.o_proj", a->h1, H) ||
      tr_trace_rows(c, 0, layer, "self_attn", a->h1, H))
    return -1;
  for (int64_t i = 0; i < T * H; i++) a->h1[i] = a->x_in[i] + a->h1[i];
  if (norm_fwd(c, a->h1, T, H, x->post_norm, a->xn2, a->rstd2, "post_attention_layernorm")) return -1;
  return tr_trace_rows(c, 0, layer, "post_attention_layernorm", a->xn2, H);
}

/* In: s.dx = dh1 (the gradient of h1, both paths summed). Out: s.dx = the
 * gradient of x_in. Uses s.dtmp, s.dattn, s.dq, s.dk, s.dv. */
int tr_attention_backward(tr_ctx *c, int64_t layer) {
  const tr_model *m = c->m;
  const tr_layer_ix *x = &m->lx[layer];
  tr_layer_act *a = &c->w->act[layer];
  tr_scratch *s = &c->w->s;
  int64_t T = c->w->T, H = m->c.hidden_size, Q = m->qdim, KV = m->kvdim, D = m->c.head_dim;
  int64_t Hq = m->c.num_attention_heads, Hkv = m->c.num_key_value_heads, C = c->w->C;
  glm_lin o = tr_lin(c, x->o_w, -1);
  if (glm_linear_bwd(&c->n, &o, s->dx, a->o, T, s->dattn, 0, "o_proj backward") ||
      tr_trace_rows(c, 1, layer, "self_attn.o_proj", s->dattn, Q))
    return -1;
  glm_view v[8];
  bx_attention_opts ao = BX_ATTENTION_OPTS_DEFAULT;
  ao.num_threads = c->n.threads;
  bx_status st = bx_attention_backward(
      glm_f32(&v[0], s->dattn, 2, T, Q, 0), glm_f32(&v[1], a->q, 2, T, Q, 0),
      glm_f32(&v[2], a->k, 2, T, KV, 0), glm_f32(&v[3], a->v, 2, T, KV, 0),
      glm_f32(&v[4], a->stats, 3, T, Hq, 2), c->L, Hq, Hkv, D, glm_f32(&v[5], s->dq, 2, T, Q, 0),
      glm_f32(&v[6], s->dk, 2, T, KV, 0), glm_f32(&v[7], s->dv, 2, T, KV, 0), &ao);
  if (tr_ck(c, st, "attention backward")) return -1;
  if (rope(c, s->dq, Q, 1, "rope q backward") || rope(c, s->dk, KV, 1, "rope k backward")) return -1;
  if (m->c.use_qk_norm &&
      (norm_bwd(c, a->q_raw, T * Hq, D, x->q_norm, s->dq, a->rstd_q, C * Hq, s->dq, "q_norm backward") ||
       norm_bwd(c, a->k_raw, T * Hkv, D, x->k_norm, s->dk, a->rstd_k, C * Hkv, s->dk, "k_norm backward")))
    return -1;
  glm_lin qkv[3] = {tr_lin(c, x->q_w, x->q_b), tr_lin(c, x->k_w, x->k_b), tr_lin(c, x->v_w, x->v_b)};
  const float *const dy[3] = {s->dq, s->dk, s->dv};
  if (glm_qkv_bwd(&c->n, qkv, dy, a->xn1, T, s->dtmp) ||
      tr_trace_rows(c, 1, layer, "self_attn", s->dtmp, H))
    return -1;
  if (norm_bwd(c, a->x_in, T, H, x->in_norm, s->dtmp, a->rstd1, C, s->dtmp, "input_layernorm backward") ||
      tr_trace_rows(c, 1, layer, "input_layernorm", s->dtmp, H))
    return -1;
  tr_add_inplace(s->dx, s->dtmp, T * H);
  return tr_trace_rows(c, 1, layer, NULL, s->dx, H);
}

/* The post-attention norm's backward: s.dtmp (dxn2 in) -> dh1 added to s.dx. */
int tr_post_norm_backward(tr_ctx *c, int64_t layer) {
  const tr_model *m = c->m;
  tr_layer_act *a = &c->w->act[layer];
  int64_t T = c->w->T, H = m->c.hidden_size;
  if (norm_bwd(c, a->h1, T, H, m->lx[layer].post_norm, c->w->s.dtmp, a->rstd2, c->w->C,
               c->w->s.dtmp, "post_attention_layernorm backward") ||
      tr_trace_rows(c, 1, layer, "post_attention_layernorm", c->w->s.dtmp, H))
    return -1;
  tr_add_inplace(c->w->s.dx, c->w->s.dtmp, T * H);
  return 0;
}

/* The final norm and the LM head. Forward: xf = RMSNorm(x_final), logits =
 * xf·W_lmᵀ. Backward (logits holding dlogits): s.dx = the gradient of
 * x_final. */
int tr_head_forward(tr_ctx *c) {
  const tr_model *m = c->m;
  tr_work *w = c->w;
  int64_t T = w->T, H = m->c.hidden_size;
  if (norm_fwd(c, w->x_final, w->T, H, m->final_norm, w->xf, w->rstdf, "model.norm") ||
      tr_trace_rows(c, 0, -1, "model.norm", w->xf, H) || tr_trace_rows(c, 0, -1, "model", w->xf, H))
    return -1;
  glm_lin head = tr_lin(c, m->lm_head, -1);
  if (glm_linear_fwd(&c->n, &head, w->xf, T, w->logits, "lm_head")) return -1;
  return tr_trace_rows(c, 0, -1, "lm_head", w->logits, m->c.vocab_size);
}

int tr_head_backward(tr_ctx *c) {
  const tr_model *m = c->m;
  tr_work *w = c->w;
  int64_t T = w->T, H = m->c.hidden_size;
  glm_lin head = tr_lin(c, m->lm_head, -1);
  if (glm_linear_bwd(&c->n, &head, w->logits, w->xf, T, w->s.dtmp, 0, "lm_head backward") ||
      tr_trace_rows(c, 1, -1, "lm_head", w->s.dtmp, H))
    return -1;
  if (norm_bwd(c, w->x_final, w->T, H, m->final_norm, w->s.dtmp, w->rstdf, w->C, w->s.dx,
               "model.norm backward"))
    return -1;
  return tr_trace_rows(c, 1, -1, "model.norm", w->s.dx, H);
}

/* ---- dense MLP: down(silu(gate(x)) * up(x)) ------------------------------------- */

static void mlp_lin(const tr_ctx *c, const tr_layer_ix *x, glm_lin l[3]) {
  l[0] = tr_lin(c, x->gate_w, -1);
  l[1] = tr_lin(c, x->up_w, -1);
  l[2] = tr_lin(c, x->down_w, -1);
}

int tr_dense_mlp_forward(tr_ctx *c, int64_t layer, float *out) {
  tr_layer_act *a = &c->w->act[layer];
  glm_lin l[3];
  mlp_lin(c, &c->m->lx[layer], l);
  return glm_mlp_fwd(&c->n, l, a->xn2, c->w->T, a->g, a->u, a->a, out);
}

int tr_dense_mlp_backward(tr_ctx *c, int64_t layer, const float *dout, float *dxn2) {
  tr_layer_act *a = &c->w->act[layer];
  tr_scratch *s = &c->w->s;
  glm_lin l[3];
  mlp_lin(c, &c->m->lx[layer], l);
  return glm_mlp_bwd(&c->n, l, dout, a->xn2, c->w->T, a->g, a->u, a->a, s->da, s->dg, s->du, dxn2, 0);
}
