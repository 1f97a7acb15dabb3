/*
 * train_moe_ep.c — expert parallelism for the MoE layers of
 * train_moe_block.c (docs/train_moe.md "Expert parallelism: the order
 * across ranks", docs/train_cli.md "Expert parallelism").
 *
 * EP group of E ranks; EP rank d holds experts [d*nl, (d+1)*nl),
 * nl = n_routed_experts / E. Forward, per MoE layer and micro-batch:
 *   1. the local plan (train_moe_block.c) sorts the local rows by
 *      (expert, token), so the rows for EP rank d are one contiguous range;
 *   2. alltoall of the row counts, alltoallv of (expert, global token id)
 *      and of the rows xp;
 *   3. bx_moe_dispatch_order sorts the received rows by (expert, global
 *      token): the order one process holding the whole batch builds, so
 *      every expert GEMM row (batch invariant) has the bits of one process;
 *   4. the held experts' MLPs; the results scattered back to the received
 *      order and sent back (alltoallv): the sender's yp, in its own order.
 * Backward: dyp goes the same way, dxp comes back; the held experts'
 * weight gradients are per global chunk (one sequence) over the expert's
 * rows of that chunk (bx_moe_expert_chunks), for the chunks of every EP
 * peer's current micro-batch: the same addends as one process.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train_model_internal.h"


typedef struct tr_ep_layer {
  int64_t n, cap;              /* received rows, capacity */
  float *xr, *gr, *ur, *hr;    /* [n,H], [n,I] x3: dispatch order */
  int64_t *order, *tok, *off;  /* [n], [n], [nl+1] */
  int64_t *sc, *rc;            /* [E] rows to / from each EP rank */
} tr_ep_layer;

struct tr_ep_work {
  int64_t nlayers, E;
  tr_ep_layer *l;
  int64_t cap;                 /* rows of the scratch below */
  float *rbuf, *sbuf, *dr;     /* [cap, max(H, I)] staging; [cap,H] results in dispatch order */
  float *dyr, *dhr, *dgr, *dur;
  int64_t *rmeta, *eid, *tin;  /* [cap*2], [cap], [cap] */
  int64_t smeta_cap, *smeta;   /* [R*2] */
  int64_t bcap, *bounds;
  int64_t *sb, *rb;            /* [E] byte counts */
};

int tr_ep_holds(const tr_ep *ep, int64_t n_experts, int64_t e) {
  if (!ep || ep->size <= 1) return 1;
  return e / (n_experts / ep->size) == ep->rank;
}

int tr_ep_active(const tr_model *m) { return m->ep && m->ep->size > 1; }

void tr_model_set_ep(tr_model *m, tr_ep *ep) { m->ep = ep; }

void tr_ep_work_free(struct tr_ep_work *w) {
  if (!w) return;
  for (int64_t i = 0; w->l && i < w->nlayers; i++) {
    tr_ep_layer *l = &w->l[i];
    free(l->xr), free(l->gr), free(l->ur), free(l->hr), free(l->order), free(l->tok), free(l->off);
    free(l->sc), free(l->rc);
  }
  free(w->l);
  free(w->rbuf), free(w->sbuf), free(w->dr), free(w->dyr), free(w->dhr), free(w->dgr), free(w->dur);
  free(w->rmeta), free(w->eid), free(w->tin), free(w->smeta), free(w->bounds), free(w->sb), free(w->rb);
  free(w);
}

static int grow(void **p, int64_t n, size_t elem) {
  void *q = realloc(*p, (size_t)(n > 0 ? n : 1) * elem);
  if (!q) return -1;
  *p = q;
  return 0;
}

static int oom(tr_ctx *c) {
  snprintf(c->n.err, c->n.errlen, "expert parallelism: out of memory");
  return -1;
}

static struct tr_ep_work *ep_work(tr_ctx *c) {
  tr_work *w = c->w;
  if (w->epw) return w->epw;
  struct tr_ep_work *e = calloc(1, sizeof *e);
  if (!e) return NULL;
  e->nlayers = c->m->c.num_hidden_layers;
  e->E = c->m->ep->size;
  int64_t nl = c->m->c.n_routed_experts / e->E;
  e->l = calloc((size_t)e->nlayers, sizeof *e->l);
  e->sb = calloc((size_t)e->E, sizeof *e->sb);
  e->rb = calloc((size_t)e->E, sizeof *e->rb);
  int bad = !e->l || !e->sb || !e->rb;
  for (int64_t i = 0; !bad && i < e->nlayers; i++) {
    tr_ep_layer *l = &e->l[i];
    l->off = calloc((size_t)nl + 1, sizeof *l->off);
    l->sc = calloc((size_t)e->E, sizeof *l->sc);
    l->rc = calloc((size_t)e->E, sizeof *l->rc);
    bad = !l->off || !l->sc || !l->rc;
  }
  if (bad) {
    tr_ep_work_free(e);
    return NULL;
  }
  w->epw = e;
  w->epw_free = tr_ep_work_free; /* tr_work_free calls it: no arrow back to here */
  return e;
}

/* Capacity for n received rows (the layer's and the scratch). */
static int ensure(tr_ctx *c, struct tr_ep_work *e, tr_ep_layer *l, int64_t n) {
  int64_t H = c->m->c.hidden_size, I = c->m->c.moe_intermediate_size, F = H > I ? H : I;
  if (n > l->cap) {
    if (grow((void **)&l->xr, n * H, 4) || grow((void **)&l->gr, n * I, 4) ||
        grow((void **)&l->ur, n * I, 4) || grow((void **)&l->hr, n * I, 4) ||
        grow((void **)&l->order, n, 8) || grow((void **)&l->tok, n, 8))
      return -1;
    l->cap = n;
  }
  if (n > e->cap) {
    if (grow((void **)&e->rbuf, n * F, 4) || grow((void **)&e->sbuf, n * F, 4) ||
        grow((void **)&e->dr, n * H, 4) || grow((void **)&e->dyr, n * H, 4) ||
        grow((void **)&e->dhr, n * I, 4) || grow((void **)&e->dgr, n * I, 4) ||
        grow((void **)&e->dur, n * I, 4) || grow((void **)&e->rmeta, 2 * n, 8) ||
        grow((void **)&e->eid, n, 8) || grow((void **)&e->tin, n, 8))
      return -1;
    e->cap = n;
  }
  return 0;
}

static int a2a_fail(tr_ctx *c, const char *what) {
  snprintf(c->n.err, c->n.errlen, "expert parallelism: the all-to-all of %s failed", what);
  return -1;
}

/* rows of `width` floats (or 2 int64 when width < 0): sc rows out, rc rows in */
static int exchange(tr_ctx *c, struct tr_ep_work *e, const void *send, const int64_t *sc, void *recv,
                    const int64_t *rc, int64_t width, const char *what) {
  tr_ep *ep = c->m->ep;
  int64_t rowb = width < 0 ? 16 : 4 * width;
  for (int64_t i = 0; i < e->E; i++) {
    e->sb[i] = sc[i] * rowb;
    e->rb[i] = rc[i] * rowb;
    ep->a2a_bytes += i == ep->rank ? 0 : e->sb[i];
  }
  if (ep->alltoallv(send, e->sb, recv, e->rb, ep->ctx)) return a2a_fail(c, what);
  return 0;
}

int tr_moe_ep_forward(tr_ctx *c, int64_t layer) {
  const tr_model *m = c->m;
  const tr_layer_ix *x = &m->lx[layer];
  tr_layer_act *a = &c->w->act[layer];
  tr_ep *ep = m->ep;
  struct tr_ep_work *e = ep_work(c);
  if (!e) return oom(c);
  tr_ep_layer *l = &e->l[layer];
  int64_t T = c->w->T, H = m->c.hidden_size, NE = m->c.n_routed_experts, nl = NE / e->E;
  int64_t K = m->c.num_experts_per_tok, R = T * K, I = m->c.moe_intermediate_size;
  int64_t first = (int64_t)ep->rank * nl;
  /* 1. counts and (expert, global token) of the local rows */
  for (int64_t d = 0; d < e->E; d++) l->sc[d] = a->offsets[(d + 1) * nl] - a->offsets[d * nl];
  if (ep->alltoall_i64(l->sc, l->rc, ep->ctx)) return a2a_fail(c, "row counts");
  int64_t n = 0;
  for (int64_t d = 0; d < e->E; d++) n += l->rc[d];
  if (ensure(c, e, l, n)) return oom(c);
  if (R > e->smeta_cap) {
    if (grow((void **)&e->smeta, 2 * R, 8)) return oom(c);
    e->smeta_cap = R;
  }
  for (int64_t ex = 0; ex < NE; ex++)
    for (int64_t r = a->offsets[ex]; r < a->offsets[ex + 1]; r++) {
      e->smeta[2 * r] = ex;
      e->smeta[2 * r + 1] = c->n.tok0 + a->row_map[2 * r];
    }
  /* 2. the exchange */
  if (exchange(c, e, e->smeta, l->sc, e->rmeta, l->rc, -1, "token ids") ||
      exchange(c, e, a->xp, l->sc, e->rbuf, l->rc, H, "expert inputs"))
    return -1;
  /* 3. the dispatch order over the group */
  l->n = n;
  if (n > 0) {
    for (int64_t i = 0; i < n; i++) {
      e->eid[i] = e->rmeta[2 * i] - first;
      e->tin[i] = e->rmeta[2 * i + 1];
    }
    glm_view v[4];
    if (tr_ck(c, bx_moe_dispatch_order(glm_i64(&v[0], e->eid, 1, n, 0), glm_i64(&v[1], e->tin, 1, n, 0),
                                       glm_i64(&v[2], l->off, 1, nl + 1, 0), glm_i64(&v[3], l->order, 1, n, 0)),
              "dispatch order"))
      return -1;
    for (int64_t i = 0; i < n; i++) {
      memcpy(l->xr + i * H, e->rbuf + l->order[i] * H, (size_t)H * 4);
      l->tok[i] = e->tin[l->order[i]];
    }
  } else {
    memset(l->off, 0, (size_t)(nl + 1) * sizeof *l->off);
  }
  /* 4. the held experts */
  for (int64_t le = 0; le < nl; le++) {
    int64_t r0 = l->off[le], k = l->off[le + 1] - r0, p0 = x->expert0 + 3 * (first + le);
    if (k == 0) continue;
    if (tr_gemm_nt(c, l->xr + r0 * H, k, H, p0, I, l->gr + r0 * I, "expert gate_proj") ||
        tr_gemm_nt(c, l->xr + r0 * H, k, H, p0 + 1, I, l->ur + r0 * I, "expert up_proj") ||
        tr_swiglu_fwd(c, l->gr + r0 * I, l->ur + r0 * I, l->hr + r0 * I, k, I, "expert swiglu") ||
        tr_gemm_nt(c, l->hr + r0 * I, k, I, p0 + 2, H, e->dr + r0 * H, "expert down_proj"))
      return -1;
  }
  for (int64_t i = 0; i < n; i++) memcpy(e->sbuf + l->order[i] * H, e->dr + i * H, (size_t)H * 4);
  return exchange(c, e, e->sbuf, l->rc, a->yp, l->sc, H, "expert outputs");
}

/* A held expert's weight [n, k] from dY rows dy[r0 ..) and X rows x[r0 ..)
 * of the dispatch order (global token ids tok[r0 ..), ascending): per
 * chunk of every EP peer's current micro-batch (peer i's chunks are
 * chunk0 + (i - rank) * local chunks, nch of them), the TN GEMM over the
 * expert's rows of that chunk, or a zero partial (tr_wg_expert's rule). */
static int wg_expert(tr_ctx *c, struct tr_ep_work *e, int64_t idx, const float *dy, int64_t n,
                     const float *x, int64_t k, int64_t r0, int64_t rows, const int64_t *tok,
                     const char *what) {
  tr_work *w = c->w;
  const tr_param *p = &c->m->p[idx];
  int64_t C = w->C, nch = w->nch, lc = c->local_tokens / C;
  int64_t cb0 = c->n.chunk0 - (int64_t)c->m->ep->rank * lc, span = (e->E - 1) * lc + nch;
  if (span + 1 > e->bcap) {
    if (grow((void **)&e->bounds, span + 1, 8)) return oom(c);
    e->bcap = span + 1;
  }
  int64_t *bd = e->bounds;
  if (rows > 0) {
    glm_view vt, vb;
    if (tr_ck(c, bx_moe_expert_chunks(glm_i64(&vt, tok + r0, 1, rows, 0), C, cb0, glm_i64(&vb, bd, 1, span + 1, 0)),
              what))
      return -1;
  } else {
    memset(bd, 0, (size_t)(span + 1) * sizeof *bd);
  }
  for (int64_t i = 0; i < e->E; i++)
    for (int64_t j = 0; j < nch; j++) {
      int64_t b = i * lc + j, ch = cb0 + b, s0 = bd[b], mrows = bd[b + 1] - bd[b];
      const float *pa = dy + (r0 + s0) * n, *pb = x + (r0 + s0) * k;
      bx_status st;
      glm_view vp;
      if (c->n.pass == 0) {
        if (mrows == 0) continue;
        int ex = glm_wg_bound_exp(tr_bf16_on(c, idx), mrows, pa, n, pb, k);
        st = bx_tokred_bound_exp(c->n.s, (size_t)idx, ex);
      } else if (mrows == 0) {
        st = bx_tokred_add(c->n.s, (size_t)idx, ch, glm_f32(&vp, w->s.zeros, 2, p->shape[0], p->shape[1], 0));
      } else {
        if (glm_gemm(&c->n, tr_bf16_on(c, idx) ? 2 : 0, BX_GEMM_TN, pa, mrows, n, pb, NULL, mrows, k,
                       w->s.ep, n, k, 0, what))
          return -1;
        st = bx_tokred_add(c->n.s, (size_t)idx, ch, glm_f32(&vp, w->s.ep, 2, p->shape[0], p->shape[1], 0));
      }
      if (tr_ck(c, st, what)) return -1;
    }
  return 0;
}

int tr_moe_ep_backward(tr_ctx *c, int64_t layer) {
  const tr_model *m = c->m;
  const tr_layer_ix *x = &m->lx[layer];
  tr_scratch *s = &c->w->s;
  struct tr_ep_work *e = c->w->epw;
  if (!e) return oom(c);
  tr_ep_layer *l = &e->l[layer];
  int64_t H = m->c.hidden_size, nl = m->c.n_routed_experts / e->E, I = m->c.moe_intermediate_size;
  int64_t first = (int64_t)m->ep->rank * nl, n = l->n;
  if (exchange(c, e, s->dyp, l->sc, e->rbuf, l->rc, H, "output gradients")) return -1;
  for (int64_t i = 0; i < n; i++) memcpy(e->dyr + i * H, e->rbuf + l->order[i] * H, (size_t)H * 4);
  for (int64_t le = 0; le < nl; le++) {
    int64_t r0 = l->off[le], k = l->off[le + 1] - r0, p0 = x->expert0 + 3 * (first + le);
    if (k == 0) continue;
    if (tr_gemm_nn(c, e->dyr + r0 * H, k, H, p0 + 2, I, e->dhr + r0 * I, 0, "expert down backward") ||
        tr_swiglu_bwd(c, l->gr + r0 * I, l->ur + r0 * I, e->dhr + r0 * I, e->dgr + r0 * I, e->dur + r0 * I, k,
                      I, "expert swiglu backward") ||
        tr_gemm_nn(c, e->dgr + r0 * I, k, I, p0, H, e->dr + r0 * H, 0, "expert gate backward") ||
        tr_gemm_nn(c, e->dur + r0 * I, k, I, p0 + 1, H, e->dr + r0 * H, 1, "expert up backward"))
      return -1;
  }
  for (int64_t i = 0; i < n; i++) memcpy(e->sbuf + l->order[i] * H, e->dr + i * H, (size_t)H * 4);
  if (exchange(c, e, e->sbuf, l->rc, s->dxp, l->sc, H, "input gradients")) return -1;
  for (int64_t le = 0; le < nl; le++) {
    int64_t r0 = l->off[le], k = l->off[le + 1] - r0, p0 = x->expert0 + 3 * (first + le);
    if (wg_expert(c, e, p0, e->dgr, I, l->xr, H, r0, k, l->tok, "expert gate_proj wgrad") ||
        wg_expert(c, e, p0 + 1, e->dur, I, l->xr, H, r0, k, l->tok, "expert up_proj wgrad") ||
        wg_expert(c, e, p0 + 2, e->dyr, H, l->hr, I, r0, k, l->tok, "expert down_proj wgrad"))
      return -1;
  }
  return 0;
}

/* The gradient state's words (bx_tokred_words: per tensor its elements
 * and one non-finite word, then one coverage word per (tensor, chunk)):
 * the element words of the routed experts' tensors this rank holds are
 * summed over the replica ranks (the ranks of the same EP rank: the only
 * ones that add to them), those of the experts it does not hold stay zero
 * (no rank of its replica set adds to them; finish writes zero gradients
 * there), every other word (dense elements, every tensor's non-finite
 * count and chunk coverage) over all ranks. */
int tr_ep_allreduce(tr_ctx *c, const bx_comm *comm) {
  tr_model *m = c->m;
  tr_ep *ep = m->ep;
  int64_t *words;
  size_t count;
  if (tr_ck(c, bx_tokred_words(c->n.s, &words, &count), "tokred words")) return -1;
  size_t at = 0, nx = 0, nw = 0;
  for (size_t t = 0; t < m->nparams; t++) {
    size_t ne = (size_t)m->p[t].numel;
    if (m->p[t].group == TR_GROUP_EXPERT) nx += tr_ep_holds(ep, m->c.n_routed_experts, m->p[t].expert) ? ne : 0;
    else nw += ne;
    at += ne + 1;
  }
  if (at > count) {
    snprintf(c->n.err, c->n.errlen, "expert parallelism: the token reduction's words are not laid out "
             "as bx_tokred_words documents");
    return -1;
  }
  nw += count - at + m->nparams; /* + the non-finite and coverage words */
  int64_t *bw = malloc((nw ? nw : 1) * sizeof *bw), *bx = malloc((nx ? nx : 1) * sizeof *bx);
  if (!bw || !bx) {
    free(bw), free(bx);
    return oom(c);
  }
  size_t iw = 0, ix = 0;
  at = 0;
  for (size_t t = 0; t < m->nparams; t++) {
    size_t ne = (size_t)m->p[t].numel;
    if (m->p[t].group == TR_GROUP_EXPERT) {
      if (tr_ep_holds(ep, m->c.n_routed_experts, m->p[t].expert)) {
        memcpy(bx + ix, words + at, ne * sizeof *bx);
        ix += ne;
      } /* else: zero on every replica rank, left as it is */
    } else {
      memcpy(bw + iw, words + at, ne * sizeof *bw);
      iw += ne;
    }
    bw[iw++] = words[at + ne];
    at += ne + 1;
  }
  memcpy(bw + iw, words + at, (count - at) * sizeof *bw);
  int rc = 0;
  if (comm && comm->allreduce_i64(bw, nw, BX_OP_SUM, comm->ctx) != 0) rc = -1;
  if (rc == 0 && ep->replica && ep->replica->allreduce_i64(bx, nx, BX_OP_SUM, ep->replica->ctx) != 0) rc = -1;
  if (rc == 0) {
    ep->ar_world_words += comm ? (int64_t)nw : 0;
    ep->ar_replica_words += ep->replica ? (int64_t)nx : 0;
    iw = ix = at = 0;
    for (size_t t = 0; t < m->nparams; t++) {
      size_t ne = (size_t)m->p[t].numel;
      if (m->p[t].group == TR_GROUP_EXPERT) {
        if (tr_ep_holds(ep, m->c.n_routed_experts, m->p[t].expert)) {
          memcpy(words + at, bx + ix, ne * sizeof *bx);
          ix += ne;
        }
      } else {
        memcpy(words + at, bw + iw, ne * sizeof *bw);
        iw += ne;
      }
      words[at + ne] = bw[iw++];
      at += ne + 1;
    }
    memcpy(words + at, bw + iw, (count - at) * sizeof *bw);
  } else {
    snprintf(c->n.err, c->n.errlen, "expert parallelism: the all-reduce of the gradient words failed");
  }
  free(bw);
  free(bx);
  return rc;
}
