/*
 * train_model.c — the GLM-4.5 MoE decoder of `bitexact train`
 * (train_model.h): parameters under transformers' names, counter-based
 * initialisation, the micro-batch workspace and the step's gradient pass.
 *
 * The gradient pass (docs/train_model.md, train_step.c) runs the forward +
 * backward of every local micro-batch ONCE on a grid stated from the
 * previous step's observed exponents (the history), and a second time on
 * the observed grid when an add broke the stated one (or there is no
 * history). Chunk = one sequence (grid mode), so the result is a pure
 * function of the data; the ordinary mode (the framework baseline) takes
 * chunk = one micro-batch, a framework's sum per micro-batch, added in
 * layout order, one pass.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train_model_internal.h"

static void set_err(char *err, size_t errlen, const char *msg) {
  if (err && errlen) snprintf(err, errlen, "%s", msg);
}

/* ---- counter-based initialisation -------------------------------------------- */

static uint64_t mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

/* Box-Muller in fp32 with correctly rounded log and cos and IEEE sqrt, so
 * every machine gives the same bits: u in (0, 1] and v in [0, 1) from 24
 * bits each of hash(seed, param, elem). */
float tr_init_normal(uint64_t seed, uint64_t param, uint64_t elem, float std) {
  uint64_t h = mix64(mix64(mix64(seed) ^ (param * 0xD1B54A32D192ED03ull)) ^ elem);
  float u = (float)((h >> 40) + 1) * 0x1p-24f;
  float v = (float)((h >> 16) & 0xFFFFFFu) * 0x1p-24f;
  float r = sqrtf(-2.0f * bx_log_f32(u));
  float z = r * bx_cos_f32(6.28318548f * v);
  return z * std;
}

/* ---- parameters --------------------------------------------------------------- */

typedef struct plist {
  tr_param *p;
  size_t n, cap;
  int fail;
} plist;

static int64_t padd(plist *l, const char *name, int ndim, int64_t d0, int64_t d1, int group,
                    int64_t expert) {
  if (l->fail) return -1;
  if (l->n == l->cap) {
    size_t cap = l->cap ? 2 * l->cap : 64;
    tr_param *np = realloc(l->p, cap * sizeof *np);
    if (!np) {
      l->fail = 1;
      return -1;
    }
    l->p = np;
    l->cap = cap;
  }
  tr_param *p = &l->p[l->n];
  memset(p, 0, sizeof *p);
  snprintf(p->name, sizeof p->name, "%s", name);
  p->ndim = ndim;
  p->shape[0] = d0;
  p->shape[1] = ndim > 1 ? d1 : 0;
  p->numel = d0 * (ndim > 1 ? d1 : 1);
  p->group = group;
  p->expert = expert;
  return (int64_t)l->n++;
}

static void layer_names(plist *l, const tr_config *c, int64_t i, tr_layer_ix *x, int64_t qdim,
                        int64_t kvdim, int64_t shared_inter) {
  char b[96];
  int64_t H = c->hidden_size, D = c->head_dim;
  const int G = TR_GROUP_DENSE;
#define NAME(fmt) (snprintf(b, sizeof b, "model.layers.%lld." fmt, (long long)i), b)
  memset(x, 0xff, sizeof *x); /* every index -1 */
  x->moe = i >= c->first_k_dense_replace;
  x->q_w = padd(l, NAME("self_attn.q_proj.weight"), 2, qdim, H, G, -1);
  if (c->attention_bias) x->q_b = padd(l, NAME("self_attn.q_proj.bias"), 1, qdim, 0, G, -1);
  x->k_w = padd(l, NAME("self_attn.k_proj.weight"), 2, kvdim, H, G, -1);
  if (c->attention_bias) x->k_b = padd(l, NAME("self_attn.k_proj.bias"), 1, kvdim, 0, G, -1);
  x->v_w = padd(l, NAME("self_attn.v_proj.weight"), 2, kvdim, H, G, -1);
  if (c->attention_bias) x->v_b = padd(l, NAME("self_attn.v_proj.bias"), 1, kvdim, 0, G, -1);
  x->o_w = padd(l, NAME("self_attn.o_proj.weight"), 2, H, qdim, G, -1);
  if (c->use_qk_norm) {
    x->q_norm = padd(l, NAME("self_attn.q_norm.weight"), 1, D, 0, G, -1);
    x->k_norm = padd(l, NAME("self_attn.k_norm.weight"), 1, D, 0, G, -1);
  }
  if (!x->moe) {
    int64_t I = c->intermediate_size;
    x->gate_w = padd(l, NAME("mlp.gate_proj.weight"), 2, I, H, G, -1);
    x->up_w = padd(l, NAME("mlp.up_proj.weight"), 2, I, H, G, -1);
    x->down_w = padd(l, NAME("mlp.down_proj.weight"), 2, H, I, G, -1);
  } else {
    int64_t I = c->moe_intermediate_size;
    for (int64_t e = 0; e < c->n_routed_experts; e++) {
      const char *fmt = "model.layers.%lld.mlp.experts.%lld.%s_proj.weight";
      snprintf(b, sizeof b, fmt, (long long)i, (long long)e, "gate");
      int64_t g = padd(l, b, 2, I, H, TR_GROUP_EXPERT, e);
      if (e == 0) x->expert0 = g;
      snprintf(b, sizeof b, fmt, (long long)i, (long long)e, "up");
      padd(l, b, 2, I, H, TR_GROUP_EXPERT, e);
      snprintf(b, sizeof b, fmt, (long long)i, (long long)e, "down");
      padd(l, b, 2, H, I, TR_GROUP_EXPERT, e);
    }
    x->router_w = padd(l, NAME("mlp.gate.weight"), 2, c->n_routed_experts, H, G, -1);
    x->sh_gate = padd(l, NAME("mlp.shared_experts.gate_proj.weight"), 2, shared_inter, H, G, -1);
    x->sh_up = padd(l, NAME("mlp.shared_experts.up_proj.weight"), 2, shared_inter, H, G, -1);
    x->sh_down = padd(l, NAME("mlp.shared_experts.down_proj.weight"), 2, H, shared_inter, G, -1);
  }
  x->in_norm = padd(l, NAME("input_layernorm.weight"), 1, H, 0, G, -1);
  x->post_norm = padd(l, NAME("post_attention_layernorm.weight"), 1, H, 0, G, -1);
#undef NAME
}

/* Checks what the model itself needs (train_config.c checks every range). */
static int model_check(const tr_config *c, char *err, size_t errlen) {
  const char *why = NULL;
  if (c->vocab_size < 2 || c->hidden_size < 1 || c->num_hidden_layers < 1 ||
      c->num_attention_heads < 1 || c->num_key_value_heads < 1 || c->head_dim < 2 ||
      c->intermediate_size < 1 || c->moe_intermediate_size < 1)
    why = "a size is below its minimum";
  else if (c->num_attention_heads % c->num_key_value_heads)
    why = "num_attention_heads is not a multiple of num_key_value_heads";
  else if (c->tie_word_embeddings)
    why = "tie_word_embeddings must be false (the LM head is untied)";
  else if (strcmp(c->hidden_act, "silu") != 0)
    why = "hidden_act must be \"silu\"";
  else if (c->first_k_dense_replace < c->num_hidden_layers &&
           (c->n_routed_experts < 2 || c->num_experts_per_tok < 1 || c->n_group < 1 ||
            c->n_routed_experts % c->n_group || c->n_routed_experts / c->n_group < 2 ||
            c->topk_group < 1 || c->topk_group > c->n_group || c->n_shared_experts < 1 ||
            c->num_experts_per_tok > c->topk_group * (c->n_routed_experts / c->n_group)))
    why = "the MoE fields do not fit (experts, groups, top-k, shared experts)";
  else {
    int64_t rd = (int64_t)((double)c->head_dim * c->partial_rotary_factor);
    if (rd < 2 || rd > c->head_dim || rd % 2)
      why = "int(head_dim * partial_rotary_factor) must be even and in [2, head_dim]";
    else if (!(c->rope_theta >= 1.0) || !isfinite(c->rope_theta))
      why = "rope_theta must be finite and >= 1";
    else if (!(c->rms_norm_eps >= 0) || !isfinite(c->rms_norm_eps))
      why = "rms_norm_eps must be finite and >= 0";
    else if (!(c->initializer_range >= 0) || !isfinite(c->initializer_range))
      why = "initializer_range must be finite and >= 0";
  }
  if (!why) return 0;
  snprintf(err, errlen, "model config: %s", why);
  return -1;
}


int tr_model_create(const tr_config *c, uint64_t seed, tr_model **out, char *err, size_t errlen) {
  if (!c || !out) {
    set_err(err, errlen, "tr_model_create: NULL argument");
    return -1;
  }
  if (model_check(c, err, errlen)) return -1;
  tr_model *m = calloc(1, sizeof *m);
  plist l = {0};
  if (!m) goto oom;
  m->c = *c;
  m->device = glm_mem_device();
  m->rotary_dim = (int64_t)((double)c->head_dim * c->partial_rotary_factor);
  m->qdim = c->num_attention_heads * c->head_dim;
  m->kvdim = c->num_key_value_heads * c->head_dim;
  m->shared_inter = c->moe_intermediate_size * c->n_shared_experts;
  m->lx = calloc((size_t)c->num_hidden_layers, sizeof *m->lx);
  if (!m->lx) goto oom;
  int64_t H = c->hidden_size;
  m->embed = padd(&l, "model.embed_tokens.weight", 2, c->vocab_size, H, TR_GROUP_DENSE, -1);
  for (int64_t i = 0; i < c->num_hidden_layers; i++)
    layer_names(&l, c, i, &m->lx[i], m->qdim, m->kvdim, m->shared_inter);
  m->final_norm = padd(&l, "model.norm.weight", 1, H, 0, TR_GROUP_DENSE, -1);
  m->lm_head = padd(&l, "lm_head.weight", 2, c->vocab_size, H, TR_GROUP_DENSE, -1);
  m->nparams = l.n;
  for (int64_t i = 0; i < c->num_hidden_layers; i++) {
    if (!m->lx[i].moe) continue;
    char b[96];
    snprintf(b, sizeof b, "model.layers.%lld.mlp.gate.e_score_correction_bias", (long long)i);
    m->lx[i].ecb = padd(&l, b, 1, c->n_routed_experts, 0, -1, -1);
  }
  if (l.fail) goto oom;
  m->p = l.p;
  m->nall = l.n;
  l.p = NULL;
  m->grad_t = calloc(m->nparams, sizeof *m->grad_t);
  m->hist = calloc(m->nparams + 1, sizeof *m->hist);
  m->peer = malloc((m->nparams + 1) * sizeof *m->peer);
  m->npeer = (size_t)c->num_hidden_layers * 3;
  m->peer_max = malloc((m->npeer + 1) * sizeof *m->peer_max);
  if (!m->grad_t || !m->hist || !m->peer || !m->peer_max) goto oom;
  for (size_t i = 0; i < m->nparams; i++) m->peer[i] = -1;
  for (int64_t i = 0; i < c->num_hidden_layers; i++)
    for (int64_t e = 0; m->lx[i].moe && e < c->n_routed_experts; e++)
      for (int k = 0; k < 3; k++) m->peer[m->lx[i].expert0 + 3 * e + k] = (int32_t)(3 * i + k);
  float std = (float)c->initializer_range;
  for (size_t i = 0; i < m->nall; i++) {
    tr_param *p = &m->p[i];
    p->data = glm_mem_alloc((size_t)p->numel * sizeof(float));
    if (!p->data) goto oom;
    if (i < m->nparams) {
      p->grad = glm_mem_alloc((size_t)p->numel * sizeof(float));
      p->exp_avg = glm_mem_alloc((size_t)p->numel * sizeof(float));
      p->exp_avg_sq = glm_mem_alloc((size_t)p->numel * sizeof(float));
      if (!p->grad || !p->exp_avg || !p->exp_avg_sq) goto oom;
      glm_view v;
      m->grad_t[i] = *glm_f32(&v, p->grad, p->ndim, p->shape[0], p->shape[1], 0);
      m->grad_t[i].shape = p->shape;
    }
    size_t len = strlen(p->name);
    int is_bias = len > 5 && !strcmp(p->name + len - 5, ".bias");
    int is_norm = strstr(p->name, "norm.weight") != NULL;
    if (p->group < 0 || is_bias) continue; /* zeros */
    if (p->group == TR_GROUP_EXPERT && p->numel > m->max_expert_numel) m->max_expert_numel = p->numel;
    for (int64_t e = 0; e < p->numel; e++)
      p->data[e] = is_norm ? 1.0f : tr_init_normal(seed, (uint64_t)i, (uint64_t)e, std);
  }
  *out = m;
  return 0;
oom:
  free(l.p);
  tr_model_destroy(m);
  set_err(err, errlen, "tr_model_create: out of memory");
  return -1;
}

void tr_model_destroy(tr_model *m) {
  if (!m) return;
  for (size_t i = 0; m->p && i < m->nall; i++) {
    glm_mem_free(m->p[i].data);
    glm_mem_free(m->p[i].grad);
    glm_mem_free(m->p[i].exp_avg);
    glm_mem_free(m->p[i].exp_avg_sq);
    glm_mem_free(m->p[i].bf);
  }
  glm_bfws_free(&m->ws);
  free(m->p);
  free(m->grad_t);
  free(m->hist);
  free(m->peer);
  free(m->peer_max);
  glm_gr_destroy(m->gr);
  free(m->lx);
  tr_work_free(m->work);
  free(m);
}

const int *tr_model_history(const tr_model *m, size_t *n) {
  *n = m->nparams + 1;
  return m->hist_ok ? m->hist : NULL;
}

int tr_model_set_history(tr_model *m, const int *hist, size_t n, char *err, size_t errlen) {
  if (!hist) {
    m->hist_ok = 0;
    return 0;
  }
  if (n != m->nparams + 1) {
    if (err && errlen)
      snprintf(err, errlen, "grid history: %zu exponents, the model needs %zu (one per trainable "
               "parameter and the loss)", n, m->nparams + 1);
    return -1;
  }
  for (size_t i = 0; i < n; i++)
    if (hist[i] < -149 || hist[i] > 128) {
      if (err && errlen)
        snprintf(err, errlen, "grid history: exponent %zu is %d, outside [-149, 128]", i, hist[i]);
      return -1;
    }
  memcpy(m->hist, hist, n * sizeof *hist);
  m->hist_ok = 1;
  return 0;
}

int tr_model_last_passes(const tr_model *m) { return m->last_passes; }

int tr_model_use_device(int device, char *err, size_t errlen) {
  char none[8];
  if (!err) err = none, errlen = sizeof none;
  return glm_mem_use(device >= 0, device >= 0 ? device : 0, err, errlen);
}

DLDevice tr_model_device(const tr_model *m) { return m->device; }

size_t tr_model_params(tr_model *m, tr_param **params) {
  if (params) *params = m ? m->p : NULL;
  return m ? m->nall : 0;
}

/* ---- the micro-batch workspace ------------------------------------------------- */

static void *wal(tr_work *w, int64_t n, size_t elem) {
  if (w->nallocs == w->cap) {
    size_t cap = w->cap ? 2 * w->cap : 128;
    void **na = realloc(w->allocs, cap * sizeof *na);
    if (!na) {
      w->oom = 1;
      return NULL;
    }
    w->allocs = na;
    w->cap = cap;
  }
  void *p = glm_mem_alloc((size_t)(n > 0 ? n : 1) * elem);
  if (p) w->allocs[w->nallocs++] = p;
  else w->oom = 1;
  return p;
}

void tr_work_free(tr_work *w) {
  if (!w) return;
  glm_ep_scratch_free(w->eps);
  for (int64_t l = 0; w->epl && l < w->nlayers; l++) glm_ep_layer_free(w->epl[l]);
  free(w->epl);
  free(w->elin);
  for (size_t i = 0; i < w->nallocs; i++) glm_mem_free(w->allocs[i]);
  free(w->allocs);
  free(w->act);
  free(w);
}

#define F(n) ((float *)wal(w, (n), sizeof(float)))
#define I64(n) ((int64_t *)wal(w, (n), sizeof(int64_t)))

tr_work *tr_work_make(const tr_model *m, int64_t T, int64_t C) {
  const tr_config *c = &m->c;
  tr_work *w = calloc(1, sizeof *w);
  if (!w) return NULL;
  int64_t H = c->hidden_size, Q = m->qdim, KV = m->kvdim, Hq = c->num_attention_heads;
  int64_t Hkv = c->num_key_value_heads, E = c->n_routed_experts, K = c->num_experts_per_tok;
  int64_t R = T * K, IE = c->moe_intermediate_size, SI = m->shared_inter;
  int64_t ID = c->intermediate_size, V = c->vocab_size;
  int any_moe = 0, any_dense = 0;
  w->T = T;
  w->C = C;
  w->nch = (T + C - 1) / C;
  w->nlayers = c->num_hidden_layers;
  w->act = calloc((size_t)c->num_hidden_layers, sizeof *w->act);
  w->epl = calloc((size_t)c->num_hidden_layers, sizeof *w->epl);
  w->elin = calloc((size_t)(3 * E > 0 ? 3 * E : 1), sizeof *w->elin);
  if (!w->act || !w->epl || !w->elin) goto fail;
  w->ids = wal(w, T, sizeof(int32_t));
  w->targets = wal(w, T, sizeof(int32_t));
  w->positions = I64(T);
  for (int64_t l = 0; l < c->num_hidden_layers; l++) {
    tr_layer_act *a = &w->act[l];
    a->x_in = F(T * H), a->xn1 = F(T * H), a->rstd1 = F(T);
    if (c->use_qk_norm) a->q_raw = F(T * Q), a->k_raw = F(T * KV), a->rstd_q = F(T * Hq), a->rstd_k = F(T * Hkv);
    a->q = F(T * Q), a->k = F(T * KV), a->v = F(T * KV), a->o = F(T * Q), a->stats = F(T * Hq * 2);
    a->h1 = F(T * H), a->xn2 = F(T * H), a->rstd2 = F(T);
    if (!m->lx[l].moe) {
      any_dense = 1;
      a->g = F(T * ID), a->u = F(T * ID), a->a = F(T * ID);
    } else {
      any_moe = 1;
      a->logits = F(T * E), a->w = F(R), a->ids = I64(R), a->offsets = I64(E + 1);
      a->row_map = I64(2 * R), a->pos = I64(R);
      a->xp = F(R * H), a->gp = F(R * IE), a->upp = F(R * IE), a->hp = F(R * IE), a->yp = F(R * H);
      a->sg = F(T * SI), a->su = F(T * SI), a->sa = F(T * SI), a->so = F(T * H);
    }
  }
  w->x_final = F(T * H), w->xf = F(T * H), w->rstdf = F(T);
  w->logits = F(T * V), w->losses = F(T), w->loss_partials = F(w->nch), w->seq_losses = F(T);
  w->emb_row_ids = I64(T), w->emb_offsets = I64(w->nch + 1), w->emb_rows = F(T * H);
  tr_scratch *s = &w->s;
  s->dx = F(T * H), s->dtmp = F(T * H);
  s->dq = F(T * Q), s->dk = F(T * KV), s->dv = F(T * KV), s->dattn = F(T * Q);
  if (any_dense) s->dg = F(T * ID), s->du = F(T * ID), s->da = F(T * ID);
  if (any_moe) {
    s->dlogits_r = F(T * E), s->dw = F(R);
    s->dyp = F(R * H), s->dgp = F(R * IE), s->dup = F(R * IE), s->dhp = F(R * IE), s->dxp = F(R * H);
    s->dsg = F(T * SI), s->dsu = F(T * SI), s->dsa = F(T * SI);
    s->tok = I64(R), s->bounds = I64(w->nch + 1);
    s->ep = F(m->max_expert_numel), s->zeros = F(m->max_expert_numel);
  }
  s->partials = F(w->nch * (H > c->head_dim ? H : c->head_dim));
  if (w->oom) goto fail;
  return w;
fail:
  tr_work_free(w);
  return NULL;
}

#undef F
#undef I64

void tr_model_set_work(tr_model *m, tr_work *w) {
  tr_work_free(m->work);
  m->work = w;
}
