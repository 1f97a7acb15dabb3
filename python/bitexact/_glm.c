/*
 * _glm.c — the GLM-4.5 model module (src/glm) seen from Python: the
 * entries the bindings call instead of computing the same thing again
 * (docs/architecture.md rule 10): the data order and the synthetic corpus
 * (glm_data.h), and the autograd nodes (glm_node.h: linear, q/k/v, RMSNorm
 * backward, the SwiGLU MLP), whose kernel order, bf16 operands and weight
 * gradients are the model's. No numerics here: tensors are exported
 * (bxk_export), checked by the model module (glm_dl_f32 / glm_dl_bf16)
 * and handed to the node with the GIL released.
 *
 * A node's gradient argument `grads` is None (no weight gradients) or the
 * tuple (state, pass, first_token, first_chunk): a TokRed over the
 * trained parameters (taken for the call: another thread's use of it is
 * refused), 0 bound / 1 add, the micro-batch's first global token and
 * chunk. weight_bf16 arguments: None (fp32 GEMMs) or the weight's bf16
 * copy (bf16 operands, fp32 accumulation). Errors: bitexact's exception
 * of the node's bx_status, "fn: what: status: detail".
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <string.h>

#include "_bxpy.h"
#include "glm_data.h"
#include "glm_node.h"

/* glm_synth_tokens(seed, vocab, n) -> bytes: n int32 tokens (native order)
 * of the synthetic corpus. */
static PyObject *py_synth_tokens(PyObject *self, PyObject *args) {
  (void)self;
  unsigned long long seed;
  long long vocab, n;
  if (!PyArg_ParseTuple(args, "KLL:glm_synth_tokens", &seed, &vocab, &n)) return NULL;
  if (vocab < 2 || vocab > ((long long)1 << 31) || n < 0 || n > GLM_SYNTH_TOKENS)
    return bxpy_raise_fmt(BX_EINVAL, NULL, "glm_synth_tokens: vocab %lld (2 .. 2^31) or n %lld "
                          "(0 .. %lld) out of range", vocab, n, (long long)GLM_SYNTH_TOKENS);
  PyObject *out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(n * (long long)sizeof(int32_t)));
  if (!out) return NULL;
  Py_BEGIN_ALLOW_THREADS
  glm_synth_tokens((uint64_t)seed, (int64_t)vocab, (int32_t *)PyBytes_AS_STRING(out), (int64_t)n);
  Py_END_ALLOW_THREADS
  return out;
}

/* glm_synth_entropy_bits(vocab) -> float */
static PyObject *py_synth_entropy(PyObject *self, PyObject *args) {
  (void)self;
  long long vocab;
  if (!PyArg_ParseTuple(args, "L:glm_synth_entropy_bits", &vocab)) return NULL;
  if (vocab < 2) return bxpy_raise_fmt(BX_EINVAL, NULL, "glm_synth_entropy_bits: vocab %lld < 2", vocab);
  return PyFloat_FromDouble(glm_synth_entropy_bits((int64_t)vocab));
}

/* glm_epoch_perm(seed, epoch, nseq) -> bytes: nseq int64 (native order),
 * perm_e(k) for k in [0, nseq). */
static PyObject *py_epoch_perm(PyObject *self, PyObject *args) {
  (void)self;
  unsigned long long seed;
  long long epoch, S;
  if (!PyArg_ParseTuple(args, "KLL:glm_epoch_perm", &seed, &epoch, &S)) return NULL;
  if (epoch < 0 || S < 1 || S > ((long long)1 << 40))
    return bxpy_raise_fmt(BX_EINVAL, NULL, "glm_epoch_perm: epoch %lld or nseq %lld out of range",
                          epoch, S);
  PyObject *out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(S * (long long)sizeof(int64_t)));
  if (!out) return NULL;
  Py_BEGIN_ALLOW_THREADS
  glm_epoch_perm((uint64_t)seed, (int64_t)epoch, (int64_t)S, (int64_t *)PyBytes_AS_STRING(out));
  Py_END_ALLOW_THREADS
  return out;
}

/* ---- the autograd nodes ------------------------------------------------------------------ */

typedef struct node {
  bxk_call k;
  glm_nctx c;
  glm_bfws ws;
  PyObject *state; /* the TokRed taken (borrowed), or NULL */
  char err[768];
} node;

/* Export the tensors (out, opt: bxk_export's bit masks), parse grads. -1
 * with the error raised (everything released). */
static int node_begin(node *nd, const char *fn, const char *const *names, int n,
                      PyObject *const *o, unsigned out, unsigned opt, PyObject *grads,
                      int threads) {
  memset(nd, 0, sizeof *nd);
  nd->k.fn = fn;
  nd->k.n = n;
  nd->k.names = names;
  nd->k.loc = NULL;
  nd->c.threads = threads;
  nd->c.ws = &nd->ws;
  nd->c.err = nd->err;
  nd->c.errlen = sizeof nd->err;
  if (threads < 0) {
    bxpy_raise_fmt(BX_EINVAL, NULL, "%s: num_threads %d < 0", fn, threads);
    return -1;
  }
  if (grads && grads != Py_None) {
    PyObject *st;
    long long pass, tok0, chunk0;
    if (!PyTuple_Check(grads)) {
      PyErr_Format(PyExc_TypeError, "%s: grads must be None or a tuple (state, pass, "
                   "first_token, first_chunk), not %.80s", fn, Py_TYPE(grads)->tp_name);
      return -1;
    }
    if (!PyArg_ParseTuple(grads, "OLLL;grads: (state, pass, first_token, first_chunk)", &st, &pass,
                          &tok0, &chunk0))
      return -1;
    if (pass != 0 && pass != 1) {
      bxpy_raise_fmt(BX_EINVAL, NULL, "%s: grads pass %lld is not 0 (bound) or 1 (add)", fn, pass);
      return -1;
    }
    if (!(nd->c.s = bxpy_tokred_take(st, fn, &nd->c.grads, &nd->c.ngrads))) return -1;
    nd->state = st;
    nd->c.pass = (int)pass;
    nd->c.tok0 = tok0;
    nd->c.chunk0 = chunk0;
  }
  if (bxk_export(&nd->k, o, out, opt) < 0) {
    if (nd->state) bxpy_tokred_give(nd->state);
    return -1;
  }
  return 0;
}

/* Release everything; None, or the node's error raised (rc -1). */
static PyObject *node_end(node *nd, int rc) {
  bxk_release(&nd->k);
  glm_bfws_free(&nd->ws);
  if (nd->state) bxpy_tokred_give(nd->state);
  if (rc) return bxpy_raise_fmt(nd->c.st ? nd->c.st : BX_EINTERNAL, NULL, "%s: %s", nd->k.fn, nd->err);
  Py_RETURN_NONE;
}

/* The data of slot i: fp32 rows x cols (rows -1: any; *rows_out). */
static const float *f32_at(node *nd, int i, int64_t rows, int64_t cols, int64_t *rows_out) {
  return nd->k.p[i] ? glm_dl_f32(&nd->c, nd->k.p[i], nd->k.names[i], rows, cols, rows_out) : NULL;
}

/* A linear layer from slots w (2-D fp32), wbf (bf16 like w, or None), b
 * ([n] or None). 0 / -1 with nd->c's error. */
static int lin_at(node *nd, int w, int wbf, int b, long long gi, long long bi, glm_lin *l) {
  const DLTensor *t = nd->k.p[w];
  if (t->ndim != 2)
    return glm_fail(&nd->c, BX_EINVAL, "argument '%s': must be 2-D [out, in], got %d-D",
                    nd->k.names[w], t->ndim);
  l->n = t->shape[0];
  l->k = t->shape[1];
  l->gi = gi;
  l->bi = bi;
  if (!(l->w = f32_at(nd, w, l->n, l->k, NULL))) return -1;
  l->wbf = NULL;
  l->b = NULL;
  if (wbf >= 0 && nd->k.p[wbf] &&
      !(l->wbf = glm_dl_bf16(&nd->c, nd->k.p[wbf], nd->k.names[wbf], l->n, l->k)))
    return -1;
  if (b >= 0 && nd->k.p[b] && !(l->b = f32_at(nd, b, 1, l->n, NULL))) return -1;
  return 0;
}

#define NODE_RUN(nd, call)                \
  do {                                    \
    int rc_;                              \
    Py_BEGIN_ALLOW_THREADS rc_ = (call);  \
    Py_END_ALLOW_THREADS return node_end(&(nd), rc_); \
  } while (0)

static PyObject *py_linear_fwd(PyObject *self, PyObject *args, PyObject *kw) {
  (void)self;
  static char *kwl[] = {"x", "weight", "weight_bf16", "bias", "y", "num_threads", NULL};
  static const char *const nm[] = {"x", "weight", "weight_bf16", "bias", "y"};
  PyObject *o[5];
  int nt = 0;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOOO|$i:glm_linear_forward", kwl, &o[0], &o[1],
                                   &o[2], &o[3], &o[4], &nt))
    return NULL;
  node nd;
  if (node_begin(&nd, "glm_linear_forward", nm, 5, o, 1u << 4, (1u << 2) | (1u << 3), NULL, nt))
    return NULL;
  glm_lin l;
  int64_t T;
  const float *x;
  float *y;
  if (lin_at(&nd, 1, 2, 3, -1, -1, &l) || !(x = f32_at(&nd, 0, -1, l.k, &T)) ||
      !(y = (float *)f32_at(&nd, 4, T, l.n, NULL)))
    return node_end(&nd, -1);
  NODE_RUN(nd, glm_linear_fwd(&nd.c, &l, x, T, y, "linear"));
}

static PyObject *py_linear_bwd(PyObject *self, PyObject *args, PyObject *kw) {
  (void)self;
  static char *kwl[] = {"dy", "x", "weight", "weight_bf16", "dx", "grads", "weight_index",
                        "bias_index", "accumulate", "num_threads", NULL};
  static const char *const nm[] = {"dy", "x", "weight", "weight_bf16", "dx"};
  PyObject *o[5], *grads;
  long long gi, bi;
  int acc = 0, nt = 0;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOOOOLL|$pi:glm_linear_backward", kwl, &o[0],
                                   &o[1], &o[2], &o[3], &o[4], &grads, &gi, &bi, &acc, &nt))
    return NULL;
  node nd;
  if (node_begin(&nd, "glm_linear_backward", nm, 5, o, 1u << 4, (1u << 3) | (1u << 4), grads, nt))
    return NULL;
  glm_lin l;
  int64_t T;
  const float *dy, *x;
  float *dx = NULL;
  if (lin_at(&nd, 2, 3, -1, gi, bi, &l) || !(dy = f32_at(&nd, 0, -1, l.n, &T)) ||
      !(x = f32_at(&nd, 1, T, l.k, NULL)) ||
      (nd.k.p[4] && !(dx = (float *)f32_at(&nd, 4, T, l.k, NULL))))
    return node_end(&nd, -1);
  NODE_RUN(nd, glm_linear_bwd(&nd.c, &l, dy, x, T, dx, acc, "linear backward"));
}

static PyObject *py_qkv_fwd(PyObject *self, PyObject *args, PyObject *kw) {
  (void)self;
  static char *kwl[] = {"x", "q_weight", "k_weight", "v_weight", "q_weight_bf16", "k_weight_bf16",
                        "v_weight_bf16", "q_bias", "k_bias", "v_bias", "q", "k", "v",
                        "num_threads", NULL};
  static const char *const nm[] = {"x", "q_weight", "k_weight", "v_weight", "q_weight_bf16",
                                   "k_weight_bf16", "v_weight_bf16", "q_bias", "k_bias", "v_bias",
                                   "q", "k", "v"};
  PyObject *o[13];
  int nt = 0;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOOOOOOOOOOO|$i:glm_qkv_forward", kwl, &o[0], &o[1],
                                   &o[2], &o[3], &o[4], &o[5], &o[6], &o[7], &o[8], &o[9], &o[10],
                                   &o[11], &o[12], &nt))
    return NULL;
  node nd;
  if (node_begin(&nd, "glm_qkv_forward", nm, 13, o, 7u << 10, 63u << 4, NULL, nt)) return NULL;
  glm_lin l[3];
  float *y[3];
  int64_t T = 0;
  const float *x = NULL;
  for (int i = 0; i < 3; i++)
    if (lin_at(&nd, 1 + i, 4 + i, 7 + i, -1, -1, &l[i])) return node_end(&nd, -1);
  if (!(x = f32_at(&nd, 0, -1, l[0].k, &T))) return node_end(&nd, -1);
  for (int i = 0; i < 3; i++)
    if ((i && l[i].k != l[0].k && glm_fail(&nd.c, BX_EINVAL, "argument '%s': has %lld input "
                                           "features, q_weight %lld", nm[1 + i], (long long)l[i].k,
                                           (long long)l[0].k)) ||
        !(y[i] = (float *)f32_at(&nd, 10 + i, T, l[i].n, NULL)))
      return node_end(&nd, -1);
  NODE_RUN(nd, glm_qkv_fwd(&nd.c, l, x, T, y));
}

/* indices: (q_weight, q_bias, k_weight, k_bias, v_weight, v_bias) state
 * indices, -1 for none. */
static PyObject *py_qkv_bwd(PyObject *self, PyObject *args, PyObject *kw) {
  (void)self;
  static char *kwl[] = {"dq", "dk", "dv", "x", "q_weight", "k_weight", "v_weight",
                        "q_weight_bf16", "k_weight_bf16", "v_weight_bf16", "dx", "grads",
                        "indices", "num_threads", NULL};
  static const char *const nm[] = {"dq", "dk", "dv", "x", "q_weight", "k_weight", "v_weight",
                                   "q_weight_bf16", "k_weight_bf16", "v_weight_bf16", "dx"};
  PyObject *o[11], *grads;
  long long ix[6];
  int nt = 0;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOOOOOOOOOO(LLLLLL)|$i:glm_qkv_backward", kwl,
                                   &o[0], &o[1], &o[2], &o[3], &o[4], &o[5], &o[6], &o[7], &o[8],
                                   &o[9], &o[10], &grads, &ix[0], &ix[1], &ix[2], &ix[3], &ix[4],
                                   &ix[5], &nt))
    return NULL;
  node nd;
  if (node_begin(&nd, "glm_qkv_backward", nm, 11, o, 1u << 10, (7u << 7) | (1u << 10), grads, nt))
    return NULL;
  glm_lin l[3];
  const float *dy[3];
  int64_t T = 0;
  const float *x;
  float *dx = NULL;
  for (int i = 0; i < 3; i++)
    if (lin_at(&nd, 4 + i, 7 + i, -1, ix[2 * i], ix[2 * i + 1], &l[i])) return node_end(&nd, -1);
  if (!(dy[0] = f32_at(&nd, 0, -1, l[0].n, &T)) || !(dy[1] = f32_at(&nd, 1, T, l[1].n, NULL)) ||
      !(dy[2] = f32_at(&nd, 2, T, l[2].n, NULL)) || !(x = f32_at(&nd, 3, T, l[0].k, NULL)) ||
      (nd.k.p[10] && !(dx = (float *)f32_at(&nd, 10, T, l[0].k, NULL))))
    return node_end(&nd, -1);
  for (int i = 1; i < 3; i++)
    if (l[i].k != l[0].k)
      return glm_fail(&nd.c, BX_EINVAL, "argument '%s': has %lld input features, q_weight %lld",
                      nm[4 + i], (long long)l[i].k, (long long)l[0].k),
             node_end(&nd, -1);
  NODE_RUN(nd, glm_qkv_bwd(&nd.c, l, dy, x, T, dx));
}

static PyObject *py_rmsnorm_bwd(PyObject *self, PyObject *args, PyObject *kw) {
  (void)self;
  static char *kwl[] = {"x", "weight", "dy", "rstd", "rows_per_chunk", "dx", "partials", "grads",
                        "index", "num_threads", NULL};
  static const char *const nm[] = {"x", "weight", "dy", "rstd", "dx", "partials"};
  PyObject *o[6], *grads;
  long long rpc, gi;
  int nt = 0;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOOLOOOL|$i:glm_rmsnorm_backward", kwl, &o[0],
                                   &o[1], &o[2], &o[3], &rpc, &o[4], &o[5], &grads, &gi, &nt))
    return NULL;
  node nd;
  if (node_begin(&nd, "glm_rmsnorm_backward", nm, 6, o, (1u << 4) | (1u << 5), 1u << 5, grads, nt))
    return NULL;
  int64_t h = 0, rows = 0;
  const float *w, *x, *dy, *rstd;
  float *dx, *parts = NULL;
  const DLTensor *tw = nd.k.p[1];
  if (tw->ndim != 1) {
    glm_fail(&nd.c, BX_EINVAL, "argument 'weight': must be 1-D, got %d-D", tw->ndim);
    return node_end(&nd, -1);
  }
  h = tw->shape[0];
  if (!(w = f32_at(&nd, 1, 1, h, NULL)) || !(x = f32_at(&nd, 0, -1, h, &rows)) ||
      !(dy = f32_at(&nd, 2, rows, h, NULL)) || !(rstd = f32_at(&nd, 3, 1, rows, NULL)) ||
      !(dx = (float *)f32_at(&nd, 4, rows, h, NULL)))
    return node_end(&nd, -1);
  if (rpc < 1) {
    glm_fail(&nd.c, BX_EINVAL, "rows_per_chunk %lld < 1", rpc);
    return node_end(&nd, -1);
  }
  if (nd.k.p[5] && !(parts = (float *)f32_at(&nd, 5, (rows + rpc - 1) / rpc, h, NULL)))
    return node_end(&nd, -1);
  NODE_RUN(nd, glm_rmsnorm_bwd(&nd.c, x, rows, h, w, dy, rstd, rpc, dx, parts, gi,
                               "rmsnorm backward"));
}

/* The MLP's slots after x: gate, up, down weights, their bf16 copies. */
static int mlp_lins(node *nd, int w0, const long long *ix, glm_lin l[3]) {
  static const int none[3] = {-1, -1, -1};
  for (int i = 0; i < 3; i++)
    if (lin_at(nd, w0 + i, w0 + 3 + i, -1, ix ? ix[i] : none[i], -1, &l[i])) return -1;
  if (l[1].n != l[0].n || l[1].k != l[0].k || l[2].k != l[0].n || l[2].n != l[0].k)
    return glm_fail(&nd->c, BX_EINVAL, "argument 'down_weight': the weights are not [I, H], "
                    "[I, H], [H, I] (gate %lld x %lld, up %lld x %lld, down %lld x %lld)",
                    (long long)l[0].n, (long long)l[0].k, (long long)l[1].n, (long long)l[1].k,
                    (long long)l[2].n, (long long)l[2].k);
  return 0;
}

static PyObject *py_mlp_fwd(PyObject *self, PyObject *args, PyObject *kw) {
  (void)self;
  static char *kwl[] = {"x", "gate_weight", "up_weight", "down_weight", "gate_weight_bf16",
                        "up_weight_bf16", "down_weight_bf16", "g", "u", "a", "y", "num_threads",
                        NULL};
  static const char *const nm[] = {"x", "gate_weight", "up_weight", "down_weight",
                                   "gate_weight_bf16", "up_weight_bf16", "down_weight_bf16",
                                   "g", "u", "a", "y"};
  PyObject *o[11];
  int nt = 0;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOOOOOOOOO|$i:glm_mlp_forward", kwl, &o[0], &o[1],
                                   &o[2], &o[3], &o[4], &o[5], &o[6], &o[7], &o[8], &o[9], &o[10],
                                   &nt))
    return NULL;
  node nd;
  if (node_begin(&nd, "glm_mlp_forward", nm, 11, o, 15u << 7, 7u << 4, NULL, nt)) return NULL;
  glm_lin l[3];
  int64_t T;
  const float *x;
  float *g, *u, *a, *y;
  if (mlp_lins(&nd, 1, NULL, l) || !(x = f32_at(&nd, 0, -1, l[0].k, &T)) ||
      !(g = (float *)f32_at(&nd, 7, T, l[0].n, NULL)) ||
      !(u = (float *)f32_at(&nd, 8, T, l[0].n, NULL)) ||
      !(a = (float *)f32_at(&nd, 9, T, l[0].n, NULL)) ||
      !(y = (float *)f32_at(&nd, 10, T, l[0].k, NULL)))
    return node_end(&nd, -1);
  NODE_RUN(nd, glm_mlp_fwd(&nd.c, l, x, T, g, u, a, y));
}

/* indices: (gate, up, down) state indices, -1 for none. */
static PyObject *py_mlp_bwd(PyObject *self, PyObject *args, PyObject *kw) {
  (void)self;
  static char *kwl[] = {"dy", "x", "g", "u", "a", "gate_weight", "up_weight", "down_weight",
                        "gate_weight_bf16", "up_weight_bf16", "down_weight_bf16", "da", "dg",
                        "du", "dx", "grads", "indices", "num_threads", NULL};
  static const char *const nm[] = {"dy", "x", "g", "u", "a", "gate_weight", "up_weight",
                                   "down_weight", "gate_weight_bf16", "up_weight_bf16",
                                   "down_weight_bf16", "da", "dg", "du", "dx"};
  PyObject *o[15], *grads;
  long long ix[3];
  int nt = 0;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOOOOOOOOOOOOOO(LLL)|$i:glm_mlp_backward", kwl,
                                   &o[0], &o[1], &o[2], &o[3], &o[4], &o[5], &o[6], &o[7], &o[8],
                                   &o[9], &o[10], &o[11], &o[12], &o[13], &o[14], &grads, &ix[0],
                                   &ix[1], &ix[2], &nt))
    return NULL;
  node nd;
  if (node_begin(&nd, "glm_mlp_backward", nm, 15, o, 15u << 11, (7u << 8) | (1u << 14), grads, nt))
    return NULL;
  glm_lin l[3];
  int64_t T;
  const float *dy, *x, *g, *u, *a;
  float *da, *dg, *du, *dx = NULL;
  if (mlp_lins(&nd, 5, ix, l) || !(dy = f32_at(&nd, 0, -1, l[0].k, &T)) ||
      !(x = f32_at(&nd, 1, T, l[0].k, NULL)) || !(g = f32_at(&nd, 2, T, l[0].n, NULL)) ||
      !(u = f32_at(&nd, 3, T, l[0].n, NULL)) || !(a = f32_at(&nd, 4, T, l[0].n, NULL)) ||
      !(da = (float *)f32_at(&nd, 11, T, l[0].n, NULL)) ||
      !(dg = (float *)f32_at(&nd, 12, T, l[0].n, NULL)) ||
      !(du = (float *)f32_at(&nd, 13, T, l[0].n, NULL)) ||
      (nd.k.p[14] && !(dx = (float *)f32_at(&nd, 14, T, l[0].k, NULL))))
    return node_end(&nd, -1);
  NODE_RUN(nd, glm_mlp_bwd(&nd.c, l, dy, x, T, g, u, a, da, dg, du, dx, 0));
}

static PyObject *py_embedding_bwd(PyObject *self, PyObject *args, PyObject *kw) {
  (void)self;
  static char *kwl[] = {"ids", "dy", "num_embeddings", "chunk_tokens", "row_ids", "rows",
                        "offsets", "grads", "index", "padding_idx", "num_threads", NULL};
  static const char *const nm[] = {"ids", "dy", "row_ids", "rows", "offsets"};
  PyObject *o[5], *grads;
  long long V, C, gi, pad = -1;
  int nt = 0;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "OOLLOOOOL|$Li:glm_embedding_backward", kwl, &o[0],
                                   &o[1], &V, &C, &o[2], &o[3], &o[4], &grads, &gi, &pad, &nt))
    return NULL;
  node nd;
  if (node_begin(&nd, "glm_embedding_backward", nm, 5, o, 7u << 2, 0u, grads, nt)) return NULL;
  const DLTensor *ti = nd.k.p[0], *td = nd.k.p[1];
  int64_t T = 1;
  for (int d = 0; d < ti->ndim; d++) T *= ti->shape[d];
  int64_t H = td->ndim >= 1 ? td->shape[td->ndim - 1] : 0, nch = C > 0 ? (T + C - 1) / C : 0;
  const float *dy;
  float *rows;
  if (C < 1) {
    glm_fail(&nd.c, BX_EINVAL, "chunk_tokens %lld < 1", C);
    return node_end(&nd, -1);
  }
  if (!(dy = f32_at(&nd, 1, T, H, NULL)) || !(rows = (float *)f32_at(&nd, 3, T, H, NULL)))
    return node_end(&nd, -1);
  int64_t *rid, *off;
  if (!(rid = (int64_t *)glm_dl_i64(&nd.c, nd.k.p[2], "row_ids", 1, T)) ||
      !(off = (int64_t *)glm_dl_i64(&nd.c, nd.k.p[4], "offsets", 1, nch + 1)))
    return node_end(&nd, -1);
  NODE_RUN(nd, glm_embedding_bwd(&nd.c, ti, dy, T, H, V, C, pad, rid, rows, off, gi));
}

/* loss_grads: None, or (loss state, pass, first_token, first_chunk); mean:
 * a 0-d fp32 tensor or None. */
static PyObject *py_xent_fwd(PyObject *self, PyObject *args, PyObject *kw) {
  (void)self;
  static char *kwl[] = {"logits", "targets", "n_global", "chunk_tokens", "ignore_index",
                        "losses", "partials", "dlogits", "loss_grads", "mean", "num_threads", NULL};
  static const char *const nm[] = {"logits", "targets", "losses", "partials", "dlogits", "mean"};
  PyObject *o[6], *grads;
  long long ng, C, ign;
  int nt = 0;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "OOLLLOOOOO|$i:glm_xent_forward", kwl, &o[0], &o[1],
                                   &ng, &C, &ign, &o[2], &o[3], &o[4], &grads, &o[5], &nt))
    return NULL;
  node nd;
  if (node_begin(&nd, "glm_xent_forward", nm, 6, o, 15u << 2, 1u << 5, grads, nt)) return NULL;
  bx_tokred *sl = nd.c.s;
  nd.c.s = NULL; /* the state given is the loss's */
  const DLTensor *tz = nd.k.p[0];
  int64_t V = tz->ndim >= 1 ? tz->shape[tz->ndim - 1] : 0, T = 0;
  const float *z;
  float *losses, *parts, *dz, *mean = NULL;
  if (C < 1) {
    glm_fail(&nd.c, BX_EINVAL, "chunk_tokens %lld < 1", C);
    return node_end(&nd, -1);
  }
  if (!(z = f32_at(&nd, 0, -1, V, &T)) || !(losses = (float *)f32_at(&nd, 2, 1, T, NULL)) ||
      !(parts = (float *)f32_at(&nd, 3, 1, (T + C - 1) / C, NULL)) ||
      !(dz = (float *)f32_at(&nd, 4, T, V, NULL)) ||
      (nd.k.p[5] && !(mean = (float *)f32_at(&nd, 5, 1, 1, NULL))))
    return node_end(&nd, -1);
  NODE_RUN(nd, glm_xent_fwd(&nd.c, sl, z, T, V, nd.k.p[1], ng, C, ign, losses, parts, dz, mean));
}

#define NODE_METH(name, fn, doc) {name, (PyCFunction)(void (*)(void))fn, METH_VARARGS | METH_KEYWORDS, doc}

PyMethodDef bxpy_glm_methods[] = {
    {"glm_synth_tokens", py_synth_tokens, METH_VARARGS,
     "glm_synth_tokens(seed, vocab, n) -> bytes of n int32: the synthetic corpus (glm_data.h)"},
    {"glm_synth_entropy_bits", py_synth_entropy, METH_VARARGS,
     "glm_synth_entropy_bits(vocab) -> the synthetic corpus' entropy rate in bits"},
    {"glm_epoch_perm", py_epoch_perm, METH_VARARGS,
     "glm_epoch_perm(seed, epoch, nseq) -> bytes of nseq int64: the --shuffle permutation"},
    NODE_METH("glm_linear_forward", py_linear_fwd,
              "glm_linear_forward(x, weight, weight_bf16, bias, y, *, num_threads=0): y = x W^T "
              "(+ b, one rounding) (glm_linear_fwd)"),
    NODE_METH("glm_linear_backward", py_linear_bwd,
              "glm_linear_backward(dy, x, weight, weight_bf16, dx, grads, weight_index, bias_index, "
              "*, accumulate=False, num_threads=0): dx (+)= dy W (dx None: not wanted), the weight "
              "and bias gradients into grads (glm_linear_bwd)"),
    NODE_METH("glm_qkv_forward", py_qkv_fwd,
              "glm_qkv_forward(x, q_weight, k_weight, v_weight, *bf16 copies, *biases, q, k, v, *, "
              "num_threads=0) (glm_qkv_fwd)"),
    NODE_METH("glm_qkv_backward", py_qkv_bwd,
              "glm_qkv_backward(dq, dk, dv, x, q/k/v_weight, their bf16 copies, dx, grads, "
              "indices, *, num_threads=0): dx one fmaf chain over the three products "
              "(glm_qkv_bwd)"),
    NODE_METH("glm_rmsnorm_backward", py_rmsnorm_bwd,
              "glm_rmsnorm_backward(x, weight, dy, rstd, rows_per_chunk, dx, partials, grads, "
              "index, *, num_threads=0): dx and the gain's chunk partials into grads "
              "(glm_rmsnorm_bwd)"),
    NODE_METH("glm_mlp_forward", py_mlp_fwd,
              "glm_mlp_forward(x, gate/up/down_weight, their bf16 copies, g, u, a, y, *, "
              "num_threads=0) (glm_mlp_fwd)"),
    NODE_METH("glm_mlp_backward", py_mlp_bwd,
              "glm_mlp_backward(dy, x, g, u, a, gate/up/down_weight, their bf16 copies, da, dg, "
              "du, dx, grads, indices, *, num_threads=0) (glm_mlp_bwd)"),
    NODE_METH("glm_embedding_backward", py_embedding_bwd,
              "glm_embedding_backward(ids, dy, num_embeddings, chunk_tokens, row_ids, rows, "
              "offsets, grads, index, *, padding_idx=-1, num_threads=0): the compact chunk rows "
              "into grads (glm_embedding_bwd)"),
    NODE_METH("glm_xent_forward", py_xent_fwd,
              "glm_xent_forward(logits, targets, n_global, chunk_tokens, ignore_index, losses, "
              "partials, dlogits, loss_grads, mean, *, num_threads=0): losses, partials (into "
              "loss_grads), dlogits, the exact mean (glm_xent_fwd)"),
    {NULL, NULL, 0, NULL}};
