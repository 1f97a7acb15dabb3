/*
 * glm_gradred.c — one step's gradient reduction as one object (glm_node.h,
 * "the protocol"): the states of the gradients and of the loss, the
 * phases, the micro-batch ledger that pass 1 must repeat, the agreement,
 * the all-reduce and the finish. Over bitexact_train_tokred.h only.
 */
#include <stdlib.h>
#include <string.h>

#include "glm_node.h"

struct glm_gr {
  DLTensor *grads;          /* n descriptors (data NULL), shapes below */
  int64_t *shapes;
  size_t n;
  int64_t *gmap;            /* per tensor: its state and index (glm_nctx.gmap) */
  DLTensor *wd, *xd;        /* the descriptors of s (nw) and of sx (nx) */
  DLTensor *outs;           /* finish's scratch: nw + nx */
  size_t nw, nx;
  int64_t C, total;
  bx_tokred_mode mode;
  bx_tokred *s, *sx, *sl;   /* the gradients (over comm; the local ones over xcomm), the loss */
  int phase;                /* -1 idle/done, 0 pass 0, 1 pass 1, 2 all-reduced */
  int one_pass;             /* agreed before any micro-batch (ordinary mode, a stated grid): no ledger */
  int stated;               /* glm_gr_begin_stated: the bounds are given, agree may come first */
  int *hist;                /* n + 1 observed exponents after allreduce (the gradients, the loss) */
  int overflowed;           /* after allreduce: an add broke a stated bound on some rank */
  int64_t *mb;              /* pass 0's micro-batches: (tok0, T) pairs */
  size_t nmb, capmb, at;    /* recorded, capacity, pass 1's next */
};

int glm_gr_create(const DLTensor *grads, size_t n, const unsigned char *where, int64_t C,
                  int64_t total_tokens, bx_tokred_mode mode, glm_gr **out, glm_nctx *c) {
  *out = NULL;
  if ((n && !grads) || C < 1 || total_tokens < 1)
    return glm_fail(c, BX_EINVAL, "gradient reduction: %zu tensors, chunk_tokens %lld and "
                    "total_tokens %lld must be >= 1", n, (long long)C, (long long)total_tokens);
  glm_gr *g = calloc(1, sizeof *g);
  size_t dims = 0;
  for (size_t i = 0; i < n; i++) dims += (size_t)(grads[i].ndim > 0 ? grads[i].ndim : 0);
  for (size_t i = 0; where && i < n; i++)
    if (where[i] > GLM_GR_ABSENT) {
      free(g);
      return glm_fail(c, BX_EINVAL, "gradient reduction: tensor %zu: where %d is not 0 (all "
                      "ranks), 1 (local: the replicas) or 2 (absent)", i, (int)where[i]);
    }
  if (g) {
    g->grads = calloc(n ? n : 1, sizeof *g->grads);
    g->shapes = calloc(dims ? dims : 1, sizeof *g->shapes);
    g->gmap = calloc(n ? n : 1, sizeof *g->gmap);
    g->wd = calloc(n ? n : 1, sizeof *g->wd);
    g->xd = calloc(n ? n : 1, sizeof *g->xd);
    g->outs = calloc(n ? n : 1, sizeof *g->outs);
    g->hist = calloc(n + 1, sizeof *g->hist);
  }
  if (!g || !g->grads || !g->shapes || !g->gmap || !g->wd || !g->xd || !g->outs || !g->hist) {
    glm_gr_destroy(g);
    return glm_fail(c, BX_ENOMEM, "gradient reduction: out of memory");
  }
  for (size_t i = 0, at = 0; i < n; i++) {
    DLTensor d = grads[i];
    if (d.ndim > 0) memcpy(g->shapes + at, d.shape, (size_t)d.ndim * sizeof(int64_t));
    d.shape = g->shapes + at;
    d.data = NULL;
    d.strides = NULL;
    d.byte_offset = 0;
    g->grads[i] = d;
    at += (size_t)(d.ndim > 0 ? d.ndim : 0);
    int w = where ? where[i] : GLM_GR_ALL;
    if (w == GLM_GR_ALL) {
      g->gmap[i] = (int64_t)g->nw;
      g->wd[g->nw++] = d;
    } else if (w == GLM_GR_LOCAL) {
      g->gmap[i] = -2 - (int64_t)g->nx;
      g->xd[g->nx++] = d;
    } else {
      g->gmap[i] = -1;
    }
  }
  g->n = n;
  g->C = C;
  g->total = total_tokens;
  g->mode = mode;
  g->phase = -1;
  *out = g;
  return 0;
}

/* The state holding entry i of a history (i < n: gradient tensor i; i ==
 * n: the loss) and its index there, *t; NULL for an absent tensor. */
static bx_tokred *state_of(const glm_gr *g, size_t i, size_t *t) {
  if (i == g->n) return *t = 0, g->sl;
  int64_t m = g->gmap[i];
  *t = m >= 0 ? (size_t)m : m <= -2 ? (size_t)(-2 - m) : 0;
  return m >= 0 ? g->s : m <= -2 ? g->sx : NULL;
}

static void free_states(glm_gr *g) {
  bx_tokred_destroy(g->s);
  bx_tokred_destroy(g->sx);
  bx_tokred_destroy(g->sl);
  g->s = g->sx = g->sl = NULL;
}

void glm_gr_destroy(glm_gr *g) {
  if (!g) return;
  free_states(g);
  free(g->grads);
  free(g->shapes);
  free(g->gmap);
  free(g->wd);
  free(g->xd);
  free(g->outs);
  free(g->mb);
  free(g->hist);
  free(g);
}

static const char *const PHASE[] = {"idle", "pass 0", "pass 1", "pass 1 all-reduced"};

static int wrong_phase(glm_nctx *c, const glm_gr *g, const char *what, const char *want) {
  return glm_fail(c, BX_EINVAL, "gradient reduction: %s in phase '%s', expected %s (begin, the "
                  "micro-batches, agree, the same micro-batches, allreduce, finish)", what,
                  PHASE[g->phase + 1], want);
}

static int begin(glm_gr *g, const int *bounds, int flag, glm_nctx *c) {
  g->phase = -1;
  g->nmb = g->at = 0;
  g->one_pass = g->stated = g->overflowed = 0;
  bx_tokred_opts to = BX_TOKRED_OPTS_DEFAULT;
  to.mode = g->mode;
  to.on_bound = flag ? BX_TOKRED_BOUND_FLAG : BX_TOKRED_BOUND_FAIL;
  float unused = 0;
  glm_view vl;
  /* the last step's states, cleared in place (no allocation, no page faults on the words) */
  if (!g->s || bx_tokred_reset(g->s, &to) != BX_OK || (g->sx && bx_tokred_reset(g->sx, &to) != BX_OK) ||
      bx_tokred_reset(g->sl, &to) != BX_OK)
    free_states(g);
  if (!g->s && (glm_ck(c, bx_tokred_create(g->wd, g->nw, g->C, g->total, &to, &g->s), "gradient state") ||
      (g->nx && glm_ck(c, bx_tokred_create(g->xd, g->nx, g->C, g->total, &to, &g->sx),
                       "gradient state (local tensors)")) ||
      glm_ck(c, bx_tokred_create(glm_f32_host(&vl, &unused, 0, 0, 0, 0), 1, g->C, g->total, &to, &g->sl),
             "loss state"))) {
    free_states(g);
    return -1;
  }
  if (bounds) {
    for (size_t i = 0; i <= g->n; i++) {
      size_t t;
      bx_tokred *s = state_of(g, i, &t);
      if (s && glm_ck(c, bx_tokred_bound_exp(s, t, bounds[i]),
                      i == g->n ? "stated bound (loss)" : "stated bound")) {
        free_states(g);
        return -1;
      }
    }
    g->stated = 1;
  }
  g->phase = 0;
  return 0;
}

int glm_gr_begin(glm_gr *g, glm_nctx *c) { return begin(g, NULL, 0, c); }

int glm_gr_begin_stated(glm_gr *g, const int *bounds, int flag, glm_nctx *c) {
  if (!bounds) return glm_fail(c, BX_EINVAL, "gradient reduction: begin_stated: bounds is NULL");
  for (size_t i = 0; i <= g->n; i++)
    if (bounds[i] < -149 || bounds[i] > 128)
      return glm_fail(c, BX_EINVAL, "gradient reduction: begin_stated: bound %d of %s %zu is "
                      "outside [-149, 128]", bounds[i], i == g->n ? "the loss, entry" : "tensor", i);
  return begin(g, bounds, flag, c);
}

int glm_gr_micro_batch(glm_gr *g, int64_t tok0, int64_t T, glm_nctx *c) {
  if (g->phase != 0 && g->phase != 1) return wrong_phase(c, g, "micro_batch", "pass 0 or 1");
  if (T < 1) return glm_fail(c, BX_EINVAL, "gradient reduction: micro-batch of %lld tokens", (long long)T);
  int64_t cb, ce;
  if (glm_ck(c, bx_tokred_chunks(g->s, tok0, tok0 + T, &cb, &ce), "micro-batch")) return -1;
  if (g->phase == 0) {
    if (g->nmb == g->capmb) {
      size_t cap = g->capmb ? 2 * g->capmb : 16;
      int64_t *q = realloc(g->mb, 2 * cap * sizeof *q);
      if (!q) return glm_fail(c, BX_ENOMEM, "gradient reduction: out of memory");
      g->mb = q;
      g->capmb = cap;
    }
    g->mb[2 * g->nmb] = tok0;
    g->mb[2 * g->nmb + 1] = T;
    g->nmb++;
  } else if (!g->one_pass) {
    if (g->at >= g->nmb)
      return glm_fail(c, BX_EINVAL, "gradient reduction: pass 1 runs more micro-batches than "
                      "pass 0's %zu (tokens %lld + %lld)", g->nmb, (long long)tok0, (long long)T);
    if (g->mb[2 * g->at] != tok0 || g->mb[2 * g->at + 1] != T)
      return glm_fail(c, BX_EINVAL, "gradient reduction: pass 1 must repeat pass 0's "
                      "micro-batches in order; got tokens (%lld, %lld), expected (%lld, %lld)",
                      (long long)tok0, (long long)T, (long long)g->mb[2 * g->at],
                      (long long)g->mb[2 * g->at + 1]);
    g->at++;
  }
  glm_gr_bind(g, c);
  c->pass = g->phase;
  c->tok0 = tok0;
  c->chunk0 = cb;
  return 0;
}

void glm_gr_bind(const glm_gr *g, glm_nctx *c) {
  c->s = g->s;
  c->sx = g->sx;
  c->grads = g->wd;
  c->ngrads = g->nw;
  c->gmap = g->gmap;
  c->ngmap = g->n;
}

int glm_gr_agree(glm_gr *g, const bx_comm *comm, const bx_comm *xcomm, glm_nctx *c) {
  if (g->phase != 0) return wrong_phase(c, g, "agree", "pass 0");
  if (g->nmb == 0 && g->mode != BX_TOKRED_ORDINARY && !g->stated)
    return glm_fail(c, BX_EINVAL, "gradient reduction: agree: pass 0 ran no micro-batch (and "
                    "no grid was stated)");
  if (g->nmb > 0 && g->stated)
    return glm_fail(c, BX_EINVAL, "gradient reduction: agree: a stated grid is agreed before "
                    "any micro-batch (the step is one pass)");
  if (glm_ck(c, bx_tokred_agree(g->s, comm), "agree") ||
      (g->sx && glm_ck(c, bx_tokred_agree(g->sx, xcomm), "agree (local tensors)")) ||
      glm_ck(c, bx_tokred_agree(g->sl, comm), "agree (loss)")) {
    g->phase = -1; /* a failed agreement ends the step: begin again */
    return -1;
  }
  g->phase = 1;
  g->one_pass = g->nmb == 0; /* ordinary mode or a stated grid: the step is one pass */
  return 0;
}

/* g->hist and g->overflowed from the all-reduced states: every tensor's
 * observed exponent and the loss's (over comm, the local tensors' over
 * xcomm). With local tensors, one small MAX over comm makes the flag the
 * whole world's (the local tensors' flags were combined over xcomm only:
 * every rank must take the same decision) and gives absent tensors their
 * holders' values (`bitexact train` under expert parallelism: every rank
 * lists every expert in the same order, so rank 0 saves the whole
 * history); a local tensor keeps its own value (the bindings list only
 * their held experts, so an index names different experts on different
 * ranks). */
static int observe(glm_gr *g, const bx_comm *comm, glm_nctx *c) {
  int64_t fl = 0, f;
  for (size_t i = 0; i <= g->n; i++) {
    size_t t;
    bx_tokred *s = state_of(g, i, &t);
    int e = -149;
    if (s && glm_ck(c, bx_tokred_observed(s, t, &e, &f), "observed")) return -1;
    g->hist[i] = e;
    fl |= s ? f != 0 : 0;
  }
  if (g->sx && comm && g->mode == BX_TOKRED_GRID) {
    int64_t *w = malloc((g->n + 2) * sizeof *w);
    if (!w) return glm_fail(c, BX_ENOMEM, "gradient reduction: out of memory");
    for (size_t i = 0; i <= g->n; i++) w[i] = g->hist[i];
    w[g->n + 1] = fl;
    int rc = comm->allreduce_i64(w, g->n + 2, BX_OP_MAX, comm->ctx);
    for (size_t i = 0; rc == 0 && i < g->n; i++)
      if (g->gmap[i] == -1) g->hist[i] = (int)w[i];
    if (rc == 0) fl = w[g->n + 1];
    free(w);
    if (rc != 0)
      return glm_fail(c, BX_ECOMM, "gradient reduction: the all-reduce of the observed exponents "
                      "failed (%d)", rc);
  }
  g->overflowed = fl != 0;
  return 0;
}

int glm_gr_allreduce(glm_gr *g, const bx_comm *comm, const bx_comm *xcomm, glm_nctx *c) {
  if (g->phase != 1) return wrong_phase(c, g, "allreduce", "pass 1");
  if (g->at != g->nmb)
    return glm_fail(c, BX_EINVAL, "gradient reduction: pass 1 ran %zu of pass 0's %zu "
                    "micro-batches", g->at, g->nmb);
  g->phase = -1; /* until both all-reduces succeeded */
  if (glm_ck(c, bx_tokred_allreduce(g->s, comm), "allreduce") ||
      (g->sx && glm_ck(c, bx_tokred_allreduce(g->sx, xcomm), "allreduce (local tensors)")) ||
      glm_ck(c, bx_tokred_allreduce(g->sl, comm), "allreduce (loss)"))
    return -1;
  if (observe(g, comm, c)) return -1;
  g->phase = 2;
  return 0;
}

void glm_gr_stated_bounds(const int *hist, size_t n1, int *bounds) {
  int top = -149; /* the largest gradient history (the loss, last, apart) */
  for (size_t i = 0; hist && i + 1 < n1; i++) top = hist[i] > top ? hist[i] : top;
  for (size_t i = 0; i < n1; i++) {
    int h = hist ? hist[i] : -149;
    if (hist && h == -149 && i + 1 < n1) h = top; /* never seen an addend: the model's largest */
    int e = hist ? h + GLM_GR_MARGIN : -149;
    bounds[i] = e > 128 ? 128 : e < -149 ? -149 : e;
  }
}

void glm_gr_peer_bounds(const int32_t *peer, size_t n, int *gmax, size_t npeer, int *bounds) {
  for (size_t i = 0; i < n; i++)
    if (peer[i] >= 0 && (size_t)peer[i] < npeer && bounds[i] > gmax[peer[i]]) gmax[peer[i]] = bounds[i];
  for (size_t i = 0; i < n; i++)
    if (peer[i] >= 0 && (size_t)peer[i] < npeer) bounds[i] = gmax[peer[i]];
}

void glm_gr_next_history(const int *prev, const int *observed, size_t n1, int *next) {
  for (size_t i = 0; i < n1; i++) {
    int d = prev ? prev[i] - GLM_GR_DECAY : -149;
    next[i] = observed[i] > d ? observed[i] : d < -149 ? -149 : d;
  }
}

int glm_gr_history(const glm_gr *g, int *hist, int *overflowed) {
  if (g->phase != 2) return -1;
  if (hist) memcpy(hist, g->hist, (g->n + 1) * sizeof *hist);
  if (overflowed) *overflowed = g->overflowed;
  return 0;
}

int glm_gr_finish(glm_gr *g, DLTensor *outs, DLTensor *loss, int64_t divisor, int *has_loss,
                  glm_nctx *c) {
  if (g->phase != 2) return wrong_phase(c, g, "finish", "pass 1 all-reduced");
  int any = 1; /* ordinary mode (`bitexact train`'s control): every micro-batch adds its loss */
  if (g->mode == BX_TOKRED_GRID) {
    int64_t *w;
    size_t nw;
    if (glm_ck(c, bx_tokred_words(g->sl, &w, &nw), "loss words")) return -1;
    any = 0; /* the words: the element, the non-finite count, then one coverage word per chunk */
    for (size_t i = 2; i < nw; i++) any |= w[i] != 0;
  }
  DLTensor *wo = g->outs, *xo = g->outs + g->nw;
  for (size_t i = 0; i < g->n; i++) {
    if (g->gmap[i] >= 0) wo[g->gmap[i]] = outs[i];
    else if (g->gmap[i] <= -2) xo[-2 - g->gmap[i]] = outs[i];
  }
  int lo = any && loss;
  /* every state checked first: a failure writes no gradient and no loss */
  if (glm_ck(c, bx_tokred_finish_check(g->s, wo, g->nw, 1), "finish") ||
      (g->sx && glm_ck(c, bx_tokred_finish_check(g->sx, xo, g->nx, 1), "finish (local tensors)")) ||
      (lo && glm_ck(c, bx_tokred_finish_check(g->sl, loss, 1, divisor), "finish (loss)")))
    return -1;
  if (glm_ck(c, bx_tokred_finish(g->s, wo, g->nw, 1), "finish") ||
      (g->sx && glm_ck(c, bx_tokred_finish(g->sx, xo, g->nx, 1), "finish (local tensors)")) ||
      (lo && glm_ck(c, bx_tokred_finish(g->sl, loss, 1, divisor), "finish (loss)")))
    return -1;
  if (has_loss) *has_loss = any;
  g->phase = -1;
  return 0;
}

const DLTensor *glm_gr_grads(const glm_gr *g, size_t *n) {
  *n = g->n;
  return g->grads;
}

bx_tokred *glm_gr_state(const glm_gr *g) { return g->s; }
bx_tokred *glm_gr_local_state(const glm_gr *g) { return g->sx; }
int glm_gr_absent(const glm_gr *g, size_t i) { return i < g->n && g->gmap[i] == -1; }
bx_tokred *glm_gr_loss_state(const glm_gr *g) { return g->sl; }
int glm_gr_pass(const glm_gr *g) { return g->phase; }
