/*
 * model_ref.c — a slow, plain fp64 re-implementation of transformers'
 * Glm4MoeForCausalLM forward and its token-mean cross-entropy, written
 * from modeling_glm4_moe.py alone (not from the kernels), for
 * tests/train/test_model.c: its loss is compared with the model's, and its
 * central finite differences with the model's gradients. Parameters are
 * found by their transformers names (so the names are checked too).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model_ref.h"

static const double *P(const ref_model *r, const char *fmt, long long layer, long long expert) {
  char name[128];
  if (expert >= 0) snprintf(name, sizeof name, fmt, layer, expert);
  else if (layer >= 0) snprintf(name, sizeof name, fmt, layer);
  else snprintf(name, sizeof name, "%s", fmt);
  for (size_t i = 0; i < r->n; i++)
    if (!strcmp(r->names[i], name)) return r->data[i];
  fprintf(stderr, "model_ref: no parameter %s\n", name);
  exit(3);
}

static void rms(const double *x, int64_t n, const double *w, double eps, double *y) {
  double s = 0;
  for (int64_t j = 0; j < n; j++) s += x[j] * x[j];
  double r = 1.0 / sqrt(s / (double)n + eps);
  for (int64_t j = 0; j < n; j++) y[j] = w[j] * (x[j] * r);
}

/* y[n] = W[n,k] x[k] (+ b) */
static void lin(const double *W, const double *b, const double *x, int64_t n, int64_t k, double *y) {
  for (int64_t i = 0; i < n; i++) {
    double s = b ? b[i] : 0;
    for (int64_t j = 0; j < k; j++) s += W[i * k + j] * x[j];
    y[i] = s;
  }
}

static double silu(double x) { return x / (1.0 + exp(-x)); }

/* out[H] += scale * down(silu(gate x) * up x) */
static void mlp(const double *Wg, const double *Wu, const double *Wd, const double *x, int64_t H,
                int64_t I, double scale, double *out, double *tmp) {
  double *g = tmp, *u = tmp + I;
  lin(Wg, NULL, x, I, H, g);
  lin(Wu, NULL, x, I, H, u);
  for (int64_t i = 0; i < I; i++) g[i] = silu(g[i]) * u[i];
  for (int64_t h = 0; h < H; h++) {
    double s = 0;
    for (int64_t i = 0; i < I; i++) s += Wd[h * I + i] * g[i];
    out[h] += scale * s;
  }
}

static void moe(const ref_model *r, long long l, const double *x, double *out, double *tmp) {
  const tr_config *c = &r->c;
  int64_t H = c->hidden_size, E = c->n_routed_experts, K = c->num_experts_per_tok;
  int64_t G = c->n_group, S = E / G, I = c->moe_intermediate_size;
  const double *Wr = P(r, "model.layers.%lld.mlp.gate.weight", l, -1);
  const double *bias = P(r, "model.layers.%lld.mlp.gate.e_score_correction_bias", l, -1);
  double s[256], ch[256], gs[64];
  int keep[64] = {0}, chosen[256] = {0};
  for (int64_t e = 0; e < E; e++) {
    double z = 0;
    for (int64_t j = 0; j < H; j++) z += Wr[e * H + j] * x[j];
    s[e] = 1.0 / (1.0 + exp(-z));
    ch[e] = s[e] + bias[e];
  }
  for (int64_t g = 0; g < G; g++) { /* sum of the two largest of the group */
    double m1 = -INFINITY, m2 = -INFINITY;
    for (int64_t e = g * S; e < (g + 1) * S; e++) {
      if (ch[e] > m1) m2 = m1, m1 = ch[e];
      else if (ch[e] > m2) m2 = ch[e];
    }
    gs[g] = m1 + m2;
  }
  for (int64_t t = 0; t < c->topk_group; t++) { /* largest groups, ties to the lower id */
    int64_t best = -1;
    for (int64_t g = 0; g < G; g++)
      if (!keep[g] && (best < 0 || gs[g] > gs[best])) best = g;
    keep[best] = 1;
  }
  for (int64_t e = 0; e < E; e++)
    if (!keep[e / S]) ch[e] = 0.0;
  double wsum = 0;
  for (int64_t t = 0; t < K; t++) {
    int64_t best = -1;
    for (int64_t e = 0; e < E; e++)
      if (!chosen[e] && (best < 0 || ch[e] > ch[best])) best = e;
    chosen[best] = 1;
    wsum += s[best];
  }
  for (int64_t h = 0; h < H; h++) out[h] = 0;
  for (int64_t e = 0; e < E; e++) {
    if (!chosen[e]) continue;
    double w = s[e];
    if (c->norm_topk_prob) w /= (wsum + 1e-20);
    w *= c->routed_scaling_factor;
    mlp(P(r, "model.layers.%lld.mlp.experts.%lld.gate_proj.weight", l, e),
        P(r, "model.layers.%lld.mlp.experts.%lld.up_proj.weight", l, e),
        P(r, "model.layers.%lld.mlp.experts.%lld.down_proj.weight", l, e), x, H, I, w, out, tmp);
  }
  mlp(P(r, "model.layers.%lld.mlp.shared_experts.gate_proj.weight", l, -1),
      P(r, "model.layers.%lld.mlp.shared_experts.up_proj.weight", l, -1),
      P(r, "model.layers.%lld.mlp.shared_experts.down_proj.weight", l, -1), x, H,
      I * c->n_shared_experts, 1.0, out, tmp);
}

/* q or k of one token, heads of D features: QK-norm then partial RoPE. */
static void qk_post(const ref_model *r, double *x, int64_t heads, const double *nw, int64_t pos) {
  const tr_config *c = &r->c;
  int64_t D = c->head_dim, rd = (int64_t)((double)D * c->partial_rotary_factor), half = rd / 2;
  double tmp[1024];
  for (int64_t h = 0; h < heads; h++) {
    double *v = x + h * D;
    if (nw) {
      rms(v, D, nw, c->rms_norm_eps, tmp);
      memcpy(v, tmp, (size_t)D * sizeof *v);
    }
    for (int64_t i = 0; i < half; i++) {
      double inv = 1.0 / pow(c->rope_theta, (double)(2 * i) / (double)rd);
      double ang = (double)pos * inv, a = v[i], b = v[i + half];
      v[i] = a * cos(ang) - b * sin(ang);
      v[i + half] = b * cos(ang) + a * sin(ang);
    }
  }
}

double ref_loss(const ref_model *r, const int32_t *tokens, int64_t nseq, int64_t L) {
  const tr_config *c = &r->c;
  int64_t H = c->hidden_size, V = c->vocab_size, D = c->head_dim, Hq = c->num_attention_heads;
  int64_t Hkv = c->num_key_value_heads, Q = Hq * D, KV = Hkv * D, NL = c->num_hidden_layers;
  int64_t Imax = c->intermediate_size > 2 * c->moe_intermediate_size * c->n_shared_experts
                     ? c->intermediate_size
                     : 2 * c->moe_intermediate_size * c->n_shared_experts;
  double *x = calloc((size_t)(L * H), sizeof *x), *xn = calloc((size_t)(L * H), sizeof *x);
  double *q = calloc((size_t)(L * Q), sizeof *x), *k = calloc((size_t)(L * KV), sizeof *x);
  double *v = calloc((size_t)(L * KV), sizeof *x), *o = calloc((size_t)Q, sizeof *x);
  double *y = calloc((size_t)H, sizeof *x), *tmp = calloc((size_t)(2 * Imax + 2), sizeof *x);
  double *p = calloc((size_t)L, sizeof *x), *lg = calloc((size_t)V, sizeof *x);
  double total = 0, eps = c->rms_norm_eps, scale = 1.0 / sqrt((double)D);
  const double *emb = P(r, "model.embed_tokens.weight", -1, -1);
  for (int64_t sq = 0; sq < nseq; sq++) {
    const int32_t *tk = tokens + sq * (L + 1);
    for (int64_t t = 0; t < L; t++) memcpy(x + t * H, emb + (int64_t)tk[t] * H, (size_t)H * sizeof *x);
    for (long long l = 0; l < NL; l++) {
      const double *qb = c->attention_bias ? P(r, "model.layers.%lld.self_attn.q_proj.bias", l, -1) : NULL;
      const double *kb = c->attention_bias ? P(r, "model.layers.%lld.self_attn.k_proj.bias", l, -1) : NULL;
      const double *vb = c->attention_bias ? P(r, "model.layers.%lld.self_attn.v_proj.bias", l, -1) : NULL;
      const double *qn = c->use_qk_norm ? P(r, "model.layers.%lld.self_attn.q_norm.weight", l, -1) : NULL;
      const double *kn = c->use_qk_norm ? P(r, "model.layers.%lld.self_attn.k_norm.weight", l, -1) : NULL;
      for (int64_t t = 0; t < L; t++) {
        rms(x + t * H, H, P(r, "model.layers.%lld.input_layernorm.weight", l, -1), eps, xn + t * H);
        lin(P(r, "model.layers.%lld.self_attn.q_proj.weight", l, -1), qb, xn + t * H, Q, H, q + t * Q);
        lin(P(r, "model.layers.%lld.self_attn.k_proj.weight", l, -1), kb, xn + t * H, KV, H, k + t * KV);
        lin(P(r, "model.layers.%lld.self_attn.v_proj.weight", l, -1), vb, xn + t * H, KV, H, v + t * KV);
        qk_post(r, q + t * Q, Hq, qn, t);
        qk_post(r, k + t * KV, Hkv, kn, t);
      }
      const double *Wo = P(r, "model.layers.%lld.self_attn.o_proj.weight", l, -1);
      for (int64_t t = 0; t < L; t++) { /* causal GQA attention, then o_proj and the residual */
        for (int64_t h = 0; h < Hq; h++) {
          int64_t g = h / (Hq / Hkv);
          double m = -INFINITY, sum = 0;
          for (int64_t j = 0; j <= t; j++) {
            double d = 0;
            for (int64_t e = 0; e < D; e++) d += q[t * Q + h * D + e] * k[j * KV + g * D + e];
            p[j] = d * scale;
            if (p[j] > m) m = p[j];
          }
          for (int64_t j = 0; j <= t; j++) sum += (p[j] = exp(p[j] - m));
          for (int64_t e = 0; e < D; e++) {
            double acc = 0;
            for (int64_t j = 0; j <= t; j++) acc += p[j] / sum * v[j * KV + g * D + e];
            o[h * D + e] = acc;
          }
        }
        lin(Wo, NULL, o, H, Q, y);
        for (int64_t h = 0; h < H; h++) x[t * H + h] += y[h];
      }
      for (int64_t t = 0; t < L; t++) {
        rms(x + t * H, H, P(r, "model.layers.%lld.post_attention_layernorm.weight", l, -1), eps, xn + t * H);
        if (l < c->first_k_dense_replace) {
          for (int64_t h = 0; h < H; h++) y[h] = 0;
          mlp(P(r, "model.layers.%lld.mlp.gate_proj.weight", l, -1), P(r, "model.layers.%lld.mlp.up_proj.weight", l, -1),
              P(r, "model.layers.%lld.mlp.down_proj.weight", l, -1), xn + t * H, H, c->intermediate_size, 1.0, y, tmp);
        } else {
          moe(r, l, xn + t * H, y, tmp);
        }
        for (int64_t h = 0; h < H; h++) x[t * H + h] += y[h];
      }
    }
    for (int64_t t = 0; t < L; t++) {
      rms(x + t * H, H, P(r, "model.norm.weight", -1, -1), eps, xn + t * H);
      lin(P(r, "lm_head.weight", -1, -1), NULL, xn + t * H, V, H, lg);
      double m = -INFINITY, s = 0;
      for (int64_t u = 0; u < V; u++) m = lg[u] > m ? lg[u] : m;
      for (int64_t u = 0; u < V; u++) s += exp(lg[u] - m);
      total += m + log(s) - lg[tk[t + 1]];
    }
  }
  free(x), free(xn), free(q), free(k), free(v), free(o), free(y), free(tmp), free(p), free(lg);
  return total / (double)(nseq * L);
}
