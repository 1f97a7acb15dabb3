/*
 * glm_moe.c — the MoE block's nodes (glm_moe.h): the routed experts on
 * their rows (local, or expert-parallel through the group's all-to-alls),
 * their weight gradients per global chunk, and the block around them
 * (router, shared experts). Over glm_node.c / glm_nodes.c only.
 */
#include <stdlib.h>
#include <string.h>

#include "glm_moe.h"

int glm_ep_holds(int size, int rank, int64_t E, int64_t e) {
  if (size <= 1) return 1;
  return e / (E / size) == rank;
}

static int ep_on(const glm_ep *ep) { return ep && ep->size > 1; }

/* ---- the expert-parallel state ---------------------------------------------------------- */

struct glm_ep_layer {
  int64_t n, cap;              /* received rows, capacity */
  int64_t nl, size;            /* held experts, EP ranks (the arrays below) */
  float *xr, *gr, *ur, *hr;    /* [n,H], [n,I] x3: dispatch order */
  int64_t *order, *tok, *off;  /* [n], [n], [nl+1] */
  int64_t *sc, *rc;            /* [size] rows to / from each EP rank */
};

struct glm_ep_scratch {
  int64_t cap;                 /* rows of the buffers below */
  float *rbuf, *sbuf, *dr;     /* [cap, max(H, I)] staging; [cap,H] results in dispatch order */
  float *dyr, *dhr, *dgr, *dur;
  int64_t *rmeta, *eid, *tin;  /* [cap*2], [cap], [cap] */
  int64_t smeta_cap, *smeta;   /* [R*2] */
  int64_t bcap, *bounds;
  int64_t size, *sb, *rb;      /* [size] byte counts */
};

void glm_ep_layer_free(glm_ep_layer *l) {
  if (!l) return;
  glm_mem_free(l->xr), glm_mem_free(l->gr), glm_mem_free(l->ur), glm_mem_free(l->hr);
  glm_mem_free(l->order), glm_mem_free(l->tok), free(l->off);
  free(l->sc), free(l->rc);
  free(l);
}

void glm_ep_scratch_free(glm_ep_scratch *s) {
  if (!s) return;
  glm_mem_free(s->rbuf), glm_mem_free(s->sbuf), glm_mem_free(s->dr), glm_mem_free(s->dyr);
  glm_mem_free(s->dhr), glm_mem_free(s->dgr), glm_mem_free(s->dur), glm_mem_free(s->rmeta);
  glm_mem_free(s->eid), glm_mem_free(s->tin), glm_mem_free(s->smeta), glm_mem_free(s->bounds);
  free(s->sb), free(s->rb);
  free(s);
}

/* The model's buffers (glm_mem: device-reachable under --device cuda). */
static int grow(void **p, int64_t n, size_t elem) {
  void *q = glm_mem_realloc(*p, (size_t)(n > 0 ? n : 1) * elem);
  if (!q) return -1;
  *p = q;
  return 0;
}

static int oom(glm_nctx *c) { return glm_fail(c, BX_ENOMEM, "expert parallelism: out of memory"); }

/* The layer's state and the staging for an EP group of `size` with nl
 * held experts (made or kept). */
static int ep_state(const glm_ep *ep, int64_t nl, glm_ep_layer **lp, glm_ep_scratch **sp) {
  glm_ep_layer *l = *lp;
  if (l && (l->nl != nl || l->size != ep->size)) {
    glm_ep_layer_free(l);
    l = *lp = NULL;
  }
  if (!l) {
    if (!(l = calloc(1, sizeof *l))) return -1;
    l->nl = nl;
    l->size = ep->size;
    l->off = calloc((size_t)nl + 1, sizeof *l->off);
    l->sc = calloc((size_t)ep->size, sizeof *l->sc);
    l->rc = calloc((size_t)ep->size, sizeof *l->rc);
    *lp = l;
    if (!l->off || !l->sc || !l->rc) return -1;
  }
  glm_ep_scratch *s = *ep->scr;
  if (s && s->size != ep->size) {
    glm_ep_scratch_free(s);
    s = *ep->scr = NULL;
  }
  if (!s) {
    if (!(s = calloc(1, sizeof *s))) return -1;
    s->size = ep->size;
    s->sb = calloc((size_t)ep->size, sizeof *s->sb);
    s->rb = calloc((size_t)ep->size, sizeof *s->rb);
    *ep->scr = s;
    if (!s->sb || !s->rb) return -1;
  }
  *sp = s;
  return 0;
}

/* Capacity for n received rows (the layer's and the staging). */
static int ensure(const glm_moe_w *m, glm_ep_scratch *e, glm_ep_layer *l, int64_t n) {
  int64_t H = m->H, I = m->I, F = H > I ? H : I;
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

static int a2a_fail(glm_nctx *c, const char *what) {
  return glm_fail(c, BX_ECOMM, "expert parallelism: the all-to-all of %s failed", what);
}

/* The first negative word of recv[0..n) (a failed EP rank), -1 when none. */
static int64_t failed_peer(const int64_t *recv, int64_t n) {
  for (int64_t i = 0; i < n; i++)
    if (recv[i] < 0) return i;
  return -1;
}

static int learned(glm_nctx *c, int64_t peer, const char *where) {
  c->learned = 1;
  return glm_fail(c, BX_ECOMM, "expert parallelism: EP rank %lld failed (%s)", (long long)peer, where);
}

int glm_ep_status(glm_nctx *c, const glm_ep *ep, int failed) {
  if (!ep_on(ep)) return failed ? -1 : 0;
  int64_t stk[2 * 256], *b = ep->size <= 256 ? stk : malloc(2 * (size_t)ep->size * sizeof *b);
  if (!b) return failed ? -1 : oom(c); /* not reached below 256 EP ranks */
  for (int64_t i = 0; i < ep->size; i++) b[i] = failed ? -1 : 0;
  int rc = ep->alltoall_i64(b, b + ep->size, ep->ctx);
  int64_t peer = failed_peer(b + ep->size, ep->size);
  if (b != stk) free(b);
  if (failed) return -1;
  if (rc) return a2a_fail(c, "the status");
  return peer >= 0 ? learned(c, peer, "before an exchange") : 0;
}

/* rows of `width` floats (or 2 int64 when width < 0): sc rows out, rc rows in */
static int exchange(glm_nctx *c, const glm_ep *ep, glm_ep_scratch *e, const void *send,
                    const int64_t *sc, void *recv, const int64_t *rc, int64_t width,
                    const char *what) {
  int64_t rowb = width < 0 ? 16 : 4 * width;
  for (int64_t i = 0; i < ep->size; i++) {
    e->sb[i] = sc[i] * rowb;
    e->rb[i] = rc[i] * rowb;
    if (ep->a2a_bytes && i != ep->rank) *ep->a2a_bytes += e->sb[i];
  }
  if (ep->alltoallv(send, e->sb, recv, e->rb, ep->ctx)) return a2a_fail(c, what);
  return 0;
}

/* ---- the experts on their rows ----------------------------------------------------------- */

/* Expert l3 (gate, up, down) on rows [rows, H] of x: g, u, h [rows, I],
 * y [rows, H]. */
static int expert_fwd(glm_nctx *c, const glm_lin *l3, const float *x, int64_t rows, float *g,
                      float *u, float *h, float *y) {
  glm_bfws_hold(c->ws, x); /* one rounding of the rows for gate and up */
  int rc = glm_linear_fwd(c, &l3[0], x, rows, g, "expert gate_proj") ||
           glm_linear_fwd(c, &l3[1], x, rows, u, "expert up_proj");
  glm_bfws_release(c->ws);
  return rc || glm_swiglu_fwd(c, g, u, h, rows, l3[0].n, "expert swiglu") ||
         glm_linear_fwd(c, &l3[2], h, rows, y, "expert down_proj") ? -1 : 0;
}

/* Its backward: dh = dy·W_d, (dg, du), dx = dg·W_g + du·W_u (one chain). */
static int expert_bwd(glm_nctx *c, const glm_lin *l3, const float *dy, int64_t rows,
                      const float *g, const float *u, float *dh, float *dg, float *du, float *dx) {
  return glm_linear_dx(c, &l3[2], dy, rows, dh, 0, "expert down backward") ||
         glm_swiglu_bwd(c, g, u, dh, dg, du, rows, l3[0].n, "expert swiglu backward") ||
         glm_linear_dx(c, &l3[0], dg, rows, dx, 0, "expert gate backward") ||
         glm_linear_dx(c, &l3[1], du, rows, dx, 1, "expert up backward") ? -1 : 0;
}

/* An expert weight l ([n, k]) from dY rows dy[r0 ..) ([., n]) and X rows
 * x[r0 ..) ([., k]) whose global token ids tok[r0 ..) ascend: per chunk
 * cb0 + b for b = i * lc + j (i < peers, j < nch: the chunks of every
 * peer's current micro-batch; one process: peers 1), the TN GEMM over the
 * expert's rows of that chunk (bx_moe_expert_chunks gives them as one
 * range) bounded a priori (pass 0) or added (pass 1), or a zero partial
 * where the chunk sent it nothing (every chunk added once). bd: [span + 1]
 * scratch, span = (peers - 1) * lc + nch. */
static int wg_expert(glm_nctx *c, const glm_lin *l, const float *dy, const float *x, int64_t r0,
                     int64_t rows, const int64_t *tok, int64_t C, int64_t cb0, int64_t peers,
                     int64_t lc, int64_t nch, int64_t *bd, float *part, const float *zeros,
                     const char *what) {
  bx_tokred *s;
  size_t ti;
  int h = glm_gidx(c, l->gi, 1, &s, &ti, what);
  if (h <= 0) return h;
  if (s == c->sx) what = "expert wgrad (local tensors)"; /* an error's tensor index is sx's */
  int64_t n = l->n, k = l->k, span = (peers - 1) * lc + nch;
  int bf = l->wbf != NULL;
  if (rows > 0) {
    glm_view vt, vb;
    if (glm_ck(c, bx_moe_expert_chunks(glm_i64(&vt, tok + r0, 1, rows, 0), C, cb0,
                                       glm_i64(&vb, bd, 1, span + 1, 0)), what))
      return -1;
  } else {
    memset(bd, 0, (size_t)(span + 1) * sizeof *bd);
  }
  for (int64_t i = 0; i < peers; i++)
    for (int64_t j = 0; j < nch; j++) {
      int64_t b = i * lc + j, s0 = bd[b], mrows = bd[b + 1] - bd[b];
      const float *pa = dy + (r0 + s0) * n, *pb = x + (r0 + s0) * k;
      bx_status st;
      glm_view vp;
      if (c->pass == 0) {
        if (mrows == 0) continue; /* a zero partial: bound -149, nothing to raise */
        st = bx_tokred_bound_exp(s, ti, glm_wg_bound_exp(bf, mrows, pa, n, pb, k));
      } else if (mrows == 0) {
        st = bx_tokred_add(s, ti, cb0 + b, glm_f32(&vp, zeros, 2, n, k, 0));
      } else {
        if (glm_gemm(c, bf ? 2 : 0, BX_GEMM_TN, pa, mrows, n, pb, NULL, mrows, k, part, n, k, 0, what))
          return -1;
        st = bx_tokred_add(s, ti, cb0 + b, glm_f32(&vp, part, 2, n, k, 0));
      }
      if (glm_ck(c, st, what)) return -1;
    }
  return 0;
}

/* Expert e's three weight gradients (gate, up from dg, du and x; down
 * from dy and h). */
static int wg_expert3(glm_nctx *c, const glm_lin *l3, const float *dy, const float *dg,
                      const float *du, const float *x, const float *h, int64_t r0, int64_t rows,
                      const int64_t *tok, int64_t C, int64_t cb0, int64_t peers, int64_t lc,
                      int64_t nch, int64_t *bd, float *part, const float *zeros) {
  return wg_expert(c, &l3[0], dg, x, r0, rows, tok, C, cb0, peers, lc, nch, bd, part, zeros,
                   "expert gate_proj wgrad") ||
         wg_expert(c, &l3[1], du, x, r0, rows, tok, C, cb0, peers, lc, nch, bd, part, zeros,
                   "expert up_proj wgrad") ||
         wg_expert(c, &l3[2], dy, h, r0, rows, tok, C, cb0, peers, lc, nch, bd, part, zeros,
                   "expert down_proj wgrad") ? -1 : 0;
}

/* The EP forward: r->xp (the local dispatched rows) in, r->yp out. */
static int ep_forward(glm_nctx *c, const glm_moe_w *m, const glm_ep *ep, int64_t T, glm_moe_rows *r) {
  int64_t H = m->H, NE = m->E, nl = NE / ep->size, R = T * m->K, first = (int64_t)ep->rank * nl;
  glm_ep_layer *l;
  glm_ep_scratch *e;
  if (!r->epl || ep_state(ep, nl, r->epl, &e)) return oom(c);
  l = *r->epl;
  /* 1. counts and (expert, global token) of the local rows */
  for (int64_t d = 0; d < ep->size; d++) l->sc[d] = r->offsets[(d + 1) * nl] - r->offsets[d * nl];
  if (ep->alltoall_i64(l->sc, l->rc, ep->ctx)) return a2a_fail(c, "row counts");
  int64_t bad = failed_peer(l->rc, ep->size); /* a failed rank's count is negative */
  if (bad >= 0) return learned(c, bad, "its row counts");
  int64_t n = 0;
  for (int64_t d = 0; d < ep->size; d++) n += l->rc[d];
  if (ensure(m, e, l, n)) return oom(c);
  if (R > e->smeta_cap) {
    if (grow((void **)&e->smeta, 2 * R, 8)) return oom(c);
    e->smeta_cap = R;
  }
  for (int64_t ex = 0; ex < NE; ex++)
    for (int64_t q = r->offsets[ex]; q < r->offsets[ex + 1]; q++) {
      e->smeta[2 * q] = ex;
      e->smeta[2 * q + 1] = c->tok0 + r->row_map[2 * q];
    }
  /* 2. the exchange */
  if (glm_ep_status(c, ep, 0) || exchange(c, ep, e, e->smeta, l->sc, e->rmeta, l->rc, -1, "token ids") ||
      exchange(c, ep, e, r->xp, l->sc, e->rbuf, l->rc, H, "expert inputs"))
    return -1;
  /* 3. the dispatch order over the group */
  l->n = n;
  if (n > 0) {
    for (int64_t i = 0; i < n; i++) {
      e->eid[i] = e->rmeta[2 * i] - first;
      e->tin[i] = e->rmeta[2 * i + 1];
    }
    glm_view v[4];
    if (glm_ck(c, bx_moe_dispatch_order(glm_i64(&v[0], e->eid, 1, n, 0), glm_i64(&v[1], e->tin, 1, n, 0),
                                        glm_i64(&v[2], l->off, 1, nl + 1, 0),
                                        glm_i64(&v[3], l->order, 1, n, 0)),
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
  int64_t I = m->I;
  if (c->fault && c->fault(c->fault_ctx, "kernel"))
    return glm_fail(c, BX_EINVAL, "the routed experts: injected fault (BITEXACT_FAULT)");
  for (int64_t le = 0; le < nl; le++) {
    int64_t r0 = l->off[le], k = l->off[le + 1] - r0;
    if (k > 0 && expert_fwd(c, &m->experts[3 * (first + le)], l->xr + r0 * H, k, l->gr + r0 * I,
                            l->ur + r0 * I, l->hr + r0 * I, e->dr + r0 * H))
      return -1;
  }
  for (int64_t i = 0; i < n; i++) memcpy(e->sbuf + l->order[i] * H, e->dr + i * H, (size_t)H * 4);
  if (glm_ep_status(c, ep, 0)) return -1;
  return exchange(c, ep, e, e->sbuf, l->rc, r->yp, l->sc, H, "expert outputs");
}

/* The EP backward: s->dyp in, s->dxp out, the held experts' gradients. */
static int ep_backward(glm_nctx *c, const glm_moe_w *m, const glm_ep *ep, int64_t T, int64_t C,
                       glm_moe_rows *r, glm_moe_scr *s) {
  glm_ep_layer *l = r->epl ? *r->epl : NULL;
  glm_ep_scratch *e;
  int64_t H = m->H, I = m->I, nl = m->E / ep->size, first = (int64_t)ep->rank * nl;
  if (!l || l->nl != nl || l->size != ep->size)
    return glm_fail(c, BX_EINVAL, "expert parallelism: backward without its forward");
  if (ep_state(ep, nl, r->epl, &e) || ensure(m, e, l, l->n)) return oom(c); /* the staging */
  int64_t n = l->n;
  if (glm_ep_status(c, ep, 0) || exchange(c, ep, e, s->dyp, l->sc, e->rbuf, l->rc, H, "output gradients"))
    return -1;
  for (int64_t i = 0; i < n; i++) memcpy(e->dyr + i * H, e->rbuf + l->order[i] * H, (size_t)H * 4);
  for (int64_t le = 0; le < nl; le++) {
    int64_t r0 = l->off[le], k = l->off[le + 1] - r0;
    if (k > 0 && expert_bwd(c, &m->experts[3 * (first + le)], e->dyr + r0 * H, k, l->gr + r0 * I,
                            l->ur + r0 * I, e->dhr + r0 * I, e->dgr + r0 * I, e->dur + r0 * I,
                            e->dr + r0 * H))
      return -1;
  }
  for (int64_t i = 0; i < n; i++) memcpy(e->sbuf + l->order[i] * H, e->dr + i * H, (size_t)H * 4);
  if (glm_ep_status(c, ep, 0) || exchange(c, ep, e, e->sbuf, l->rc, s->dxp, l->sc, H, "input gradients"))
    return -1;
  /* the held experts' gradients over every peer's current micro-batch */
  int64_t nch = (T + C - 1) / C, lc = ep->local_tokens / C, span = (ep->size - 1) * lc + nch;
  int64_t cb0 = c->chunk0 - (int64_t)ep->rank * lc;
  if (span + 1 > e->bcap) {
    if (grow((void **)&e->bounds, span + 1, 8)) return oom(c);
    e->bcap = span + 1;
  }
  for (int64_t le = 0; le < nl; le++) {
    int64_t r0 = l->off[le], k = l->off[le + 1] - r0;
    if (wg_expert3(c, &m->experts[3 * (first + le)], e->dyr, e->dgr, e->dur, l->xr, l->hr, r0, k,
                   l->tok, C, cb0, ep->size, lc, nch, e->bounds, s->part, s->zeros))
      return -1;
  }
  return 0;
}

int glm_moe_experts_fwd(glm_nctx *c, const glm_moe_w *m, const glm_ep *ep, const float *x,
                        int64_t T, const float *w, const float *initial, glm_moe_rows *r,
                        float *out) {
  int64_t H = m->H, I = m->I, K = m->K, R = T * K;
  glm_view v[6];
  bx_moe_dispatch_opts dop = BX_MOE_DISPATCH_OPTS_DEFAULT;
  dop.num_threads = c->threads;
  if (glm_ck(c, bx_moe_permute(glm_f32(&v[0], x, 2, T, H, 0), glm_i64(&v[1], r->row_map, 2, R, 2),
                               glm_f32(&v[2], r->xp, 2, R, H, 0), &dop), "permute"))
    return -1;
  if (ep_on(ep)) {
    if (ep_forward(c, m, ep, T, r)) return -1; /* the experts on their ranks */
  } else {
    if (c->fault && c->fault(c->fault_ctx, "kernel"))
      return glm_fail(c, BX_EINVAL, "the routed experts: injected fault (BITEXACT_FAULT)");
    for (int64_t e = 0; e < m->E; e++) {
      int64_t r0 = r->offsets[e], n = r->offsets[e + 1] - r0;
      if (n > 0 && expert_fwd(c, &m->experts[3 * e], r->xp + r0 * H, n, r->gp + r0 * I,
                              r->up + r0 * I, r->hp + r0 * I, r->yp + r0 * H))
        return -1;
    }
  }
  return glm_ck(c, bx_moe_unpermute(glm_f32(&v[0], r->yp, 2, R, H, 0), glm_f32(&v[1], w, 2, T, K, 0),
                                    glm_i64(&v[2], r->row_map, 2, R, 2), glm_i64(&v[3], r->pos, 2, T, K),
                                    initial ? glm_f32(&v[4], initial, 2, T, H, 0) : NULL,
                                    glm_f32(&v[5], out, 2, T, H, 0), &dop),
                "unpermute");
}

int glm_moe_experts_bwd(glm_nctx *c, const glm_moe_w *m, const glm_ep *ep, const float *dout,
                        int64_t T, int64_t C, const float *w, glm_moe_rows *r, glm_moe_scr *s,
                        float *dx, float *dw) {
  int64_t H = m->H, I = m->I, K = m->K, R = T * K;
  glm_view v[7];
  bx_moe_dispatch_opts dop = BX_MOE_DISPATCH_OPTS_DEFAULT;
  dop.num_threads = c->threads;
  if (glm_ck(c, bx_moe_unpermute_backward(glm_f32(&v[0], dout, 2, T, H, 0), glm_f32(&v[1], r->yp, 2, R, H, 0),
                                          glm_f32(&v[2], w, 2, T, K, 0), glm_i64(&v[3], r->row_map, 2, R, 2),
                                          glm_i64(&v[4], r->pos, 2, T, K), glm_f32(&v[5], s->dyp, 2, R, H, 0),
                                          dw ? glm_f32(&v[6], dw, 2, T, K, 0) : NULL, &dop),
             "unpermute backward"))
    return -1;
  int par = ep_on(ep);
  if (par) {
    if (ep_backward(c, m, ep, T, C, r, s)) return -1; /* dxp and the held experts' gradients */
  } else {
    for (int64_t e = 0; e < m->E; e++) {
      int64_t r0 = r->offsets[e], n = r->offsets[e + 1] - r0;
      if (n > 0 && expert_bwd(c, &m->experts[3 * e], s->dyp + r0 * H, n, r->gp + r0 * I,
                              r->up + r0 * I, s->dhp + r0 * I, s->dgp + r0 * I, s->dup + r0 * I,
                              s->dxp + r0 * H))
        return -1;
    }
  }
  if (glm_ck(c, bx_moe_permute_backward(glm_f32(&v[0], s->dxp, 2, R, H, 0), glm_i64(&v[1], r->row_map, 2, R, 2),
                                        glm_i64(&v[2], r->pos, 2, T, K), glm_f32(&v[3], dx, 2, T, H, 0), &dop),
             "permute backward"))
    return -1;
  if (par || !c->s) return 0;
  int64_t nch = (T + C - 1) / C;
  for (int64_t q = 0; q < R; q++) s->tok[q] = c->tok0 + r->row_map[2 * q];
  for (int64_t e = 0; e < m->E; e++) {
    int64_t r0 = r->offsets[e], n = r->offsets[e + 1] - r0;
    if (wg_expert3(c, &m->experts[3 * e], s->dyp, s->dgp, s->dup, r->xp, r->hp, r0, n, s->tok, C,
                   c->chunk0, 1, 0, nch, s->bounds, s->part, s->zeros))
      return -1;
  }
  return 0;
}

/* ---- the block --------------------------------------------------------------------------- */

static bx_moe_router_opts router_opts(const glm_nctx *c, const glm_moe_w *m) {
  bx_moe_router_opts ro = BX_MOE_ROUTER_OPTS_DEFAULT;
  ro.num_threads = c->threads;
  ro.n_group = m->n_group;
  ro.topk_group = m->topk_group;
  ro.norm_topk_prob = m->norm_topk_prob;
  ro.routed_scaling_factor = m->routed_scaling_factor;
  return ro;
}

int glm_moe_route(glm_nctx *c, const glm_moe_w *m, const float *x, int64_t T, int64_t C,
                  float *logits, int64_t *ids, float *w, int64_t *counts) {
  int64_t E = m->E, K = m->K;
  glm_view v[5];
  if (glm_linear_fwd(c, &m->router, x, T, logits, "mlp.gate (router)")) return -1;
  bx_moe_router_opts ro = router_opts(c, m);
  return glm_ck(c, bx_moe_router_forward(glm_f32(&v[0], logits, 2, T, E, 0), glm_f32(&v[1], m->ecb, 1, E, 0, 0),
                                         glm_i64(&v[2], ids, 2, T, K), glm_f32(&v[3], w, 2, T, K, 0), C,
                                         counts ? glm_i64(&v[4], counts, 2, (T + C - 1) / C, E) : NULL,
                                         &ro),
                "router");
}

int glm_moe_fwd(glm_nctx *c, const glm_moe_w *m, const glm_ep *ep, const float *x, int64_t T,
                int64_t C, glm_moe_act *a, float *out) {
  int64_t E = m->E, K = m->K, R = T * K;
  glm_view v[4];
  bx_moe_dispatch_opts dop = BX_MOE_DISPATCH_OPTS_DEFAULT;
  dop.num_threads = c->threads;
  if (glm_moe_route(c, m, x, T, C, a->logits, a->ids, a->w, NULL)) return -1;
  if (glm_ck(c, bx_moe_dispatch_plan(glm_i64(&v[0], a->ids, 2, T, K), NULL,
                                     glm_i64(&v[1], a->r.offsets, 1, E + 1, 0),
                                     glm_i64(&v[2], a->r.row_map, 2, R, 2),
                                     glm_i64(&v[3], a->r.pos, 2, T, K), &dop),
             "dispatch plan"))
    return -1;
  /* the shared experts first: unpermute adds them (independent of the routed rows) */
  if (glm_mlp_fwd(c, m->shared, x, T, a->sg, a->su, a->sa, a->so)) return -1;
  return glm_moe_experts_fwd(c, m, ep, x, T, a->w, a->so, &a->r, out);
}

int glm_moe_bwd(glm_nctx *c, const glm_moe_w *m, const glm_ep *ep, const float *dout,
                const float *x, int64_t T, int64_t C, glm_moe_act *a, glm_moe_bscr *s,
                float *dx) {
  int64_t E = m->E, K = m->K;
  glm_view v[4];
  if (glm_moe_experts_bwd(c, m, ep, dout, T, C, a->w, &a->r, &s->rows, dx, s->dw)) return -1;
  bx_moe_router_opts ro = router_opts(c, m);
  if (glm_ck(c, bx_moe_router_backward(glm_f32(&v[0], a->logits, 2, T, E, 0), glm_i64(&v[1], a->ids, 2, T, K),
                                       glm_f32(&v[2], s->dw, 2, T, K, 0),
                                       glm_f32(&v[3], s->dlogits, 2, T, E, 0), &ro),
             "router backward"))
    return -1;
  /* dx += dlogits·W_r, then the shared MLP's dG·W_g and dU·W_u onto the same chains */
  if (glm_linear_bwd(c, &m->router, s->dlogits, x, T, dx, 1, "router")) return -1;
  return glm_mlp_bwd(c, m->shared, dout, x, T, a->sg, a->su, a->sa, s->dsa, s->dsg, s->dsu, dx, 1);
}
