/*
 * glm_ops.c — the model's side of the bottom (glm_node.c): its status
 * text, fl(y + x), the bf16 copies of its weights (once per step), and its
 * parameters as the nodes' weights (tr_lin).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train_model_internal.h"

int tr_ck(tr_ctx *c, bx_status st, const char *what) { return glm_ck(&c->n, st, what); }

int tr_trace_rows(tr_ctx *c, int phase, int64_t layer, const char *name, float *x, int64_t cols) {
  const tr_trace *t = c->trace;
  if (!t) return 0;
  char path[96];
  if (layer >= 0) {
    snprintf(path, sizeof path, "model.layers.%lld%s%s", (long long)layer, name ? "." : "",
             name ? name : "");
    name = path;
  }
  if (t->rows(t->ctx, phase, name, phase ? "grad_input.0" : "output", x, c->w->T, cols, c->n.tok0) == 0)
    return 0;
  snprintf(c->n.err, c->n.errlen, "trace: %s: out of memory", name);
  c->n.st = BX_ENOMEM;
  return -1;
}

void tr_add_inplace(float *y, const float *x, int64_t n) {
  for (int64_t i = 0; i < n; i++) y[i] = y[i] + x[i];
}

static int is_router(const tr_model *m, int64_t idx) {
  for (int64_t l = 0; l < m->c.num_hidden_layers; l++)
    if (m->lx[l].moe && m->lx[l].router_w == idx) return 1;
  return 0;
}

int tr_bf16_weights(tr_model *m, int threads) {
  for (size_t i = 0; i < m->nparams; i++) {
    tr_param *p = &m->p[i];
    if (p->ndim != 2 || (int64_t)i == m->embed || is_router(m, (int64_t)i)) continue;
    if (!p->bf && !(p->bf = glm_mem_alloc((size_t)p->numel * sizeof *p->bf))) return -1;
    glm_bf16_convert(p->data, p->bf, p->numel, threads);
  }
  return 0;
}

int tr_bf16_on(const tr_ctx *c, int64_t idx) {
  return c->bf16 && idx >= 0 && c->m->p[idx].bf != NULL;
}

glm_lin tr_lin(const tr_ctx *c, int64_t w, int64_t b) {
  const tr_param *p = &c->m->p[w];
  glm_lin l = {p->data, tr_bf16_on(c, w) ? p->bf : NULL, b >= 0 ? c->m->p[b].data : NULL,
               p->shape[0], p->shape[1], w, b};
  return l;
}
