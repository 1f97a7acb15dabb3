/*
 * _train_moe.c — the CPython binding of the training kernels, part 2: the
 * MoE router and token dispatch, the embedding and the cross-entropy
 * (bitexact_train.h). The rules of _train.c hold: C argument order, opts
 * fields keyword-only with the C defaults, caller-allocated outputs
 * written in place, GIL released, no numerics, errors naming the argument.
 */
#include "_bxpy.h"

#include "bitexact_train.h"

#define RULES                                                                               \
  "\nTensors: host, row-major contiguous; ids int32 or int64; maps, offsets, counts int64; "  \
  "an output\nshares no byte with another tensor. On error nothing is written. Threads: "       \
  "fixed pieces\nover the pool; bits independent of the count. GIL released."

/* ---- router -------------------------------------------------------------- */
#define ROUTER_KW "n_group=1, topk_group=1, norm_topk_prob=True, routed_scaling_factor=1.0, " \
                  "num_threads=0"
PyDoc_STRVAR(router_fwd_doc,
             "moe_router_forward(logits, bias, topk_ids, topk_weights, chunk_tokens=1, "
             "counts=None, *,\n" ROUTER_KW ")\n--\n\n"
             "transformers' Glm4MoeMoE routing (bx_moe_router_forward): sigmoid scores, "
             "group-limited\ntop-k on score + bias, ids written in ascending expert order, "
             "weights normalised\n(norm_topk_prob) and scaled. logits [T, E] fp32, bias [E] "
             "fp32, topk_ids [T, k] ids and\ntopk_weights [T, k] fp32 written; counts None or "
             "[ceil(T / chunk_tokens), E] int64\nwritten (per-chunk expert loads, integers: sum "
             "them in any order)." RULES);
static PyObject *k_router_fwd BXK_ARGS {
  (void)self;
  static char *kwl[] = {"logits", "bias", "topk_ids", "topk_weights", "chunk_tokens", "counts",
                        "n_group", "topk_group", "norm_topk_prob", "routed_scaling_factor",
                        "num_threads", NULL};
  static const char *const nm[] = {"logits", "bias", "topk_ids", "topk_weights", "counts"};
  static const signed char loc[] = {0, 1, 2, 3, 5}; /* chunk_tokens is argument 4 */
  PyObject *o[5] = {NULL, NULL, NULL, NULL, Py_None};
  long long ct = 1, ng, tg;
  bx_moe_router_opts op = BX_MOE_ROUTER_OPTS_DEFAULT;
  ng = op.n_group;
  tg = op.topk_group;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOO|LO$LLpdi:moe_router_forward", kwl, &o[0],
                                   &o[1], &o[2], &o[3], &ct, &o[4], &ng, &tg,
                                   &op.norm_topk_prob, &op.routed_scaling_factor,
                                   &op.num_threads))
    return NULL;
  op.n_group = (int64_t)ng;
  op.topk_group = (int64_t)tg;
  BXK_BEGIN(k, "moe_router_forward", nm, o, 4u | 8u | 16u, 16u);
  k.loc = loc;
  BXK_RUN(k, bx_moe_router_forward(k.p[0], k.p[1], k.p[2], k.p[3], (int64_t)ct, k.p[4], &op));
}

PyDoc_STRVAR(router_bwd_doc,
             "moe_router_backward(logits, topk_ids, dweights, dlogits, *, " ROUTER_KW ")\n--\n\n"
             "dlogits [T, E] (written) from dweights [T, k], the gradient of topk_weights, "
             "through the\nnormalisation and the sigmoid (bx_moe_router_backward); +0 for "
             "experts not chosen.\nlogits: the forward's input; topk_ids its output. The "
             "options must be the forward's\n(n_group, topk_group are checked, not used)." RULES);
static PyObject *k_router_bwd BXK_ARGS {
  (void)self;
  static char *kwl[] = {"logits", "topk_ids", "dweights", "dlogits", "n_group", "topk_group",
                        "norm_topk_prob", "routed_scaling_factor", "num_threads", NULL};
  static const char *const nm[] = {"logits", "topk_ids", "dweights", "dlogits"};
  PyObject *o[4];
  long long ng, tg;
  bx_moe_router_opts op = BX_MOE_ROUTER_OPTS_DEFAULT;
  ng = op.n_group;
  tg = op.topk_group;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOO|$LLpdi:moe_router_backward", kwl, &o[0],
                                   &o[1], &o[2], &o[3], &ng, &tg, &op.norm_topk_prob,
                                   &op.routed_scaling_factor, &op.num_threads))
    return NULL;
  op.n_group = (int64_t)ng;
  op.topk_group = (int64_t)tg;
  BXK_BEGIN(k, "moe_router_backward", nm, o, 8u, 0u);
  BXK_RUN(k, bx_moe_router_backward(k.p[0], k.p[1], k.p[2], k.p[3], &op));
}

PyDoc_STRVAR(bias_upd_doc,
             "moe_bias_update(bias, counts, rate)\n--\n\n"
             "Auxiliary-loss-free balancing (bx_moe_bias_update): bias_e += sign(mean - "
             "count_e) * rate\nin exact integers then one fp32 rounding. bias [E] fp32 updated "
             "in place; counts [E] or\n[n, E] int64, the GLOBAL counts (rows summed in int64). "
             "Single-threaded; GIL released.");
static PyObject *k_bias_upd BXK_ARGS {
  (void)self;
  static char *kwl[] = {"bias", "counts", "rate", NULL};
  static const char *const nm[] = {"bias", "counts"};
  PyObject *o[2];
  double rate;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "OOd:moe_bias_update", kwl, &o[0], &o[1], &rate))
    return NULL;
  BXK_BEGIN(k, "moe_bias_update", nm, o, 1u, 0u);
  BXK_RUN(k, bx_moe_bias_update(k.p[0], k.p[1], rate));
}

/* ---- dispatch ------------------------------------------------------------ */
PyDoc_STRVAR(plan_doc,
             "moe_dispatch_plan(topk_ids, token_ids, offsets, row_map, pos, *, "
             "num_threads=0)\n--\n\n"
             "The R = T*k rows (t, j) sorted by (expert, global token id) "
             "(bx_moe_dispatch_plan).\ntopk_ids [T, k] ids; token_ids None (0..T-1) or [T] "
             "int64 strictly ascending; written:\noffsets [E+1] (expert e's rows [offsets[e], "
             "offsets[e+1])), row_map [R, 2] (t, j), pos\n[T, k] (the row of (t, j)), all "
             "int64." RULES);
static PyObject *k_plan BXK_ARGS {
  (void)self;
  static char *kwl[] = {"topk_ids", "token_ids", "offsets", "row_map", "pos", "num_threads",
                        NULL};
  static const char *const nm[] = {"topk_ids", "token_ids", "offsets", "row_map", "pos"};
  PyObject *o[5];
  bx_moe_dispatch_opts op = BX_MOE_DISPATCH_OPTS_DEFAULT;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOOO|$i:moe_dispatch_plan", kwl, &o[0], &o[1],
                                   &o[2], &o[3], &o[4], &op.num_threads))
    return NULL;
  BXK_BEGIN(k, "moe_dispatch_plan", nm, o, 4u | 8u | 16u, 2u);
  BXK_RUN(k, bx_moe_dispatch_plan(k.p[0], k.p[1], k.p[2], k.p[3], k.p[4], &op));
}

PyDoc_STRVAR(order_doc,
             "moe_dispatch_order(expert_ids, token_ids, offsets, order)\n--\n\n"
             "The order of rows gathered from many ranks (bx_moe_dispatch_order): order[i] = "
             "the input\nrow of place i sorted by (expert, token id). expert_ids [n] ids, "
             "token_ids [n] int64;\noffsets [E+1] and order [n] int64 written. "
             "Single-threaded; GIL released.");
static PyObject *k_order BXK_ARGS {
  (void)self;
  static char *kwl[] = {"expert_ids", "token_ids", "offsets", "order", NULL};
  static const char *const nm[] = {"expert_ids", "token_ids", "offsets", "order"};
  PyObject *o[4];
  if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOO:moe_dispatch_order", kwl, &o[0], &o[1],
                                   &o[2], &o[3]))
    return NULL;
  BXK_BEGIN(k, "moe_dispatch_order", nm, o, 4u | 8u, 0u);
  BXK_RUN(k, bx_moe_dispatch_order(k.p[0], k.p[1], k.p[2], k.p[3]));
}

PyDoc_STRVAR(chunks_doc,
             "moe_expert_chunks(token_ids, chunk_tokens, first_chunk, bounds)\n--\n\n"
             "The global chunks of one expert's rows (bx_moe_expert_chunks): token_ids [n] "
             "int64\nascending; bounds [m+1] int64 written, the expert's rows of chunk "
             "first_chunk + i being\n[bounds[i], bounds[i+1]). GIL released.");
static PyObject *k_chunks BXK_ARGS {
  (void)self;
  static char *kwl[] = {"token_ids", "chunk_tokens", "first_chunk", "bounds", NULL};
  static const char *const nm[] = {"token_ids", "bounds"};
  static const signed char loc[] = {0, 3};
  PyObject *o[2];
  long long ct, cb;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "OLLO:moe_expert_chunks", kwl, &o[0], &ct, &cb,
                                   &o[1]))
    return NULL;
  BXK_BEGIN(k, "moe_expert_chunks", nm, o, 2u, 0u);
  k.loc = loc;
  BXK_RUN(k, bx_moe_expert_chunks(k.p[0], (int64_t)ct, (int64_t)cb, k.p[1]));
}

PyDoc_STRVAR(permute_doc,
             "moe_permute(x, row_map, x_perm, *, num_threads=0)\n--\n\n"
             "x_perm[r] = x[row_map[r][0]] (bx_moe_permute): x [T, H] fp32, row_map [R, 2], "
             "x_perm [R, H]\nwritten (bits copied)." RULES);
static PyObject *k_permute BXK_ARGS {
  (void)self;
  static char *kwl[] = {"x", "row_map", "x_perm", "num_threads", NULL};
  static const char *const nm[] = {"x", "row_map", "x_perm"};
  PyObject *o[3];
  bx_moe_dispatch_opts op = BX_MOE_DISPATCH_OPTS_DEFAULT;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "OOO|$i:moe_permute", kwl, &o[0], &o[1], &o[2],
                                   &op.num_threads))
    return NULL;
  BXK_BEGIN(k, "moe_permute", nm, o, 4u, 0u);
  BXK_RUN(k, bx_moe_permute(k.p[0], k.p[1], k.p[2], &op));
}

PyDoc_STRVAR(permute_bwd_doc,
             "moe_permute_backward(dx_perm, row_map, pos, dx, *, num_threads=0)\n--\n\n"
             "dx[t] = sum over j ascending of dx_perm[pos[t][j]] in fp32 from +0, a gather "
             "(bx_moe_permute_backward).\ndx_perm [R, H], dx [T, H] written; row_map, pos a "
             "plan." RULES);
static PyObject *k_permute_bwd BXK_ARGS {
  (void)self;
  static char *kwl[] = {"dx_perm", "row_map", "pos", "dx", "num_threads", NULL};
  static const char *const nm[] = {"dx_perm", "row_map", "pos", "dx"};
  PyObject *o[4];
  bx_moe_dispatch_opts op = BX_MOE_DISPATCH_OPTS_DEFAULT;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOO|$i:moe_permute_backward", kwl, &o[0], &o[1],
                                   &o[2], &o[3], &op.num_threads))
    return NULL;
  BXK_BEGIN(k, "moe_permute_backward", nm, o, 8u, 0u);
  BXK_RUN(k, bx_moe_permute_backward(k.p[0], k.p[1], k.p[2], k.p[3], &op));
}

PyDoc_STRVAR(unpermute_doc,
             "moe_unpermute(y_perm, weights, row_map, pos, initial, out, *, num_threads=0)\n--\n\n"
             "out[t] = (sum over j ascending of f32(w[t][j] * y_perm[pos[t][j]])) (+ initial[t]) "
             "(bx_moe_unpermute:\ntransformers' CPU combine order). y_perm [R, H], weights [T, "
             "k], initial None or [T, H],\nout [T, H] written (not in place)." RULES);
static PyObject *k_unpermute BXK_ARGS {
  (void)self;
  static char *kwl[] = {"y_perm", "weights", "row_map", "pos", "initial", "out", "num_threads",
                        NULL};
  static const char *const nm[] = {"y_perm", "weights", "row_map", "pos", "initial", "out"};
  PyObject *o[6];
  bx_moe_dispatch_opts op = BX_MOE_DISPATCH_OPTS_DEFAULT;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOOOO|$i:moe_unpermute", kwl, &o[0], &o[1],
                                   &o[2], &o[3], &o[4], &o[5], &op.num_threads))
    return NULL;
  BXK_BEGIN(k, "moe_unpermute", nm, o, 32u, 16u);
  BXK_RUN(k, bx_moe_unpermute(k.p[0], k.p[1], k.p[2], k.p[3], k.p[4], k.p[5], &op));
}

PyDoc_STRVAR(unpermute_bwd_doc,
             "moe_unpermute_backward(dout, y_perm, weights, row_map, pos, dy_perm, dweights, *, "
             "num_threads=0)\n--\n\n"
             "dy_perm[r] = f32(w[t][j] * dout[t]) and dweights[t][j] = fmaf chain over h of "
             "dout * y_perm\n(bx_moe_unpermute_backward). dy_perm [R, H], dweights [T, k] "
             "written; either may be None,\nnot both." RULES);
static PyObject *k_unpermute_bwd BXK_ARGS {
  (void)self;
  static char *kwl[] = {"dout", "y_perm", "weights", "row_map", "pos", "dy_perm", "dweights",
                        "num_threads", NULL};
  static const char *const nm[] = {"dout", "y_perm", "weights", "row_map", "pos", "dy_perm",
                                   "dweights"};
  PyObject *o[7];
  bx_moe_dispatch_opts op = BX_MOE_DISPATCH_OPTS_DEFAULT;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOOOOO|$i:moe_unpermute_backward", kwl, &o[0],
                                   &o[1], &o[2], &o[3], &o[4], &o[5], &o[6], &op.num_threads))
    return NULL;
  BXK_BEGIN(k, "moe_unpermute_backward", nm, o, 32u | 64u, 32u | 64u);
  BXK_RUN(k, bx_moe_unpermute_backward(k.p[0], k.p[1], k.p[2], k.p[3], k.p[4], k.p[5], k.p[6],
                                       &op));
}

/* ---- embedding ----------------------------------------------------------- */
PyDoc_STRVAR(emb_fwd_doc,
             "embedding_forward(weight, ids, y, *, padding_idx=-1, num_threads=0)\n--\n\n"
             "y[t] = weight[ids[t]], bits copied (bx_embedding_forward). weight [V, H] fp32, "
             "ids [T] or\n[B, L] int32/int64 in [0, V), y [T, H] or [B, L, H] written." RULES);
static PyObject *k_emb_fwd BXK_ARGS {
  (void)self;
  static char *kwl[] = {"weight", "ids", "y", "padding_idx", "num_threads", NULL};
  static const char *const nm[] = {"weight", "ids", "y"};
  PyObject *o[3];
  long long pad;
  bx_embedding_opts op = BX_EMBEDDING_OPTS_DEFAULT;
  pad = op.padding_idx;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "OOO|$Li:embedding_forward", kwl, &o[0], &o[1],
                                   &o[2], &pad, &op.num_threads))
    return NULL;
  op.padding_idx = (int64_t)pad;
  BXK_BEGIN(k, "embedding_forward", nm, o, 4u, 0u);
  BXK_RUN(k, bx_embedding_forward(k.p[0], k.p[1], k.p[2], &op));
}

PyDoc_STRVAR(emb_bwd_doc,
             "embedding_backward(ids, dy, num_embeddings, chunk_tokens, row_ids, rows, offsets, "
             "*,\npadding_idx=-1, num_threads=0)\n--\n\n"
             "The embedding gradient as compact chunk partials (bx_embedding_backward): per "
             "chunk the\nids present, ascending, each with its fp32 row sum in token order. "
             "Written: row_ids [T]\nint64, rows [T, H] fp32, offsets [nchunks + 1] int64 (chunk "
             "j owns rows [offsets[j],\noffsets[j+1])); rows past offsets[nchunks] are left as "
             "they were. padding_idx >= 0: that\nrow gets no gradient. For TokRed: "
             "embedding_grad_bound, embedding_grad_add." RULES);
static PyObject *k_emb_bwd BXK_ARGS {
  (void)self;
  static char *kwl[] = {"ids", "dy", "num_embeddings", "chunk_tokens", "row_ids", "rows",
                        "offsets", "padding_idx", "num_threads", NULL};
  static const char *const nm[] = {"ids", "dy", "row_ids", "rows", "offsets"};
  PyObject *o[5];
  long long V, ct, pad;
  bx_embedding_opts op = BX_EMBEDDING_OPTS_DEFAULT;
  pad = op.padding_idx;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "OOLLOOO|$Li:embedding_backward", kwl, &o[0],
                                   &o[1], &V, &ct, &o[2], &o[3], &o[4], &pad, &op.num_threads))
    return NULL;
  op.padding_idx = (int64_t)pad;
  BXK_BEGIN(k, "embedding_backward", nm, o, 4u | 8u | 16u, 0u);
  BXK_RUN(k, bx_embedding_backward(k.p[0], k.p[1], (int64_t)V, (int64_t)ct, k.p[2], k.p[3],
                                   k.p[4], &op));
}

/* ---- cross-entropy ------------------------------------------------------- */
#define XENT_KW "ignore_index=-100, grad_scale=1.0, num_threads=0"
PyDoc_STRVAR(xent_fwd_doc,
             "xent_forward(logits, targets, chunk_tokens, losses, loss_partials=None, "
             "counts=None, *,\n" XENT_KW ")\n--\n\n"
             "Per-token cross-entropy in fp32 (bx_xent_forward; ForCausalLMLoss's per-token "
             "term):\nlogits [T, V] (or [B, L, V]) fp32, targets [T] (or [B, L]) int32/int64 "
             "(ignore_index: loss\n0, count 0). Written: losses like targets, loss_partials "
             "[nchunks] fp32 (chunk sums, for\nTokRed), counts [nchunks] int64 (non-ignored "
             "tokens); the last two may be None." RULES);
static PyObject *k_xent_fwd BXK_ARGS {
  (void)self;
  static char *kwl[] = {"logits", "targets", "chunk_tokens", "losses", "loss_partials", "counts",
                        "ignore_index", "grad_scale", "num_threads", NULL};
  static const char *const nm[] = {"logits", "targets", "losses", "loss_partials", "counts"};
  PyObject *o[5] = {NULL, NULL, NULL, Py_None, Py_None};
  long long ct, ig;
  bx_xent_opts op = BX_XENT_OPTS_DEFAULT;
  ig = op.ignore_index;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "OOLO|OO$Ldi:xent_forward", kwl, &o[0], &o[1], &ct,
                                   &o[2], &o[3], &o[4], &ig, &op.grad_scale, &op.num_threads))
    return NULL;
  op.ignore_index = (int64_t)ig;
  BXK_BEGIN(k, "xent_forward", nm, o, 4u | 8u | 16u, 8u | 16u);
  BXK_RUN(k, bx_xent_forward(k.p[0], k.p[1], (int64_t)ct, k.p[2], k.p[3], k.p[4], &op));
}

PyDoc_STRVAR(xent_bwd_doc,
             "xent_backward(logits, targets, n_global, dlogits, *, " XENT_KW ")\n--\n\n"
             "The gradient of the global mean loss (bx_xent_backward): dlogits [T, V] written "
             "(may be\nlogits itself), dz = (softmax - onehot) * grad_scale / n_global, n_global "
             "the global\nnon-ignored count." RULES);
static PyObject *k_xent_bwd BXK_ARGS {
  (void)self;
  static char *kwl[] = {"logits", "targets", "n_global", "dlogits", "ignore_index", "grad_scale",
                        "num_threads", NULL};
  static const char *const nm[] = {"logits", "targets", "dlogits"};
  PyObject *o[3];
  long long n, ig;
  bx_xent_opts op = BX_XENT_OPTS_DEFAULT;
  ig = op.ignore_index;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "OOLO|$Ldi:xent_backward", kwl, &o[0], &o[1], &n,
                                   &o[2], &ig, &op.grad_scale, &op.num_threads))
    return NULL;
  op.ignore_index = (int64_t)ig;
  BXK_BEGIN(k, "xent_backward", nm, o, 4u, 0u);
  BXK_RUN(k, bx_xent_backward(k.p[0], k.p[1], (int64_t)n, k.p[2], &op));
}

PyDoc_STRVAR(xent_fb_doc,
             "xent_forward_backward(logits, targets, n_global, chunk_tokens, losses, "
             "loss_partials,\ncounts, dlogits, *, " XENT_KW ")\n--\n\n"
             "xent_forward and xent_backward in one pass, bit for bit "
             "(bx_xent_forward_backward);\nloss_partials and counts may be None, dlogits may "
             "be logits itself." RULES);
static PyObject *k_xent_fb BXK_ARGS {
  (void)self;
  static char *kwl[] = {"logits", "targets", "n_global", "chunk_tokens", "losses",
                        "loss_partials", "counts", "dlogits", "ignore_index", "grad_scale",
                        "num_threads", NULL};
  static const char *const nm[] = {"logits", "targets", "losses", "loss_partials", "counts",
                                   "dlogits"};
  PyObject *o[6];
  long long n, ct, ig;
  bx_xent_opts op = BX_XENT_OPTS_DEFAULT;
  ig = op.ignore_index;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "OOLLOOOO|$Ldi:xent_forward_backward", kwl, &o[0],
                                   &o[1], &n, &ct, &o[2], &o[3], &o[4], &o[5], &ig,
                                   &op.grad_scale, &op.num_threads))
    return NULL;
  op.ignore_index = (int64_t)ig;
  BXK_BEGIN(k, "xent_forward_backward", nm, o, 4u | 8u | 16u | 32u, 8u | 16u);
  BXK_RUN(k, bx_xent_forward_backward(k.p[0], k.p[1], (int64_t)n, (int64_t)ct, k.p[2], k.p[3],
                                      k.p[4], k.p[5], &op));
}

PyDoc_STRVAR(xent_count_doc,
             "xent_count(targets, chunk_tokens, counts, *, " XENT_KW ")\n--\n\n"
             "The non-ignored targets per chunk without the logits (bx_xent_count): counts "
             "[nchunks]\nint64 written; their SUM over micro-batches and ranks is n_global." RULES);
static PyObject *k_xent_count BXK_ARGS {
  (void)self;
  static char *kwl[] = {"targets", "chunk_tokens", "counts", "ignore_index", "grad_scale",
                        "num_threads", NULL};
  static const char *const nm[] = {"targets", "counts"};
  PyObject *o[2];
  long long ct, ig;
  bx_xent_opts op = BX_XENT_OPTS_DEFAULT;
  ig = op.ignore_index;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "OLO|$Ldi:xent_count", kwl, &o[0], &ct, &o[1], &ig,
                                   &op.grad_scale, &op.num_threads))
    return NULL;
  op.ignore_index = (int64_t)ig;
  BXK_BEGIN(k, "xent_count", nm, o, 2u, 0u);
  BXK_RUN(k, bx_xent_count(k.p[0], (int64_t)ct, k.p[1], &op));
}

PyMethodDef bxpy_train_moe_methods[] = {
    BXK_METH("moe_router_forward", k_router_fwd, router_fwd_doc),
    BXK_METH("moe_router_backward", k_router_bwd, router_bwd_doc),
    BXK_METH("moe_bias_update", k_bias_upd, bias_upd_doc),
    BXK_METH("moe_dispatch_plan", k_plan, plan_doc),
    BXK_METH("moe_dispatch_order", k_order, order_doc),
    BXK_METH("moe_expert_chunks", k_chunks, chunks_doc),
    BXK_METH("moe_permute", k_permute, permute_doc),
    BXK_METH("moe_permute_backward", k_permute_bwd, permute_bwd_doc),
    BXK_METH("moe_unpermute", k_unpermute, unpermute_doc),
    BXK_METH("moe_unpermute_backward", k_unpermute_bwd, unpermute_bwd_doc),
    BXK_METH("embedding_forward", k_emb_fwd, emb_fwd_doc),
    BXK_METH("embedding_backward", k_emb_bwd, emb_bwd_doc),
    BXK_METH("xent_forward", k_xent_fwd, xent_fwd_doc),
    BXK_METH("xent_backward", k_xent_bwd, xent_bwd_doc),
    BXK_METH("xent_forward_backward", k_xent_fb, xent_fb_doc),
    BXK_METH("xent_count", k_xent_count, xent_count_doc),
    {NULL, NULL, 0, NULL}};
