/*
 * train_step.c — tr_model_grad (train_model.h): the forward + backward of
 * every local micro-batch through the step's gradient reduction (glm_gr:
 * the protocol object the bindings' GradReduction uses too) and the
 * all-reduce over ranks. Grid mode is one pass on a grid stated from the
 * history (glm_gr_stated_bounds: the history + GLM_GR_MARGIN); when
 * an add breaks it (or there is no history), the step runs again on the
 * observed grid (docs/train_model.md, "The one-pass invariant step").
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train_model_internal.h"

/* The model's forward on the micro-batch in c->w: the logits in w->logits. */
static int forward_logits(tr_ctx *c) {
  tr_model *m = c->m;
  tr_work *w = c->w;
  int64_t T = w->T, H = m->c.hidden_size, NL = m->c.num_hidden_layers;
  glm_view v[3];
  bx_embedding_opts eo = BX_EMBEDDING_OPTS_DEFAULT;
  eo.num_threads = c->n.threads;
  if (tr_ck(c, bx_embedding_forward(glm_f32(&v[0], m->p[m->embed].data, 2, m->c.vocab_size, H, 0),
                                    glm_i32(&v[1], w->ids, T), glm_f32(&v[2], w->act[0].x_in, 2, T, H, 0), &eo),
            "embed_tokens") ||
      tr_trace_rows(c, 0, -1, "model.embed_tokens", w->act[0].x_in, H))
    return -1;
  for (int64_t l = 0; l < NL; l++) {
    float *out = l + 1 < NL ? w->act[l + 1].x_in : w->x_final;
    if (tr_attention_forward(c, l)) return -1;
    if ((m->lx[l].moe ? tr_moe_forward(c, l, out) : tr_dense_mlp_forward(c, l, out)) ||
        tr_trace_rows(c, 0, l, "mlp", out, H))
      return -1;
    const float *h1 = w->act[l].h1;
    for (int64_t i = 0; i < T * H; i++) out[i] = h1[i] + out[i];
    if (tr_trace_rows(c, 0, l, NULL, out, H)) return -1;
  }
  return tr_head_forward(c);
}

/* The model's forward on the micro-batch in c->w, then the loss (its
 * chunk partials bounded or added to sl) and the backward. */
static int micro_batch(tr_ctx *c, bx_tokred *sl, float *token_losses) {
  tr_model *m = c->m;
  tr_work *w = c->w;
  int64_t T = w->T, H = m->c.hidden_size, NL = m->c.num_hidden_layers;
  glm_view v[8];
  if (forward_logits(c)) return -1;
  if (c->n.fault && c->n.fault(c->n.fault_ctx, "loss")) w->logits[0] = NAN; /* test-only */
  /* the loss of the global token mean: dlogits in place of the logits */
  if (glm_xent_fwd(&c->n, sl, w->logits, T, m->c.vocab_size, glm_i32(&v[1], w->targets, T),
                   c->n_global, w->C, -100, w->losses, w->loss_partials, w->logits, NULL))
    return -1;
  if (c->n.pass == 1 && token_losses) memcpy(token_losses, w->losses, (size_t)T * sizeof(float));
  /* backward */
  if (tr_head_backward(c)) return -1;
  for (int64_t l = NL - 1; l >= 0; l--) {
    if ((m->lx[l].moe ? tr_moe_backward(c, l, w->s.dx, w->s.dtmp)
                      : tr_dense_mlp_backward(c, l, w->s.dx, w->s.dtmp)) ||
        tr_trace_rows(c, 1, l, "mlp", w->s.dtmp, H))
      return -1;
    if (tr_post_norm_backward(c, l) || tr_attention_backward(c, l)) return -1;
  }
  return glm_embedding_bwd(&c->n, glm_i32(&v[0], w->ids, T), w->s.dx, T, H, m->c.vocab_size, w->C, -1,
                           w->emb_row_ids, w->emb_rows, w->emb_offsets, m->embed);
}

/* The micro-batch's token ids, targets and positions from q sequences
 * of L + 1 tokens. */
static void load_tokens(tr_work *w, const int32_t *tokens, int64_t nseq, int64_t L) {
  for (int64_t q = 0; q < nseq; q++) {
    const int32_t *seq = tokens + q * (L + 1);
    for (int64_t i = 0; i < L; i++) {
      w->ids[q * L + i] = seq[i];
      w->targets[q * L + i] = seq[i + 1];
      w->positions[q * L + i] = i;
    }
  }
}

/* The end of a pass over the micro-batches under expert parallelism (tr_model.h,
 * "Failures"): the EP group's status step, or this rank's drain when it failed here (a
 * failure learned from a peer needs none: the group knows). rc: the pass's result. */
static int pass_end(tr_ctx *c, int rc) {
  if (!rc) return tr_ep_status(c, 0);
  if (!c->n.learned) tr_ep_status(c, 1);
  return -1;
}

/* The world's agreement on the step so far (tr_model.h, "Failures"): one MAX all-reduce of
 * one word, nonzero where a rank failed (2^40 - its rank: the lowest failed rank wins), so a
 * rank that failed locally meets the others here instead of leaving them in the next
 * collective. 0 when no rank failed; -1 when this one did (err as it was); -1 with
 * c->n.learned and err naming the rank when another one did. */
static int step_agree(tr_ctx *c, const bx_comm *comm, int failed, const char *before) {
  if (!comm) return failed ? -1 : 0;
  const int64_t top = (int64_t)1 << 40;
  int64_t v = failed ? top - (comm->rank > 0 ? comm->rank : 0) : 0;
  if (comm->allreduce_i64(&v, 1, BX_OP_MAX, comm->ctx) != 0) {
    if (!failed) snprintf(c->n.err, c->n.errlen, "the step's agreement before %s failed", before);
    return -1;
  }
  if (failed) return -1;
  if (v == 0) return 0;
  c->n.learned = 1;
  snprintf(c->n.err, c->n.errlen, "rank %lld failed before %s", (long long)(top - v), before);
  return -1;
}

/* Every local micro-batch once through g's current pass. */
static int run_micro_batches(tr_ctx *c, glm_gr *g, const int32_t *tokens, int64_t first_seq,
                             int64_t micro_batches, int64_t mb, float *token_losses) {
  tr_work *w = c->w;
  int64_t L = c->L, T = mb * L;
  if (c->trace && c->trace->pass) c->trace->pass(c->trace->ctx); /* only the last pass is traced */
  int rc = 0;
  for (int64_t b = 0; b < micro_batches && !rc; b++) {
    int64_t s0 = b * mb;
    rc = glm_gr_micro_batch(g, (first_seq + s0) * L, T, &c->n) ? -1 : 0;
    if (!rc) load_tokens(w, tokens + s0 * (L + 1), mb, L);
    if (!rc && micro_batch(c, glm_gr_loss_state(g), token_losses ? token_losses + s0 * L : NULL))
      rc = -1;
  }
  return pass_end(c, rc);
}

static int check_args(const tr_model *m, const tr_run_opts *o, const int32_t *tokens,
                      int64_t local_seqs, int64_t first_seq, int64_t global_seqs,
                      int64_t micro_batches, char *err, size_t errlen) {
  if (!m || !o || !tokens) {
    snprintf(err, errlen, "tr_model_grad: NULL argument");
    return -1;
  }
  if (o->threads < 0 || o->seq_len < 1 || o->seq_len > m->c.max_position_embeddings ||
      (o->mode != BX_TOKRED_GRID && o->mode != BX_TOKRED_ORDINARY)) {
    snprintf(err, errlen, "tr_model_grad: bad run options (threads %d, seq_len %lld: 1 .. "
             "max_position_embeddings %lld, mode %d)", o->threads, (long long)o->seq_len,
             (long long)m->c.max_position_embeddings, (int)o->mode);
    return -1;
  }
  if (local_seqs < 1 || micro_batches < 1 || local_seqs % micro_batches || first_seq < 0 ||
      global_seqs < first_seq + local_seqs || global_seqs > (INT64_MAX / 4) / (o->seq_len + 1)) {
    snprintf(err, errlen, "tr_model_grad: layout does not fit: %lld local sequences from %lld of %lld "
             "in %lld micro-batches (must divide)", (long long)local_seqs, (long long)first_seq,
             (long long)global_seqs, (long long)micro_batches);
    return -1;
  }
  int64_t n = local_seqs * (o->seq_len + 1), V = m->c.vocab_size;
  for (int64_t i = 0; i < n; i++)
    if (tokens[i] < 0 || tokens[i] >= V) {
      snprintf(err, errlen, "tr_model_grad: token %lld of local sequence %lld is %ld, outside [0, %lld)",
               (long long)(i % (o->seq_len + 1)), (long long)(i / (o->seq_len + 1)), (long)tokens[i],
               (long long)V);
      return -1;
    }
  return 0;
}

/* The work buffers of micro-batches of T tokens in chunks of C, and the
 * node context of a pass over local_tokens of n_global (bf16 weight copies
 * refreshed). fn names the caller in errors. 0 / -1 with err. */
static int pass_ctx(tr_ctx *c, tr_model *m, const tr_run_opts *o, int64_t T, int64_t C,
                    int64_t n_global, int64_t local_tokens, const char *fn, char *err,
                    size_t errlen) {
  if (o->fault && o->fault(o->fault_ctx, "alloc")) {
    snprintf(err, errlen, "%s: out of memory (micro-batch of %lld tokens): injected fault "
             "(BITEXACT_FAULT)", fn, (long long)T);
    return -1;
  }
  if (!m->work || m->work->T != T || m->work->C != C) {
    tr_work *nw = tr_work_make(m, T, C);
    if (!nw) {
      snprintf(err, errlen, "%s: out of memory (micro-batch of %lld tokens)", fn, (long long)T);
      return -1;
    }
    tr_model_set_work(m, nw);
  }
  memset(c, 0, sizeof *c);
  c->n.threads = o->threads;
  c->n.ws = &m->ws;
  c->n.grads = m->grad_t;
  c->n.ngrads = m->nparams;
  c->n.err = err;
  c->n.errlen = errlen;
  c->n.fault = o->fault;
  c->n.fault_ctx = o->fault_ctx;
  c->m = m;
  c->w = m->work;
  c->mode = o->mode;
  c->L = o->seq_len;
  c->n_global = n_global;
  c->local_tokens = local_tokens;
  c->bf16 = o->bf16;
  if (o->bf16 && tr_bf16_weights(m, o->threads)) {
    snprintf(err, errlen, "%s: out of memory (bf16 weight copies)", fn);
    return -1;
  }
  return 0;
}

int tr_model_grad(tr_model *m, const tr_run_opts *o, const int32_t *tokens, int64_t local_seqs,
                  int64_t first_seq, int64_t global_seqs, int64_t micro_batches,
                  const bx_comm *comm, float *loss, float *token_losses, char *err,
                  size_t errlen) {
  if (!m || !o) return snprintf(err, errlen, "tr_model_grad: NULL argument"), -1;
  tr_ctx c;
  memset(&c, 0, sizeof c);
  c.n.err = err;
  c.n.errlen = errlen;
  /* this rank's checks and buffers: a failure is agreed before the first collective */
  int failed = check_args(m, o, tokens, local_seqs, first_seq, global_seqs, micro_batches, err, errlen);
  int64_t L = o->seq_len, mb = failed ? 1 : local_seqs / micro_batches, T = mb * L;
  /* grid: a chunk is a sequence; ordinary: a micro-batch (a framework's sum) */
  int64_t C = o->mode == BX_TOKRED_GRID ? L : T;
  if (!failed && o->mode == BX_TOKRED_ORDINARY && (first_seq % mb || global_seqs % mb)) {
    snprintf(err, errlen, "tr_model_grad: ordinary mode needs micro-batches of %lld sequences that "
             "tile the global batch", (long long)mb);
    failed = 1;
  }
  if (!failed && pass_ctx(&c, m, o, T, C, global_seqs * L, local_seqs * L, "tr_model_grad", err, errlen))
    failed = 1;
  c.n.err = err; /* pass_ctx's reset, or its failure */
  c.n.errlen = errlen;
  c.trace = o->trace;
  if (m->ep) m->ep->a2a_bytes = m->ep->ar_world_words = m->ep->ar_replica_words = 0;
  glm_gr *g = NULL; /* the step's gradient reduction: the protocol */
  int rc = -1, has_loss = 0;
  glm_view vl;
  float lsum = 0;
  DLTensor *tl = glm_f32_host(&vl, &lsum, 0, 0, 0, 0); /* the loss: one 0-d tensor */
  /* expert parallelism (grid mode): the experts this rank holds are reduced over their
   * replicas only, those it does not hold have no state here (their gradients untouched) */
  const bx_comm *xcomm = m->ep ? m->ep->replica : NULL;
  int ep_where = tr_ep_active(m) && o->mode == BX_TOKRED_GRID;
  if (!failed && m->gr && (m->gr_C != C || m->gr_total != c.n_global || m->gr_mode != (int)o->mode ||
                           m->gr_ep != ep_where)) {
    glm_gr_destroy(m->gr);
    m->gr = NULL;
  }
  if (!failed && !m->gr) { /* the reduction of this step's shape, kept for the next steps */
    unsigned char *where = NULL;
    if (ep_where) {
      if (!(where = calloc(m->nparams, 1))) {
        snprintf(err, errlen, "tr_model_grad: out of memory");
        failed = 1;
      }
      for (size_t t = 0; where && t < m->nparams; t++)
        if (m->p[t].group == TR_GROUP_EXPERT)
          where[t] = tr_ep_holds(m->ep, m->c.n_routed_experts, m->p[t].expert) ? GLM_GR_LOCAL
                                                                               : GLM_GR_ABSENT;
    }
    if (!failed && glm_gr_create(m->grad_t, m->nparams, where, C, c.n_global, o->mode, &m->gr, &c.n))
      failed = 1;
    free(where);
    m->gr_C = C;
    m->gr_total = c.n_global;
    m->gr_mode = (int)o->mode;
    m->gr_ep = ep_where;
  }
  g = m->gr;
  size_t nh = m->nparams + 1;
  int *bounds = failed ? NULL : malloc(nh * sizeof *bounds);
  if (!failed && !bounds) {
    snprintf(err, errlen, "tr_model_grad: out of memory");
    failed = 1;
  }
  m->last_passes = 0;
  if (o->mode == BX_TOKRED_GRID) {
    /* attempt 1: the grid stated from the history (none: every bound -149, so any non-zero
     * partial flags and the attempt only observes); attempt 2, when an add broke it: the
     * observed exponents, which hold (the partials are recomputed bit for bit). Each
     * attempt agrees the ranks' status before the grid's agreement and before the words'
     * all-reduce (a rank that failed in between meets the others there). */
    if (!failed) {
      glm_gr_stated_bounds(m->hist_ok && !o->two_pass ? m->hist : NULL, nh, bounds);
      if (m->hist_ok && !o->two_pass) { /* the history holds every rank's experts: no extra */
        for (size_t k = 0; k < m->npeer; k++) m->peer_max[k] = -149;
        glm_gr_peer_bounds(m->peer, m->nparams, m->peer_max, m->npeer, bounds);
      }
    }
    for (int attempt = 0; attempt < 2; attempt++) {
      int over = 0;
      if (!failed && glm_gr_begin_stated(g, bounds, attempt == 0, &c.n)) failed = 1;
      if (step_agree(&c, comm, failed, "the grid's agreement") || glm_gr_agree(g, comm, xcomm, &c.n))
        goto done;
      failed = run_micro_batches(&c, g, tokens, first_seq, micro_batches, mb, token_losses) != 0;
      if (step_agree(&c, comm, failed, "the gradients' all-reduce") ||
          glm_gr_allreduce(g, comm, xcomm, &c.n) || glm_gr_history(g, bounds, &over))
        goto done;
      m->last_passes = attempt + 1;
      if (!over) break;
      if (attempt == 1) { /* not reached: the recomputed partials differ from the observed */
        snprintf(err, errlen, "tr_model_grad: the step broke its own observed grid (a "
                 "non-deterministic partial?)");
        goto done;
      }
    }
    glm_gr_next_history(m->hist_ok ? m->hist : NULL, bounds, nh, m->hist);
    m->hist_ok = 1;
  } else {
    /* ordinary mode (the framework baseline) is one pass: its bounds would have no effect, so
     * the grid is agreed first and the micro-batches run once, adding */
    if (!failed && glm_gr_begin(g, &c.n)) failed = 1;
    for (int pass = failed ? 1 : !o->two_pass; pass < 2; pass++) {
      if (pass == 1 && (step_agree(&c, comm, failed, "the grid's agreement") ||
                        glm_gr_agree(g, comm, xcomm, &c.n)))
        goto done;
      failed = run_micro_batches(&c, g, tokens, first_seq, micro_batches, mb, token_losses) != 0;
      if (failed && pass == 0) continue; /* agreed before the grid's agreement */
      if (failed) break;
      m->last_passes++;
    }
    if (step_agree(&c, comm, failed, "the gradients' all-reduce") ||
        glm_gr_allreduce(g, comm, xcomm, &c.n))
      goto done;
  }
  if (m->ep && o->mode == BX_TOKRED_GRID) { /* the summary's communication figures */
    int64_t *wd;
    size_t nw = 0;
    if (comm && bx_tokred_words(glm_gr_state(g), &wd, &nw) == BX_OK) m->ep->ar_world_words += (int64_t)nw;
    if (xcomm && glm_gr_local_state(g) && bx_tokred_words(glm_gr_local_state(g), &wd, &nw) == BX_OK)
      m->ep->ar_replica_words += (int64_t)nw;
  }
  if (glm_gr_finish(g, m->grad_t, tl, c.n_global, &has_loss, &c.n)) goto done;
  if (loss) *loss = lsum;
  rc = 0;
done:
  free(bounds);
  return rc == 0 ? 0 : c.n.learned ? -2 : -1;
}

int tr_model_eval(tr_model *m, const tr_run_opts *o, const int32_t *tokens, int64_t local_seqs,
                  int64_t first_seq, int64_t micro_batches, float *seq_losses, char *err,
                  size_t errlen) {
  if (!m || !o) return snprintf(err, errlen, "tr_model_eval: NULL argument"), -1;
  tr_ctx c;
  memset(&c, 0, sizeof c);
  c.m = m;
  c.n.err = err;
  c.n.errlen = errlen;
  /* under expert parallelism a failure anywhere here is this rank's drain (pass_end): the
   * group's other ranks learn it at their next exchange */
  if (check_args(m, o, tokens, local_seqs, first_seq, first_seq + local_seqs, micro_batches, err,
                 errlen))
    return pass_end(&c, -1);
  int64_t L = o->seq_len, mb = local_seqs / micro_batches, T = mb * L;
  /* the training step's work buffers where their micro-batch is this one's */
  int64_t C = m->work && m->work->T == T ? m->work->C : L;
  if (pass_ctx(&c, m, o, T, C, local_seqs * L, local_seqs * L, "tr_model_eval", err, errlen)) {
    c.m = m;
    return pass_end(&c, -1);
  }
  bx_xent_opts xo = BX_XENT_OPTS_DEFAULT;
  xo.num_threads = o->threads;
  int rc = 0;
  for (int64_t b = 0; b < micro_batches && !rc; b++) {
    tr_work *w = c.w;
    load_tokens(w, tokens + b * mb * (L + 1), mb, L);
    c.n.tok0 = (first_seq + b * mb) * L; /* the rows' global token ids (expert exchange) */
    c.n.chunk0 = c.n.tok0 / C;
    if (forward_logits(&c)) {
      rc = -1;
      break;
    }
    glm_view v[4];
    /* chunks of one sequence: each sequence's loss sum, as the training loss's partials,
     * into the model's memory (a view must cover glm_mem memory: with --device cuda the
     * kernel writes it), then to the caller's host array */
    if (tr_ck(&c, bx_xent_forward(glm_f32(&v[0], w->logits, 2, T, m->c.vocab_size, 0),
                                  glm_i32(&v[1], w->targets, T), L, glm_f32(&v[2], w->losses, 1, T, 0, 0),
                                  glm_f32(&v[3], w->seq_losses, 1, mb, 0, 0), NULL, &xo),
              "eval cross-entropy"))
      rc = -1;
    else
      memcpy(seq_losses + b * mb, w->seq_losses, (size_t)mb * sizeof(float));
  }
  rc = pass_end(&c, rc);
  return rc == 0 ? 0 : c.n.learned ? -2 : -1;
}

int tr_eval_mean(const float *parts, int64_t n, int64_t per, int64_t stride, int64_t first,
                 int64_t chunk_tokens, int64_t total, const bx_comm *comm, float *mean, char *err,
                 size_t errlen) {
  glm_nctx c;
  memset(&c, 0, sizeof c);
  c.err = err;
  c.errlen = errlen;
  return glm_exact_mean(&c, parts, n, per, stride, first, chunk_tokens, total, total, comm, mean);
}
