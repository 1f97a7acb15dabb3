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
#include "glm_moe.h"
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

/* ---- the protocol object: GradRed (glm_gr) -------------------------------------------------
 * GradRed(grads, chunk_tokens, total_tokens, where=None): one step's
 * gradient reduction (glm_node.h's glm_gr) over the gradients of grads (a
 * sequence of tensors or shapes) and the loss; where[i] (GLM_GR_*): 0
 * reduced over comm, 1 local (over xcomm: expert parallelism's replicas),
 * 2 absent. begin(bounds=None, flag=False): a new step, the two-pass
 * protocol (bounds None: glm_gr_begin) or one pass on the grid stated by
 * bounds (n + 1 exponents: the tensors in creation order, then the loss;
 * glm_gr_begin_stated, flag: an add that breaks a bound flags the step
 * instead of failing); micro_batch(first_token, num_tokens) -> first
 * chunk, agree(comm=None, rank=0, xcomm=None, xrank=0), allreduce(same),
 * history() -> ([n + 1 observed exponents], overflowed) after allreduce,
 * stated_bounds(history=None, top=None) -> the n + 1 bounds a step states
 * from a history (glm_gr_stated_bounds; module constant GRID_MARGIN),
 * next_history(prev, observed) -> the history after a step
 * (glm_gr_next_history; GRID_DECAY),
 * finish(outs, loss=None, divisor=1) -> whether the loss was written. A
 * node's grads argument may name it: (gradred, pass, first_token,
 * first_chunk). Used by one thread at a time. */

typedef struct GradRed {
  PyObject_HEAD
  glm_gr *g;
  int busy;
} GradRed;

static PyTypeObject GradRedType;

static int gr_check(GradRed *t, const char *fn) {
  if (t->busy) {
    bxpy_raise_fmt(BX_EINVAL, NULL, "%s: this GradRed is in use by another thread", fn);
    return -1;
  }
  return 0;
}

static void gr_ctx(glm_nctx *c, char *err, size_t n) {
  memset(c, 0, sizeof *c);
  c->err = err;
  c->errlen = n;
  err[0] = 0;
}

static PyObject *gr_raise(const char *fn, const glm_nctx *c, PyObject *cause) {
  char msg[900];
  PyOS_snprintf(msg, sizeof msg, "%s: %s", fn, c->err);
  return bxpy_raise_at(cause ? BX_ECOMM : c->st ? c->st : BX_EINTERNAL, msg, cause, NULL);
}

static PyObject *GradRed_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
  static char *kwl[] = {"grads", "chunk_tokens", "total_tokens", "where", NULL};
  PyObject *gobj, *wobj = Py_None;
  long long ct, tt;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "OLL|O:GradRed", kwl, &gobj, &ct, &tt, &wobj))
    return NULL;
  bxpy_descs d;
  if (bxpy_descs_parse(gobj, "GradRed", &d) < 0) return NULL;
  unsigned char *where = NULL;
  if (wobj != Py_None) {
    PyObject *f = PySequence_Fast(wobj, "GradRed: where must be None or a sequence of ints");
    int bad = !f;
    if (f && PySequence_Fast_GET_SIZE(f) != d.n) {
      bxpy_raise_fmt(BX_EINVAL, NULL, "GradRed: where holds %zd values, grads %zd",
                     PySequence_Fast_GET_SIZE(f), d.n);
      bad = 1;
    }
    if (!bad && !(where = PyMem_Calloc((size_t)(d.n ? d.n : 1), 1))) {
      PyErr_NoMemory();
      bad = 1;
    }
    for (Py_ssize_t i = 0; !bad && i < d.n; i++) {
      long v = PyLong_AsLong(PySequence_Fast_GET_ITEM(f, i));
      if (v == -1 && PyErr_Occurred()) bad = 1;
      else if (v < GLM_GR_ALL || v > GLM_GR_ABSENT) {
        bxpy_raise_fmt(BX_EINVAL, NULL, "GradRed: where[%zd] is %ld: 0 (all ranks), 1 (local: "
                       "reduced over xcomm) or 2 (absent) expected", i, v);
        bad = 1;
      } else {
        where[i] = (unsigned char)v;
      }
    }
    Py_XDECREF(f);
    if (bad) {
      PyMem_Free(where);
      bxpy_descs_release(&d);
      return NULL;
    }
  }
  char err[512];
  glm_nctx c;
  gr_ctx(&c, err, sizeof err);
  glm_gr *g = NULL;
  int rc = glm_gr_create(d.dl, (size_t)d.n, where, ct, tt, BX_TOKRED_GRID, &g, &c);
  PyMem_Free(where);
  bxpy_descs_release(&d);
  if (rc) return gr_raise("GradRed", &c, NULL);
  GradRed *t = (GradRed *)type->tp_alloc(type, 0);
  if (!t) {
    glm_gr_destroy(g);
    return NULL;
  }
  t->g = g;
  return (PyObject *)t;
}

static void GradRed_dealloc(GradRed *t) {
  glm_gr_destroy(t->g);
  Py_TYPE(t)->tp_free((PyObject *)t);
}

/* The n1 ints of seq (a sequence of Python ints, each in [-149, 128]) into
 * out[0..n1); -1 with the error raised naming fn and arg. */
static int gr_exponents(PyObject *seq, size_t n1, const char *fn, const char *arg, int *out) {
  PyObject *f = PySequence_Fast(seq, "");
  if (!f) {
    PyErr_Clear();
    bxpy_raise_fmt(BX_EINVAL, NULL, "%s: argument '%s': a sequence of %zu ints expected (one "
                   "exponent per gradient tensor, then the loss's), not %s", fn, arg, n1,
                   Py_TYPE(seq)->tp_name);
    return -1;
  }
  int rc = 0;
  if ((size_t)PySequence_Fast_GET_SIZE(f) != n1) {
    bxpy_raise_fmt(BX_EINVAL, NULL, "%s: argument '%s': %zd values, %zu expected (one exponent per "
                   "gradient tensor, then the loss's)", fn, arg, PySequence_Fast_GET_SIZE(f), n1);
    rc = -1;
  }
  for (size_t i = 0; rc == 0 && i < n1; i++) {
    PyObject *o = PySequence_Fast_GET_ITEM(f, (Py_ssize_t)i);
    int ovf = 0;
    long v = PyLong_Check(o) && !PyBool_Check(o) ? PyLong_AsLongAndOverflow(o, &ovf) : 0;
    if (!PyLong_Check(o) || PyBool_Check(o)) {
      bxpy_raise_fmt(BX_EINVAL, NULL, "%s: argument '%s[%zu]' (%s) is a %s, not an int", fn, arg,
                     i, i + 1 == n1 ? "the loss" : "a gradient tensor", Py_TYPE(o)->tp_name);
      rc = -1;
    } else if (v == -1 && PyErr_Occurred()) {
      rc = -1;
    } else if (ovf || v < -149 || v > 128) {
      PyObject *r = PyObject_Repr(o);
      const char *rs = r ? PyUnicode_AsUTF8(r) : NULL;
      if (!rs) PyErr_Clear();
      bxpy_raise_fmt(BX_EINVAL, NULL, "%s: argument '%s[%zu]' (%s) is %s: outside [-149, 128]",
                     fn, arg, i, i + 1 == n1 ? "the loss" : "a gradient tensor", rs ? rs : "?");
      Py_XDECREF(r);
      rc = -1;
    } else {
      out[i] = (int)v;
    }
  }
  Py_DECREF(f);
  return rc;
}

/* A list of the n ints v[0..n); NULL with the error raised. */
static PyObject *int_list(const int *v, size_t n) {
  PyObject *lst = PyList_New((Py_ssize_t)n);
  for (size_t i = 0; lst && i < n; i++) {
    PyObject *o = PyLong_FromLong(v[i]);
    if (!o) Py_CLEAR(lst);
    else PyList_SET_ITEM(lst, (Py_ssize_t)i, o);
  }
  return lst;
}

static size_t gr_ntensors(const GradRed *t) {
  size_t n;
  glm_gr_grads(t->g, &n);
  return n;
}

static PyObject *GradRed_begin(GradRed *t, PyObject *args, PyObject *kw) {
  static char *kwl[] = {"bounds", "flag", NULL};
  PyObject *bobj = Py_None;
  int flag = 0;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "|Op:begin", kwl, &bobj, &flag) ||
      gr_check(t, "GradRed.begin") < 0)
    return NULL;
  char err[512];
  glm_nctx c;
  gr_ctx(&c, err, sizeof err);
  if (bobj == Py_None) {
    if (flag)
      return bxpy_raise_fmt(BX_EINVAL, NULL, "GradRed.begin: flag=True needs bounds (the flag is "
                            "the stated grid's overflow check)");
    if (glm_gr_begin(t->g, &c)) return gr_raise("GradRed.begin", &c, NULL);
    Py_RETURN_NONE;
  }
  size_t n1 = gr_ntensors(t) + 1;
  int *bounds = PyMem_Malloc(n1 * sizeof *bounds);
  if (!bounds) return PyErr_NoMemory();
  int rc = gr_exponents(bobj, n1, "GradRed.begin", "bounds", bounds);
  if (rc == 0 && glm_gr_begin_stated(t->g, bounds, flag, &c)) {
    gr_raise("GradRed.begin", &c, NULL);
    rc = -1;
  }
  PyMem_Free(bounds);
  if (rc) return NULL;
  Py_RETURN_NONE;
}

/* history() -> ([n + 1 ints], overflowed): glm_gr_history (each held
 * tensor's own observation, an absent one its holders', the loss's, and
 * whether an add broke a stated bound on any rank). */
static PyObject *GradRed_history(GradRed *t, PyObject *unused) {
  (void)unused;
  if (gr_check(t, "GradRed.history") < 0) return NULL;
  size_t n = gr_ntensors(t);
  int *h = PyMem_Malloc((n + 1) * sizeof *h);
  if (!h) return PyErr_NoMemory();
  int over = 0;
  if (glm_gr_history(t->g, h, &over)) {
    PyMem_Free(h);
    return bxpy_raise_fmt(BX_EINVAL, NULL, "GradRed.history: the step is not all-reduced (pass %d; "
                          "history() follows allreduce(), before finish())", glm_gr_pass(t->g));
  }
  PyObject *lst = int_list(h, n + 1);
  PyMem_Free(h);
  if (!lst) return NULL;
  return Py_BuildValue("(NO)", lst, over ? Py_True : Py_False);
}

/* stated_bounds(history=None, top=None) -> [n + 1 ints]: glm_gr_stated_bounds
 * of history; top (an exponent) joins the gradient entries it takes "the
 * largest gradient history" over (the model's tensors this GradRed does not
 * hold: other ranks' experts), as one more gradient entry whose bound is
 * dropped. */
static PyObject *GradRed_stated_bounds(GradRed *t, PyObject *args, PyObject *kw) {
  static char *kwl[] = {"history", "top", NULL};
  PyObject *hobj = Py_None, *tobj = Py_None;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "|OO:stated_bounds", kwl, &hobj, &tobj)) return NULL;
  size_t n1 = gr_ntensors(t) + 1;
  if (hobj == Py_None && tobj != Py_None)
    return bxpy_raise_fmt(BX_EINVAL, NULL, "GradRed.stated_bounds: argument 'top' needs a history "
                          "(without one every bound is -149)");
  int *h = PyMem_Malloc(2 * (n1 + 1) * sizeof *h), *b = h + n1 + 1;
  if (!h) return PyErr_NoMemory();
  PyObject *targ = tobj == Py_None ? NULL : PyTuple_Pack(1, tobj);
  int bad = (tobj != Py_None && !targ) ||
            (hobj != Py_None && gr_exponents(hobj, n1, "GradRed.stated_bounds", "history", h)) ||
            (targ && gr_exponents(targ, 1, "GradRed.stated_bounds", "top", &h[n1]));
  Py_XDECREF(targ);
  PyObject *lst = NULL;
  if (!bad && targ) { /* [gradients..., top, loss] */
    int loss = h[n1 - 1];
    h[n1 - 1] = h[n1];
    h[n1] = loss;
    glm_gr_stated_bounds(h, n1 + 1, b);
    b[n1 - 1] = b[n1];
    lst = int_list(b, n1);
  } else if (!bad) {
    glm_gr_stated_bounds(hobj == Py_None ? NULL : h, n1, b);
    lst = int_list(b, n1);
  }
  PyMem_Free(h);
  return lst;
}

/* peer_bounds(bounds, peers, gmax) -> ([n + 1 ints], [G ints]): glm_gr_peer_bounds:
 * peers [n] the bound group of each gradient tensor (-1: none, else < G =
 * len(gmax)), gmax [G] the other ranks' largest bounds per group (-149:
 * none); the loss's bound unchanged. */
static PyObject *GradRed_peer_bounds(GradRed *t, PyObject *args, PyObject *kw) {
  static char *kwl[] = {"bounds", "peers", "gmax", NULL};
  PyObject *bobj, *pobj, *gobj;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "OOO:peer_bounds", kwl, &bobj, &pobj, &gobj)) return NULL;
  size_t n1 = gr_ntensors(t) + 1;
  Py_ssize_t G = PySequence_Size(gobj), np = PySequence_Size(pobj);
  if (G < 0 || np < 0) return NULL;
  if ((size_t)np != n1 - 1)
    return bxpy_raise_fmt(BX_EINVAL, NULL, "GradRed.peer_bounds: argument 'peers': %zd values, %zu "
                          "expected (one per gradient tensor)", np, n1 - 1);
  int *b = PyMem_Malloc((n1 + (size_t)G + 1) * sizeof *b), *gm = b + n1;
  int32_t *peer = PyMem_Malloc(n1 * sizeof *peer);
  PyObject *res = NULL;
  if (!b || !peer) {
    PyMem_Free(b);
    PyMem_Free(peer);
    return PyErr_NoMemory();
  }
  int bad = gr_exponents(bobj, n1, "GradRed.peer_bounds", "bounds", b) ||
            (G && gr_exponents(gobj, (size_t)G, "GradRed.peer_bounds", "gmax", gm));
  for (Py_ssize_t i = 0; !bad && i < np; i++) {
    PyObject *o = PySequence_GetItem(pobj, i);
    long v = o && PyLong_Check(o) && !PyBool_Check(o) ? PyLong_AsLong(o) : -2;
    Py_XDECREF(o);
    if (PyErr_Occurred()) bad = 1;
    else if (v < -1 || v >= (long)G) {
      bxpy_raise_fmt(BX_EINVAL, NULL, "GradRed.peer_bounds: argument 'peers[%zd]' must be an int "
                     "in [-1, %zd)", i, G);
      bad = 1;
    } else
      peer[i] = (int32_t)v;
  }
  if (!bad) {
    glm_gr_peer_bounds(peer, n1 - 1, gm, (size_t)G, b);
    PyObject *lb = int_list(b, n1), *lg = lb ? int_list(gm, (size_t)G) : NULL;
    if (lb && lg) res = Py_BuildValue("(NN)", lb, lg);
    else {
      Py_XDECREF(lb);
      Py_XDECREF(lg);
    }
  }
  PyMem_Free(b);
  PyMem_Free(peer);
  return res;
}

/* next_history(prev, observed) -> [n + 1 ints]: glm_gr_next_history (prev
 * None: none, the observed exponents). */
static PyObject *GradRed_next_history(GradRed *t, PyObject *args, PyObject *kw) {
  static char *kwl[] = {"prev", "observed", NULL};
  PyObject *pobj, *oobj;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "OO:next_history", kwl, &pobj, &oobj)) return NULL;
  size_t n1 = gr_ntensors(t) + 1;
  int *h = PyMem_Malloc(3 * n1 * sizeof *h);
  if (!h) return PyErr_NoMemory();
  PyObject *lst = NULL;
  if ((pobj == Py_None || !gr_exponents(pobj, n1, "GradRed.next_history", "prev", h)) &&
      !gr_exponents(oobj, n1, "GradRed.next_history", "observed", h + n1)) {
    glm_gr_next_history(pobj == Py_None ? NULL : h, h + n1, n1, h + 2 * n1);
    lst = int_list(h + 2 * n1, n1);
  }
  PyMem_Free(h);
  return lst;
}

static PyObject *GradRed_micro_batch(GradRed *t, PyObject *args) {
  long long b, n;
  if (!PyArg_ParseTuple(args, "LL:micro_batch", &b, &n) || gr_check(t, "GradRed.micro_batch") < 0)
    return NULL;
  char err[512];
  glm_nctx c;
  gr_ctx(&c, err, sizeof err);
  if (glm_gr_micro_batch(t->g, b, n, &c)) return gr_raise("GradRed.micro_batch", &c, NULL);
  return PyLong_FromLongLong(c.chunk0);
}

/* agree / allreduce over comm (a Python allreduce(buf, op) or None), the
 * local tensors' over xcomm. */
static PyObject *gr_collective(GradRed *t, PyObject *args, PyObject *kw, int all) {
  static char *kwl[] = {"comm", "rank", "xcomm", "xrank", NULL};
  const char *fn = all ? "GradRed.allreduce" : "GradRed.agree";
  PyObject *cfn = Py_None, *xfn = Py_None;
  int rank = 0, xrank = 0;
  if (!PyArg_ParseTupleAndKeywords(args, kw, all ? "|OiOi:allreduce" : "|OiOi:agree", kwl, &cfn,
                                   &rank, &xfn, &xrank) ||
      gr_check(t, fn) < 0)
    return NULL;
  bxpy_pycomm pc, px;
  bx_comm comm, xcomm;
  const bx_comm *cp = bxpy_pycomm_comm(&pc, &comm, cfn, rank);
  const bx_comm *xp = bxpy_pycomm_comm(&px, &xcomm, xfn, xrank);
  char err[512];
  glm_nctx c;
  gr_ctx(&c, err, sizeof err);
  int rc;
  t->busy = 1;
  Py_BEGIN_ALLOW_THREADS rc = all ? glm_gr_allreduce(t->g, cp, xp, &c) : glm_gr_agree(t->g, cp, xp, &c);
  Py_END_ALLOW_THREADS t->busy = 0;
  PyObject *cause = pc.error ? pc.error : px.error; /* the first callback exception */
  if (cause == pc.error) Py_XDECREF(px.error);
  else Py_XDECREF(pc.error);
  if (rc) return gr_raise(fn, &c, cause); /* steals the callback's exception */
  Py_XDECREF(cause);
  Py_RETURN_NONE;
}

static PyObject *GradRed_agree(GradRed *t, PyObject *a, PyObject *k) { return gr_collective(t, a, k, 0); }
static PyObject *GradRed_allreduce(GradRed *t, PyObject *a, PyObject *k) {
  return gr_collective(t, a, k, 1);
}

static PyObject *GradRed_finish(GradRed *t, PyObject *args, PyObject *kw);

static PyObject *GradRed_pass(GradRed *t, void *closure) {
  (void)closure;
  return PyLong_FromLong(glm_gr_pass(t->g));
}

static PyMethodDef GradRed_methods[] = {
    {"begin", (PyCFunction)(void (*)(void))GradRed_begin, METH_VARARGS | METH_KEYWORDS,
     "begin(bounds=None, flag=False): a new step (fresh states), pass 0. bounds None: the "
     "two-pass protocol (micro-batches bound, agree, the same micro-batches add); a sequence of "
     "n + 1 exponents in [-149, 128] (the tensors in creation order, then the loss): the grid is "
     "stated, agree follows at once and the micro-batches run once, adding; flag=True: an add "
     "that breaks a bound flags the step (history()'s overflowed) instead of failing"},
    {"micro_batch", (PyCFunction)GradRed_micro_batch, METH_VARARGS,
     "micro_batch(first_token, num_tokens) -> first chunk: pass 0 records it, pass 1 must "
     "repeat pass 0's in order"},
    {"agree", (PyCFunction)(void (*)(void))GradRed_agree, METH_VARARGS | METH_KEYWORDS,
     "agree(comm=None, rank=0, xcomm=None, xrank=0): end of pass 0, the grids agreed (the "
     "local tensors' over xcomm); pass 1"},
    {"allreduce", (PyCFunction)(void (*)(void))GradRed_allreduce, METH_VARARGS | METH_KEYWORDS,
     "allreduce(comm=None, rank=0, xcomm=None, xrank=0): end of pass 1, the words summed over "
     "the ranks (the local tensors' over xcomm)"},
    {"history", (PyCFunction)GradRed_history, METH_NOARGS,
     "history() -> (list, overflowed): after allreduce, the largest exponent of any finite "
     "element added to each tensor and, last, the loss (over every rank; -149: none), and "
     "whether an add broke a stated bound on any rank (finish then refuses the step)"},
    {"stated_bounds", (PyCFunction)(void (*)(void))GradRed_stated_bounds,
     METH_VARARGS | METH_KEYWORDS,
     "stated_bounds(history=None, top=None) -> list: the n + 1 bounds a one-pass step states "
     "from a history (glm_gr_stated_bounds: min(h + GRID_MARGIN, 128), a gradient never seen "
     "(-149) taking the largest gradient history, over this GradRed's tensors and top when "
     "given; None: every bound -149, the step only observes)"},
    {"peer_bounds", (PyCFunction)(void (*)(void))GradRed_peer_bounds, METH_VARARGS | METH_KEYWORDS,
     "peer_bounds(bounds, peers, gmax) -> (list, list): glm_gr_peer_bounds: every tensor of a "
     "bound group (peers[i] >= 0) takes the group's largest bound, gmax the other ranks' "
     "largest per group (in) and the group's largest (out)"},
    {"next_history", (PyCFunction)(void (*)(void))GradRed_next_history,
     METH_VARARGS | METH_KEYWORDS,
     "next_history(prev, observed) -> list: the history after a step (glm_gr_next_history: "
     "max(observed, prev - GRID_DECAY); prev None: observed)"},
    {"finish", (PyCFunction)(void (*)(void))GradRed_finish, METH_VARARGS | METH_KEYWORDS,
     "finish(outs, loss=None, divisor=1) -> bool: the gradients into outs, the loss (sum / "
     "divisor) when any rank added one (True)"},
    {NULL, NULL, 0, NULL}};

static PyGetSetDef GradRed_getset[] = {
    {"pass_", (getter)GradRed_pass, NULL, "-1 idle or done, 0 pass 0, 1 pass 1, 2 all-reduced", NULL},
    {NULL, NULL, NULL, NULL, NULL}};

static PyTypeObject GradRedType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "bitexact._core.GradRed",
    .tp_basicsize = sizeof(GradRed),
    .tp_dealloc = (destructor)GradRed_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "GradRed(grads, chunk_tokens, total_tokens, where=None): one step's gradient "
              "reduction (src/glm glm_gr): begin, micro_batch, agree, allreduce, history, finish",
    .tp_methods = GradRed_methods,
    .tp_getset = GradRed_getset,
    .tp_new = GradRed_new,
};

int bxpy_glm_init(PyObject *m) {
  if (PyType_Ready(&GradRedType) < 0) return -1;
  if (PyModule_AddIntConstant(m, "GRID_MARGIN", GLM_GR_MARGIN) < 0 ||
      PyModule_AddIntConstant(m, "GRID_DECAY", GLM_GR_DECAY) < 0)
    return -1;
  Py_INCREF(&GradRedType);
  if (PyModule_AddObject(m, "GradRed", (PyObject *)&GradRedType) < 0) {
    Py_DECREF(&GradRedType);
    return -1;
  }
  return 0;
}

/* ---- the autograd nodes ------------------------------------------------------------------ */

typedef struct node {
  bxk_call k;
  glm_nctx c;
  glm_bfws ws;
  PyObject *state; /* the TokRed or GradRed taken (borrowed), or NULL */
  char err[768];
} node;

/* The state of a grads tuple's first item: a TokRed (itself), or a GradRed
 * (its gradients', or with loss its loss's state), taken (marked busy);
 * NULL with the error raised. */
static bx_tokred *state_take(PyObject *o, const char *fn, int loss, glm_nctx *ctx,
                             const DLTensor **grads, size_t *n) {
  if (!PyObject_TypeCheck(o, &GradRedType)) return bxpy_tokred_take(o, fn, grads, n);
  GradRed *t = (GradRed *)o;
  if (gr_check(t, fn) < 0) return NULL;
  bx_tokred *s = loss ? glm_gr_loss_state(t->g) : glm_gr_state(t->g);
  if (!s) {
    bxpy_raise_fmt(BX_EINVAL, NULL, "%s: the GradRed has no step begun", fn);
    return NULL;
  }
  t->busy = 1;
  if (loss) {
    *grads = NULL, *n = 0;
  } else { /* the gradients: the whole binding (local tensors, gradient index map) */
    glm_gr_bind(t->g, ctx);
    *grads = ctx->grads, *n = ctx->ngrads;
  }
  return s;
}

static void state_give(PyObject *o) {
  if (PyObject_TypeCheck(o, &GradRedType)) ((GradRed *)o)->busy = 0;
  else bxpy_tokred_give(o);
}

/* Export the tensors (out, opt: bxk_export's bit masks), parse grads. -1
 * with the error raised (everything released). */
static int node_begin_as(node *nd, const char *fn, const char *const *names, int n,
                         PyObject *const *o, unsigned out, unsigned opt, PyObject *grads,
                         int threads, int loss) {
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
    if (!(nd->c.s = state_take(st, fn, loss, &nd->c, &nd->c.grads, &nd->c.ngrads))) return -1;
    nd->state = st;
    nd->c.pass = (int)pass;
    nd->c.tok0 = tok0;
    nd->c.chunk0 = chunk0;
  }
  if (bxk_export(&nd->k, o, out, opt) < 0) {
    if (nd->state) state_give(nd->state);
    return -1;
  }
  return 0;
}

static int node_begin(node *nd, const char *fn, const char *const *names, int n,
                      PyObject *const *o, unsigned out, unsigned opt, PyObject *grads,
                      int threads) {
  return node_begin_as(nd, fn, names, n, o, out, opt, grads, threads, 0);
}

/* Release everything; None, or the node's error raised (rc -1). */
static PyObject *node_end(node *nd, int rc) {
  bxk_release(&nd->k);
  glm_bfws_free(&nd->ws);
  if (nd->state) state_give(nd->state);
  if (rc) return bxpy_raise_fmt(nd->c.st ? nd->c.st : BX_EINTERNAL, NULL, "%s: %s", nd->k.fn, nd->err);
  Py_RETURN_NONE;
}

/* Release everything after an error already raised. */
static PyObject *node_abort(node *nd) {
  bxk_release(&nd->k);
  glm_bfws_free(&nd->ws);
  if (nd->state) state_give(nd->state);
  return NULL;
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
  node nd; /* grads: the loss's state (a GradRed's, or a TokRed of the loss) */
  if (node_begin_as(&nd, "glm_xent_forward", nm, 6, o, 15u << 2, 1u << 5, grads, nt, 1))
    return NULL;
  bx_tokred *sl = nd.c.s;
  nd.c.s = NULL;
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

/* The exact mean of sequence loss sums over the ranks (an evaluation's
 * loss): glm_exact_mean with divisor total. parts: a buffer of n fp32. */
static PyObject *py_eval_mean(PyObject *self, PyObject *args, PyObject *kw) {
  (void)self;
  static char *kwl[] = {"parts", "per", "stride", "first", "chunk_tokens", "total", "comm",
                        "rank", NULL};
  Py_buffer b;
  long long per, stride, first, C, total;
  PyObject *cfn = Py_None;
  int rank = 0;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "y*LLLLL|Oi:glm_eval_mean", kwl, &b, &per, &stride,
                                   &first, &C, &total, &cfn, &rank))
    return NULL;
  if (b.len % (Py_ssize_t)sizeof(float) != 0) {
    PyBuffer_Release(&b);
    return PyErr_Format(PyExc_ValueError, "glm_eval_mean: parts holds %zd bytes, not fp32 values",
                        b.len);
  }
  int64_t n = (int64_t)(b.len / (Py_ssize_t)sizeof(float));
  float *parts = malloc((size_t)(n ? n : 1) * sizeof *parts);
  if (!parts) {
    PyBuffer_Release(&b);
    return PyErr_NoMemory();
  }
  memcpy(parts, b.buf, (size_t)n * sizeof *parts);
  PyBuffer_Release(&b);
  bxpy_pycomm pc;
  bx_comm comm;
  const bx_comm *cp = bxpy_pycomm_comm(&pc, &comm, cfn, rank);
  char err[512];
  glm_nctx c;
  gr_ctx(&c, err, sizeof err);
  float mean = 0;
  int rc;
  Py_BEGIN_ALLOW_THREADS rc = glm_exact_mean(&c, parts, n, per, stride, first, C, total, total, cp, &mean);
  Py_END_ALLOW_THREADS free(parts);
  if (rc) return gr_raise("glm_eval_mean", &c, pc.error); /* steals the callback's exception */
  Py_XDECREF(pc.error);
  return PyFloat_FromDouble((double)mean);
}

/* ---- the MoE block ------------------------------------------------------------------------
 * Tensors in lists (the experts): a tlist exports a sequence (None items
 * allowed where the node reads nothing). */

typedef struct tlist {
  Py_ssize_t n;
  DLTensor *dl;
  bxpy_owner *own;
  int *has;
} tlist;

static void tlist_release(tlist *l) {
  for (Py_ssize_t i = 0; l->own && i < l->n; i++)
    if (l->has[i]) bxpy_release_owner(&l->own[i]);
  PyMem_Free(l->dl);
  PyMem_Free(l->own);
  PyMem_Free(l->has);
  memset(l, 0, sizeof *l);
}

/* Export seq (a sequence of want tensors or None; out: refuse read-only
 * or copied exports). -1 with the error raised, nothing held. */
static int tlist_export(tlist *l, const char *fn, const char *what, PyObject *seq, Py_ssize_t want,
                        int out) {
  memset(l, 0, sizeof *l);
  PyObject *fast = PySequence_Fast(seq, "a list of tensors is required");
  if (!fast) return -1;
  Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
  if (n != want) {
    Py_DECREF(fast);
    bxpy_raise_fmt(BX_EINVAL, NULL, "%s: argument '%s': %zd tensors, expected %zd", fn, what, n, want);
    return -1;
  }
  l->dl = PyMem_Calloc((size_t)(n ? n : 1), sizeof *l->dl);
  l->own = PyMem_Calloc((size_t)(n ? n : 1), sizeof *l->own);
  l->has = PyMem_Calloc((size_t)(n ? n : 1), sizeof *l->has);
  l->n = n;
  if (!l->dl || !l->own || !l->has) {
    Py_DECREF(fast);
    tlist_release(l);
    PyErr_NoMemory();
    return -1;
  }
  for (Py_ssize_t i = 0; i < n; i++) {
    PyObject *o = PySequence_Fast_GET_ITEM(fast, i);
    if (o == Py_None) continue;
    if (bxpy_export_tensor(o, &l->dl[i], &l->own[i], -1, i) < 0) {
      PyObject *exc = bxpy_take_exception();
      PyObject *text = exc ? PyObject_Str(exc) : NULL;
      const char *t = text ? PyUnicode_AsUTF8(text) : NULL;
      PyErr_Clear();
      bxpy_raise_fmt(BX_EINVAL, NULL, "%s: argument '%s[%zd]': %s", fn, what, i, t ? t : "?");
      Py_XDECREF(text);
      Py_XDECREF(exc);
      Py_DECREF(fast);
      tlist_release(l);
      return -1;
    }
    l->has[i] = 1;
    if (out && (l->own[i].flags & (BXPY_FLAG_READ_ONLY | BXPY_FLAG_IS_COPIED))) {
      Py_DECREF(fast);
      tlist_release(l);
      bxpy_raise_fmt(BX_EINVAL, NULL, "%s: argument '%s[%zd]': is read-only or a copy but it is "
                     "an output; nothing was modified", fn, what, i);
      return -1;
    }
  }
  Py_DECREF(fast);
  return 0;
}

static const DLTensor *tl_at(const tlist *l, Py_ssize_t i) { return l->has[i] ? &l->dl[i] : NULL; }

/* The data of list item i: rows x cols fp32 / int64 (named what[i]). */
static void *tl_f32(glm_nctx *c, const tlist *l, const char *what, Py_ssize_t i, int64_t rows,
                    int64_t cols) {
  char name[64];
  PyOS_snprintf(name, sizeof name, "%s[%zd]", what, i);
  return (void *)glm_dl_f32(c, tl_at(l, i), name, rows, cols, NULL);
}

static void *tl_i64(glm_nctx *c, const tlist *l, const char *what, Py_ssize_t i, int64_t rows,
                    int64_t cols) {
  char name[64];
  PyOS_snprintf(name, sizeof name, "%s[%zd]", what, i);
  return (void *)glm_dl_i64(c, tl_at(l, i), name, rows, cols);
}

/* A linear layer from list items: w = ws[i] ([n, k] checked), its bf16 copy
 * bf[i] (when the list is given and the item not None), state index gi. */
static int tl_lin(glm_nctx *c, const tlist *ws, const tlist *bf, Py_ssize_t i, int64_t n, int64_t k,
                  long long gi, glm_lin *l) {
  l->n = n, l->k = k, l->gi = gi, l->bi = -1, l->b = NULL, l->wbf = NULL;
  if (!(l->w = tl_f32(c, ws, "weights", i, n, k))) return -1;
  if (bf && bf->has[i]) {
    char name[64];
    PyOS_snprintf(name, sizeof name, "weights_bf16[%zd]", i);
    if (!(l->wbf = glm_dl_bf16(c, tl_at(bf, i), name, n, k))) return -1;
  }
  return 0;
}

static PyObject *GradRed_finish(GradRed *t, PyObject *args, PyObject *kw) {
  static char *kwl[] = {"outs", "loss", "divisor", NULL};
  PyObject *outs, *lobj = Py_None;
  long long div = 1;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "O|OL:finish", kwl, &outs, &lobj, &div) ||
      gr_check(t, "GradRed.finish") < 0)
    return NULL;
  size_t n;
  glm_gr_grads(t->g, &n);
  tlist ol, ll;
  PyObject *lseq = PyTuple_Pack(1, lobj);
  if (!lseq) return NULL;
  int bad = tlist_export(&ol, "GradRed.finish", "outs", outs, (Py_ssize_t)n, 1);
  if (!bad && tlist_export(&ll, "GradRed.finish", "loss", lseq, 1, 1)) {
    tlist_release(&ol);
    bad = 1;
  }
  Py_DECREF(lseq);
  if (bad) return NULL;
  for (size_t i = 0; i < n; i++)
    if (!ol.has[i] && !glm_gr_absent(t->g, i)) {
      tlist_release(&ol);
      tlist_release(&ll);
      return bxpy_raise_fmt(BX_EINVAL, NULL, "GradRed.finish: argument 'outs[%zu]': a tensor is "
                            "required", i);
    }
  char err[512];
  glm_nctx c;
  gr_ctx(&c, err, sizeof err);
  int rc, has = 0;
  t->busy = 1;
  Py_BEGIN_ALLOW_THREADS rc = glm_gr_finish(t->g, ol.dl, ll.has[0] ? &ll.dl[0] : NULL, div, &has, &c);
  Py_END_ALLOW_THREADS t->busy = 0;
  tlist_release(&ol);
  tlist_release(&ll);
  if (rc) return gr_raise("GradRed.finish", &c, NULL);
  return PyBool_FromLong(has);
}

/* The EP group of a Python object (ep.size, ep.rank, ep.local_tokens;
 * ep.alltoall_i64(send, recv), ep.alltoallv(send, sbytes, recv, rbytes)
 * on memoryviews of the node's buffers, valid during the call). */
typedef struct pyep {
  PyObject *obj;
  PyObject *error; /* the first exception a callback raised (new reference) */
  int size;
} pyep;

static int pyep_call(pyep *p, PyObject *res) {
  if (res) {
    Py_DECREF(res);
    return 0;
  }
  if (!p->error) p->error = bxpy_take_exception();
  PyErr_Clear();
  return -1;
}

static int pyep_a2a_i64(const int64_t *send, int64_t *recv, void *ctx) {
  pyep *p = ctx;
  PyGILState_STATE g = PyGILState_Ensure();
  PyObject *s = PyMemoryView_FromMemory((char *)send, (Py_ssize_t)p->size * 8, PyBUF_READ);
  PyObject *r = PyMemoryView_FromMemory((char *)recv, (Py_ssize_t)p->size * 8, PyBUF_WRITE);
  int rc = s && r ? pyep_call(p, PyObject_CallMethod(p->obj, "alltoall_i64", "OO", s, r))
                  : pyep_call(p, NULL);
  Py_XDECREF(s);
  Py_XDECREF(r);
  PyGILState_Release(g);
  return rc;
}

static int pyep_a2av(const void *send, const int64_t *sbytes, void *recv, const int64_t *rbytes,
                     void *ctx) {
  pyep *p = ctx;
  PyGILState_STATE g = PyGILState_Ensure();
  int64_t ns = 0, nr = 0;
  PyObject *sb = PyTuple_New(p->size), *rb = PyTuple_New(p->size);
  for (int i = 0; sb && rb && i < p->size; i++) {
    ns += sbytes[i];
    nr += rbytes[i];
    PyTuple_SET_ITEM(sb, i, PyLong_FromLongLong(sbytes[i]));
    PyTuple_SET_ITEM(rb, i, PyLong_FromLongLong(rbytes[i]));
  }
  PyObject *s = PyMemoryView_FromMemory((char *)send, (Py_ssize_t)ns, PyBUF_READ);
  PyObject *r = PyMemoryView_FromMemory((char *)recv, (Py_ssize_t)nr, PyBUF_WRITE);
  int rc = s && r && sb && rb
               ? pyep_call(p, PyObject_CallMethod(p->obj, "alltoallv", "OOOO", s, sb, r, rb))
               : pyep_call(p, NULL);
  Py_XDECREF(s);
  Py_XDECREF(r);
  Py_XDECREF(sb);
  Py_XDECREF(rb);
  PyGILState_Release(g);
  return rc;
}

static void ep_capsule_free(PyObject *cap) {
  glm_ep_layer_free(PyCapsule_GetPointer(cap, "bitexact.glm_ep_layer"));
}

/* The node's glm_ep of obj (None: no EP; -1 with the error raised). The
 * layer state: the capsule state (or a new one into *state_out). */
static int ep_of(PyObject *obj, PyObject *state, pyep *p, glm_ep *ep, glm_ep_scratch **scr,
                 glm_ep_layer **layer, const char *fn) {
  memset(ep, 0, sizeof *ep);
  p->obj = obj;
  p->error = NULL;
  if (obj == Py_None || !obj) return 1;
  long long size, rank, lt;
  PyObject *a = PyObject_GetAttrString(obj, "size"), *b = PyObject_GetAttrString(obj, "rank");
  PyObject *t = PyObject_GetAttrString(obj, "local_tokens");
  int bad = !a || !b || !t;
  if (!bad) {
    size = PyLong_AsLongLong(a), rank = PyLong_AsLongLong(b), lt = PyLong_AsLongLong(t);
    bad = PyErr_Occurred() != NULL;
  }
  Py_XDECREF(a), Py_XDECREF(b), Py_XDECREF(t);
  if (bad) {
    PyErr_Clear();
    bxpy_raise_fmt(BX_EINVAL, NULL, "%s: ep must have int size, rank and local_tokens", fn);
    return -1;
  }
  if (size < 1 || rank < 0 || rank >= size || lt < 1) {
    bxpy_raise_fmt(BX_EINVAL, NULL, "%s: ep size %lld, rank %lld, local_tokens %lld out of range",
                   fn, size, rank, lt);
    return -1;
  }
  *layer = NULL;
  if (state && state != Py_None) {
    if (!PyCapsule_IsValid(state, "bitexact.glm_ep_layer")) {
      bxpy_raise_fmt(BX_EINVAL, NULL, "%s: ep_state is not a forward's expert-parallel state", fn);
      return -1;
    }
    *layer = PyCapsule_GetPointer(state, "bitexact.glm_ep_layer");
  }
  p->size = (int)size;
  ep->size = (int)size;
  ep->rank = (int)rank;
  ep->alltoall_i64 = pyep_a2a_i64;
  ep->alltoallv = pyep_a2av;
  ep->ctx = p;
  ep->local_tokens = lt;
  ep->a2a_bytes = NULL; /* the C trainer's record counts them; nothing here reads them */
  ep->scr = scr;
  return 0;
}

/* The MoE lists: weights [router, e_score_correction_bias, experts 3E...,
 * shared gate, up, down]; acts [logits, w, ids, offsets, row_map, pos, xp,
 * gp, up, hp, yp, sg, su, sa, so]; scratch [dw, dlogits, dsa, dsg, dsu,
 * dyp, dxp, dgp, dup, dhp, tok, bounds, part, zeros]. */
enum { A_LOGITS, A_W, A_IDS, A_OFF, A_ROWMAP, A_POS, A_XP, A_GP, A_UP, A_HP, A_YP, A_SG, A_SU,
       A_SA, A_SO, A_N };
enum { S_DW, S_DLOGITS, S_DSA, S_DSG, S_DSU, S_DYP, S_DXP, S_DGP, S_DUP, S_DHP, S_TOK, S_BOUNDS,
       S_PART, S_ZEROS, S_N };

typedef struct moe_call {
  node nd;                /* the single tensors (x, out, ...), the context */
  tlist ws, bf, acts, scr;
  glm_moe_w m;
  glm_lin *experts;
  glm_moe_act a;
  glm_moe_bscr s;
  int64_t T;
  pyep p;
  glm_ep ep;
  glm_ep_scratch *eps;
  glm_ep_layer *epl;
  int have_ep;
} moe_call;

static void moe_release(moe_call *mc) {
  tlist_release(&mc->ws);
  tlist_release(&mc->bf);
  tlist_release(&mc->acts);
  tlist_release(&mc->scr);
  PyMem_Free(mc->experts);
  glm_ep_scratch_free(mc->eps);
  Py_XDECREF(mc->p.error);
}

/* config (E, K, n_group, topk_group, norm_topk_prob, routed_scaling_factor) */
static int moe_config(moe_call *mc, PyObject *cfg, const char *fn) {
  long long E, K, ng, tg;
  int norm;
  double rsf;
  if (!PyArg_ParseTuple(cfg, "LLLLpd;config: (E, K, n_group, topk_group, norm_topk_prob, "
                        "routed_scaling_factor)", &E, &K, &ng, &tg, &norm, &rsf))
    return -1;
  if (E < 1 || K < 1 || K > E) {
    bxpy_raise_fmt(BX_EINVAL, NULL, "%s: config E %lld, K %lld out of range", fn, E, K);
    return -1;
  }
  mc->m.E = E, mc->m.K = K, mc->m.n_group = ng, mc->m.topk_group = tg;
  mc->m.norm_topk_prob = norm, mc->m.routed_scaling_factor = rsf;
  return 0;
}

/* The weights (ws from index w0: experts 3E then, if shared, the router
 * before them and the shared three after) and indices (same layout;
 * None: no gradients). H from x's last dimension. */
static int moe_weights(moe_call *mc, int block, PyObject *indices, const char *fn) {
  glm_nctx *c = &mc->nd.c;
  int64_t E = mc->m.E, H = mc->m.H, e0 = block ? 2 : 0;
  Py_ssize_t nw = mc->ws.n;
  long long *gi = PyMem_Calloc((size_t)nw, sizeof *gi);
  if (!gi) return PyErr_NoMemory(), -1;
  for (Py_ssize_t i = 0; i < nw; i++) gi[i] = -1;
  if (indices && indices != Py_None) {
    PyObject *f = PySequence_Fast(indices, "indices must be a sequence of ints");
    if (!f || PySequence_Fast_GET_SIZE(f) != nw) {
      Py_XDECREF(f);
      PyMem_Free(gi);
      if (!PyErr_Occurred())
        bxpy_raise_fmt(BX_EINVAL, NULL, "%s: indices must hold %zd ints (one per weight)", fn, nw);
      return -1;
    }
    for (Py_ssize_t i = 0; i < nw; i++) {
      PyObject *o = PySequence_Fast_GET_ITEM(f, i);
      gi[i] = o == Py_None ? -1 : PyLong_AsLongLong(o);
    }
    Py_DECREF(f);
    if (PyErr_Occurred()) {
      PyMem_Free(gi);
      return -1;
    }
  }
  /* I from the first expert given */
  int64_t I = -1;
  for (int64_t e = 0; e < E && I < 0; e++)
    if (mc->ws.has[e0 + 3 * e] && mc->ws.dl[e0 + 3 * e].ndim == 2) I = mc->ws.dl[e0 + 3 * e].shape[0];
  mc->experts = PyMem_Calloc((size_t)(3 * E), sizeof *mc->experts);
  int rc = 0;
  if (!mc->experts) {
    PyErr_NoMemory();
    rc = -1;
  } else if (I < 1) {
    rc = glm_fail(c, BX_EINVAL, "argument 'weights': no expert weight [I, H] given");
  }
  mc->m.I = I;
  for (int64_t e = 0; !rc && e < E; e++) {
    if (mc->have_ep && !glm_ep_holds(mc->ep.size, mc->ep.rank, E, e)) continue; /* not read */
    Py_ssize_t b = e0 + 3 * e;
    const tlist *bf = mc->bf.n ? &mc->bf : NULL;
    rc = tl_lin(c, &mc->ws, bf, b, I, H, gi[b], &mc->experts[3 * e]) ||
         tl_lin(c, &mc->ws, bf, b + 1, I, H, gi[b + 1], &mc->experts[3 * e + 1]) ||
         tl_lin(c, &mc->ws, bf, b + 2, H, I, gi[b + 2], &mc->experts[3 * e + 2]) ? -1 : 0;
  }
  mc->m.experts = mc->experts;
  if (!rc && block) {
    const tlist *bf = mc->bf.n ? &mc->bf : NULL;
    const DLTensor *sg = tl_at(&mc->ws, nw - 3);
    int64_t SI = sg && sg->ndim == 2 ? sg->shape[0] : 0;
    mc->m.SI = SI;
    rc = tl_lin(c, &mc->ws, NULL, 0, E, H, gi[0], &mc->m.router) ||
         !(mc->m.ecb = tl_f32(c, &mc->ws, "weights", 1, 1, E)) ||
         tl_lin(c, &mc->ws, bf, nw - 3, SI, H, gi[nw - 3], &mc->m.shared[0]) ||
         tl_lin(c, &mc->ws, bf, nw - 2, SI, H, gi[nw - 2], &mc->m.shared[1]) ||
         tl_lin(c, &mc->ws, bf, nw - 1, H, SI, gi[nw - 1], &mc->m.shared[2]) ? -1 : 0;
  }
  PyMem_Free(gi);
  return rc;
}

/* The rows' activations from acts (R rows). */
static int moe_rows(moe_call *mc, glm_moe_rows *r, int64_t T) {
  glm_nctx *c = &mc->nd.c;
  int64_t E = mc->m.E, K = mc->m.K, H = mc->m.H, I = mc->m.I, R = T * K;
  const tlist *a = &mc->acts;
  r->epl = &mc->epl;
  if (!(r->offsets = tl_i64(c, a, "acts", A_OFF, 1, E + 1)) ||
      !(r->row_map = tl_i64(c, a, "acts", A_ROWMAP, R, 2)) ||
      !(r->pos = tl_i64(c, a, "acts", A_POS, T, K)) || !(r->xp = tl_f32(c, a, "acts", A_XP, R, H)) ||
      !(r->yp = tl_f32(c, a, "acts", A_YP, R, H)))
    return -1;
  if (mc->have_ep) { /* the held experts' rows are the node's: these are not read */
    r->gp = r->up = r->hp = NULL;
    return 0;
  }
  return !(r->gp = tl_f32(c, a, "acts", A_GP, R, I)) || !(r->up = tl_f32(c, a, "acts", A_UP, R, I)) ||
                 !(r->hp = tl_f32(c, a, "acts", A_HP, R, I))
             ? -1
             : 0;
}

static int moe_scr(moe_call *mc, glm_moe_scr *s, int64_t T, int64_t C) {
  glm_nctx *c = &mc->nd.c;
  int64_t K = mc->m.K, H = mc->m.H, I = mc->m.I, R = T * K, nch = (T + C - 1) / C;
  const tlist *l = &mc->scr;
  int ep = mc->have_ep; /* the held experts' rows are the node's: dgp, dup, dhp not read */
  s->dgp = s->dup = s->dhp = NULL;
  if (!(s->dyp = tl_f32(c, l, "scratch", S_DYP, R, H)) || !(s->dxp = tl_f32(c, l, "scratch", S_DXP, R, H)) ||
      (!ep && (!(s->dgp = tl_f32(c, l, "scratch", S_DGP, R, I)) ||
               !(s->dup = tl_f32(c, l, "scratch", S_DUP, R, I)) ||
               !(s->dhp = tl_f32(c, l, "scratch", S_DHP, R, I)))) ||
      !(s->tok = tl_i64(c, l, "scratch", S_TOK, 1, R)) ||
      !(s->bounds = tl_i64(c, l, "scratch", S_BOUNDS, 1, nch + 1)) ||
      !(s->part = tl_f32(c, l, "scratch", S_PART, I, H)) ||
      !(s->zeros = tl_f32(c, l, "scratch", S_ZEROS, I, H)))
    return -1;
  for (int64_t i = 0; i < I * H; i++)
    if (s->zeros[i] != 0.0f)
      return glm_fail(c, BX_EINVAL, "argument 'scratch[%d]': the zeros must be zeros", S_ZEROS);
  return 0;
}

/* Common set-up: x (nd slot 0) gives T and H; lists exported. */
static int moe_begin(moe_call *mc, const char *fn, const char *const *names, int n, PyObject *const *o,
                     unsigned out, unsigned opt, PyObject *grads, int nt, PyObject *ws, PyObject *bf,
                     PyObject *acts, Py_ssize_t nacts, PyObject *scr, Py_ssize_t nscr,
                     PyObject *ep, PyObject *ep_state, Py_ssize_t nweights_extra) {
  if (node_begin(&mc->nd, fn, names, n, o, out, opt, grads, nt)) return -1;
  int r = ep_of(ep, ep_state, &mc->p, &mc->ep, &mc->eps, &mc->epl, fn);
  if (r < 0) return node_abort(&mc->nd), -1;
  mc->have_ep = r == 0 && mc->ep.size > 1;
  Py_ssize_t nw = 3 * mc->m.E + nweights_extra;
  if (tlist_export(&mc->ws, fn, "weights", ws, nw, 0) ||
      (bf != Py_None && tlist_export(&mc->bf, fn, "weights_bf16", bf, nw, 0)) ||
      tlist_export(&mc->acts, fn, "acts", acts, nacts, 1) ||
      (scr && tlist_export(&mc->scr, fn, "scratch", scr, nscr, 1))) {
    moe_release(mc);
    node_abort(&mc->nd);
    return -1;
  }
  const DLTensor *tx = mc->nd.k.p[0];
  mc->m.H = tx->ndim >= 1 ? tx->shape[tx->ndim - 1] : 0;
  mc->T = -1;
  if (!glm_dl_f32(&mc->nd.c, tx, names[0], -1, mc->m.H, &mc->T)) return -2;
  return 0;
}

/* Finish: release, keep or drop the EP state; on error (rc) raise: a
 * Python exception already set as it is, else the node's error (with a
 * callback's exception as its cause). Returns the EP state capsule
 * (keep_state: the forward) or None. */
static PyObject *moe_end(moe_call *mc, int rc, int keep_state, PyObject *state_in) {
  PyObject *cause = mc->p.error;
  mc->p.error = NULL;
  int fresh = !(state_in && state_in != Py_None);
  glm_ep_layer *epl = mc->epl;
  moe_release(mc);
  if (rc) {
    if (fresh) glm_ep_layer_free(epl);
    if (PyErr_Occurred()) {
      Py_XDECREF(cause);
      return node_abort(&mc->nd);
    }
    char msg[900];
    PyOS_snprintf(msg, sizeof msg, "%s: %s", mc->nd.k.fn, mc->nd.err[0] ? mc->nd.err : "failed");
    node_abort(&mc->nd);
    return bxpy_raise_at(cause ? BX_ECOMM : mc->nd.c.st ? mc->nd.c.st : BX_EINTERNAL, msg, cause,
                         NULL);
  }
  Py_XDECREF(cause);
  PyObject *res = node_end(&mc->nd, 0);
  if (!res) return NULL;
  if (!keep_state) {
    if (fresh) glm_ep_layer_free(epl);
    return res;
  }
  Py_DECREF(res);
  if (!fresh) {
    Py_INCREF(state_in);
    return state_in;
  }
  if (!epl) Py_RETURN_NONE;
  PyObject *cap = PyCapsule_New(epl, "bitexact.glm_ep_layer", ep_capsule_free);
  if (!cap) glm_ep_layer_free(epl);
  return cap;
}

#define MOE_RUN(mc, call, keep, state)        \
  do {                                        \
    int rc_;                                  \
    Py_BEGIN_ALLOW_THREADS rc_ = (call);      \
    Py_END_ALLOW_THREADS return moe_end(&(mc), rc_, keep, state); \
  } while (0)

static PyObject *py_moe_fwd(PyObject *self, PyObject *args, PyObject *kw) {
  (void)self;
  static char *kwl[] = {"x", "weights", "weights_bf16", "config", "chunk_tokens", "acts", "out",
                        "ep", "first_token", "num_threads", NULL};
  static const char *const nm[] = {"x", "out"};
  PyObject *o[2], *ws, *bf, *cfg, *acts, *ep = Py_None, *eps = Py_None;
  long long C, tok0 = 0;
  int nt = 0;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOOLOO|$OLi:glm_moe_forward", kwl, &o[0], &ws, &bf,
                                   &cfg, &C, &acts, &o[1], &ep, &tok0, &nt))
    return NULL;
  moe_call mc;
  memset(&mc, 0, sizeof mc);
  if (moe_config(&mc, cfg, "glm_moe_forward")) return NULL;
  int b = moe_begin(&mc, "glm_moe_forward", nm, 2, o, 2u, 0u, NULL, nt, ws, bf, acts, A_N, NULL, 0,
                    ep, eps, 5);
  if (b == -1) return NULL;
  glm_nctx *c = &mc.nd.c;
  int64_t T = mc.T, E = mc.m.E, K = mc.m.K, H = mc.m.H;
  float *out = NULL;
  const tlist *a = &mc.acts;
  if (b || C < 1 || moe_weights(&mc, 1, NULL, "glm_moe_forward") || moe_rows(&mc, &mc.a.r, T) ||
      !(mc.a.logits = tl_f32(c, a, "acts", A_LOGITS, T, E)) || !(mc.a.w = tl_f32(c, a, "acts", A_W, T, K)) ||
      !(mc.a.ids = tl_i64(c, a, "acts", A_IDS, T, K)) ||
      !(mc.a.sg = tl_f32(c, a, "acts", A_SG, T, mc.m.SI)) || !(mc.a.su = tl_f32(c, a, "acts", A_SU, T, mc.m.SI)) ||
      !(mc.a.sa = tl_f32(c, a, "acts", A_SA, T, mc.m.SI)) || !(mc.a.so = tl_f32(c, a, "acts", A_SO, T, H)) ||
      !(out = (float *)glm_dl_f32(c, mc.nd.k.p[1], "out", T, H, NULL))) {
    if (C < 1 && !c->err[0]) glm_fail(c, BX_EINVAL, "chunk_tokens %lld < 1", C);
    return moe_end(&mc, -1, 1, eps);
  }
  const float *x = glm_dl_f32(c, mc.nd.k.p[0], "x", T, H, NULL);
  c->tok0 = tok0; /* the rows' global token ids (expert parallelism) */
  MOE_RUN(mc, glm_moe_fwd(c, &mc.m, mc.have_ep ? &mc.ep : NULL, x, T, C, &mc.a, out), 1, eps);
}

static PyObject *py_moe_bwd(PyObject *self, PyObject *args, PyObject *kw) {
  (void)self;
  static char *kwl[] = {"dout", "x", "weights", "weights_bf16", "config", "chunk_tokens", "acts",
                        "scratch", "dx", "grads", "indices", "ep", "ep_state", "num_threads", NULL};
  static const char *const nm[] = {"x", "dout", "dx"};
  PyObject *o[3], *ws, *bf, *cfg, *acts, *scr, *grads, *idx, *ep = Py_None, *eps = Py_None;
  long long C;
  int nt = 0;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOOOLOOOOO|$OOi:glm_moe_backward", kwl, &o[1], &o[0],
                                   &ws, &bf, &cfg, &C, &acts, &scr, &o[2], &grads, &idx, &ep, &eps,
                                   &nt))
    return NULL;
  moe_call mc;
  memset(&mc, 0, sizeof mc);
  if (moe_config(&mc, cfg, "glm_moe_backward")) return NULL;
  int b = moe_begin(&mc, "glm_moe_backward", nm, 3, o, 4u, 0u, grads, nt, ws, bf, acts, A_N, scr,
                    S_N, ep, eps, 5);
  if (b == -1) return NULL;
  glm_nctx *c = &mc.nd.c;
  int64_t T = mc.T, E = mc.m.E, K = mc.m.K, H = mc.m.H;
  const tlist *a = &mc.acts, *l = &mc.scr;
  const float *dout = NULL;
  float *dx = NULL;
  if (b || C < 1 || moe_weights(&mc, 1, idx, "glm_moe_backward") || moe_rows(&mc, &mc.a.r, T) ||
      moe_scr(&mc, &mc.s.rows, T, C) || !(mc.a.logits = tl_f32(c, a, "acts", A_LOGITS, T, E)) ||
      !(mc.a.w = tl_f32(c, a, "acts", A_W, T, K)) || !(mc.a.ids = tl_i64(c, a, "acts", A_IDS, T, K)) ||
      !(mc.a.sg = tl_f32(c, a, "acts", A_SG, T, mc.m.SI)) || !(mc.a.su = tl_f32(c, a, "acts", A_SU, T, mc.m.SI)) ||
      !(mc.a.sa = tl_f32(c, a, "acts", A_SA, T, mc.m.SI)) ||
      !(mc.s.dw = tl_f32(c, l, "scratch", S_DW, T, K)) || !(mc.s.dlogits = tl_f32(c, l, "scratch", S_DLOGITS, T, E)) ||
      !(mc.s.dsa = tl_f32(c, l, "scratch", S_DSA, T, mc.m.SI)) ||
      !(mc.s.dsg = tl_f32(c, l, "scratch", S_DSG, T, mc.m.SI)) ||
      !(mc.s.dsu = tl_f32(c, l, "scratch", S_DSU, T, mc.m.SI)) ||
      !(dout = glm_dl_f32(c, mc.nd.k.p[1], "dout", T, H, NULL)) ||
      !(dx = (float *)glm_dl_f32(c, mc.nd.k.p[2], "dx", T, H, NULL))) {
    if (C < 1 && !c->err[0]) glm_fail(c, BX_EINVAL, "chunk_tokens %lld < 1", C);
    return moe_end(&mc, -1, 0, eps);
  }
  if (mc.have_ep && !mc.epl) {
    glm_fail(c, BX_EINVAL, "expert parallel backward: ep_state (the forward's) is required");
    return moe_end(&mc, -1, 0, eps);
  }
  const float *x = glm_dl_f32(c, mc.nd.k.p[0], "x", T, H, NULL);
  MOE_RUN(mc, glm_moe_bwd(c, &mc.m, mc.have_ep ? &mc.ep : NULL, dout, x, T, C, &mc.a, &mc.s, dx), 0,
          eps);
}

/* E of a routed stage's weight list (3 tensors an expert); -1 with the
 * error raised. */
static int64_t experts_in(PyObject *ws, const char *fn) {
  Py_ssize_t n = PySequence_Size(ws);
  if (n < 0) return -1;
  if (n < 3 || n % 3) {
    bxpy_raise_fmt(BX_EINVAL, NULL, "%s: weights must hold 3 tensors per expert, got %zd", fn, n);
    return -1;
  }
  return n / 3;
}

/* The routed stage alone (moe_experts): weights = the 3E expert weights;
 * acts [offsets, row_map, pos, xp, gp, up, hp, yp] as the block's A_OFF ..
 * A_YP (the first three unused slots given as None). */
static PyObject *py_experts_fwd(PyObject *self, PyObject *args, PyObject *kw) {
  (void)self;
  static char *kwl[] = {"x", "w", "weights", "weights_bf16", "acts", "initial", "out",
                        "num_threads", NULL};
  static const char *const nm[] = {"x", "w", "initial", "out"};
  PyObject *o[4], *ws, *bf, *acts;
  int nt = 0;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOOOOO|$i:glm_moe_experts_forward", kwl, &o[0], &o[1],
                                   &ws, &bf, &acts, &o[2], &o[3], &nt))
    return NULL;
  moe_call mc;
  memset(&mc, 0, sizeof mc);
  if ((mc.m.E = experts_in(ws, "glm_moe_experts_forward")) < 0) return NULL;
  int b = moe_begin(&mc, "glm_moe_experts_forward", nm, 4, o, 8u, 4u, NULL, nt, ws, bf, acts, A_N,
                    NULL, 0, Py_None, Py_None, 0);
  if (b == -1) return NULL;
  glm_nctx *c = &mc.nd.c;
  const DLTensor *tw0 = mc.nd.k.p[1];
  mc.m.K = tw0->ndim == 2 ? tw0->shape[1] : 0;
  int64_t T = mc.T, K = mc.m.K, H = mc.m.H;
  const float *x, *w, *init = NULL;
  float *out;
  if (b || K < 1 || moe_weights(&mc, 0, NULL, "glm_moe_experts_forward") || moe_rows(&mc, &mc.a.r, T) ||
      !(x = glm_dl_f32(c, mc.nd.k.p[0], "x", T, H, NULL)) || !(w = glm_dl_f32(c, tw0, "w", T, K, NULL)) ||
      (mc.nd.k.p[2] && !(init = glm_dl_f32(c, mc.nd.k.p[2], "initial", T, H, NULL))) ||
      !(out = (float *)glm_dl_f32(c, mc.nd.k.p[3], "out", T, H, NULL))) {
    if (K < 1 && !c->err[0]) glm_fail(c, BX_EINVAL, "argument 'w': must be [T, K]");
    return moe_end(&mc, -1, 0, NULL);
  }
  MOE_RUN(mc, glm_moe_experts_fwd(c, &mc.m, NULL, x, T, w, init, &mc.a.r, out), 0, NULL);
}

static PyObject *py_experts_bwd(PyObject *self, PyObject *args, PyObject *kw) {
  (void)self;
  static char *kwl[] = {"dout", "w", "weights", "weights_bf16", "chunk_tokens", "acts", "scratch",
                        "dx", "dw", "grads", "indices", "num_threads", NULL};
  static const char *const nm[] = {"dout", "w", "dx", "dw"};
  PyObject *o[4], *ws, *bf, *acts, *scr, *grads, *idx;
  long long C;
  int nt = 0;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOOLOOOOOO|$i:glm_moe_experts_backward", kwl, &o[0],
                                   &o[1], &ws, &bf, &C, &acts, &scr, &o[2], &o[3], &grads, &idx, &nt))
    return NULL;
  moe_call mc;
  memset(&mc, 0, sizeof mc);
  if ((mc.m.E = experts_in(ws, "glm_moe_experts_backward")) < 0) return NULL;
  int b = moe_begin(&mc, "glm_moe_experts_backward", nm, 4, o, 12u, 8u, grads, nt, ws, bf, acts, A_N,
                    scr, S_N, Py_None, Py_None, 0);
  if (b == -1) return NULL;
  glm_nctx *c = &mc.nd.c;
  const DLTensor *tw = mc.nd.k.p[1];
  mc.m.K = tw->ndim == 2 ? tw->shape[1] : 0;
  int64_t T = mc.T, K = mc.m.K, H = mc.m.H;
  const float *dout, *w;
  float *dx, *dw = NULL;
  if (b || K < 1 || C < 1 || moe_weights(&mc, 0, idx, "glm_moe_experts_backward") ||
      moe_rows(&mc, &mc.a.r, T) || moe_scr(&mc, &mc.s.rows, T, C) ||
      !(dout = glm_dl_f32(c, mc.nd.k.p[0], "dout", T, H, NULL)) || !(w = glm_dl_f32(c, tw, "w", T, K, NULL)) ||
      !(dx = (float *)glm_dl_f32(c, mc.nd.k.p[2], "dx", T, H, NULL)) ||
      (mc.nd.k.p[3] && !(dw = (float *)glm_dl_f32(c, mc.nd.k.p[3], "dw", T, K, NULL)))) {
    if ((K < 1 || C < 1) && !c->err[0]) glm_fail(c, BX_EINVAL, "w must be [T, K], chunk_tokens >= 1");
    return moe_end(&mc, -1, 0, NULL);
  }
  MOE_RUN(mc, glm_moe_experts_bwd(c, &mc.m, NULL, dout, T, C, w, &mc.a.r, &mc.s.rows, dx, dw), 0, NULL);
}

/* glm_moe_route(x, router_weight, e_score_correction_bias, config,
 * chunk_tokens, logits, ids, weights, counts=None) */
static PyObject *py_moe_route(PyObject *self, PyObject *args, PyObject *kw) {
  (void)self;
  static char *kwl[] = {"x", "router_weight", "e_score_correction_bias", "config", "chunk_tokens",
                        "logits", "ids", "weights", "counts", "num_threads", NULL};
  static const char *const nm[] = {"x", "router_weight", "e_score_correction_bias", "logits", "ids",
                                   "weights", "counts"};
  PyObject *o[7], *cfg;
  long long C;
  int nt = 0;
  o[6] = Py_None;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOOLOOO|O$i:glm_moe_route", kwl, &o[0], &o[1], &o[2],
                                   &cfg, &C, &o[3], &o[4], &o[5], &o[6], &nt))
    return NULL;
  moe_call mc;
  memset(&mc, 0, sizeof mc);
  if (moe_config(&mc, cfg, "glm_moe_route")) return NULL;
  if (node_begin(&mc.nd, "glm_moe_route", nm, 7, o, 15u << 3, 1u << 6, NULL, nt)) return NULL;
  glm_nctx *c = &mc.nd.c;
  int64_t E = mc.m.E, K = mc.m.K, T = 0, H = mc.nd.k.p[1]->ndim == 2 ? mc.nd.k.p[1]->shape[1] : 0;
  const float *x = NULL;
  float *logits, *w;
  int64_t *ids, *counts = NULL;
  mc.m.router.n = E, mc.m.router.k = H, mc.m.router.gi = mc.m.router.bi = -1;
  if (C < 1) {
    glm_fail(c, BX_EINVAL, "chunk_tokens %lld < 1", C);
    return node_end(&mc.nd, -1);
  }
  if (!(mc.m.router.w = glm_dl_f32(c, mc.nd.k.p[1], "router_weight", E, H, NULL)) ||
      !(mc.m.ecb = glm_dl_f32(c, mc.nd.k.p[2], "e_score_correction_bias", 1, E, NULL)) ||
      !(x = glm_dl_f32(c, mc.nd.k.p[0], "x", -1, H, &T)) ||
      !(logits = (float *)glm_dl_f32(c, mc.nd.k.p[3], "logits", T, E, NULL)) ||
      !(ids = (int64_t *)glm_dl_i64(c, mc.nd.k.p[4], "ids", T, K)) ||
      !(w = (float *)glm_dl_f32(c, mc.nd.k.p[5], "weights", T, K, NULL)) ||
      (mc.nd.k.p[6] && !(counts = (int64_t *)glm_dl_i64(c, mc.nd.k.p[6], "counts", (T + C - 1) / C, E))))
    return node_end(&mc.nd, -1);
  NODE_RUN(mc.nd, glm_moe_route(c, &mc.m, x, T, C, logits, ids, w, counts));
}

/* glm_bf16_copy(x, y): y = x rounded to bf16 (glm_bf16_round: nearest
 * even, a NaN kept quiet with its top bits), x fp32, y bf16 of x's
 * element count, both compact host tensors. */
static PyObject *py_bf16_copy(PyObject *self, PyObject *args, PyObject *kw) {
  (void)self;
  static char *kwl[] = {"x", "y", NULL};
  static const char *const nm[] = {"x", "y"};
  PyObject *o[2];
  if (!PyArg_ParseTupleAndKeywords(args, kw, "OO:glm_bf16_copy", kwl, &o[0], &o[1])) return NULL;
  node nd;
  if (node_begin(&nd, "glm_bf16_copy", nm, 2, o, 2u, 0u, NULL, 0)) return NULL;
  int64_t n = 1;
  for (int d = 0; d < nd.k.p[0]->ndim; d++) n *= nd.k.p[0]->shape[d];
  const float *x;
  uint16_t *y;
  if (!(x = glm_dl_f32(&nd.c, nd.k.p[0], "x", 1, n, NULL)) ||
      !(y = (uint16_t *)glm_dl_bf16(&nd.c, nd.k.p[1], "y", 1, n)))
    return node_end(&nd, -1);
  Py_BEGIN_ALLOW_THREADS
  glm_bf16_convert(x, y, n, 0);
  Py_END_ALLOW_THREADS
  return node_end(&nd, 0);
}

#define NODE_METH(name, fn, doc) {name, (PyCFunction)(void (*)(void))fn, METH_VARARGS | METH_KEYWORDS, doc}

PyMethodDef bxpy_glm_methods[] = {
    {"glm_synth_tokens", py_synth_tokens, METH_VARARGS,
     "glm_synth_tokens(seed, vocab, n) -> bytes of n int32: the synthetic corpus (glm_data.h)"},
    {"glm_synth_entropy_bits", py_synth_entropy, METH_VARARGS,
     "glm_synth_entropy_bits(vocab) -> the synthetic corpus' entropy rate in bits"},
    {"glm_epoch_perm", py_epoch_perm, METH_VARARGS,
     "glm_epoch_perm(seed, epoch, nseq) -> bytes of nseq int64: the --shuffle permutation"},
    NODE_METH("glm_bf16_copy", py_bf16_copy,
              "glm_bf16_copy(x, y): y = x (fp32) rounded to bf16, nearest even, NaN kept quiet "
              "(the model's bf16 operands)"),
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
    {"glm_eval_mean", (PyCFunction)(void (*)(void))py_eval_mean, METH_VARARGS | METH_KEYWORDS,
     "glm_eval_mean(parts, per, stride, first, chunk_tokens, total, comm=None, rank=0) -> the "
     "exact mean of the fp32 sequence loss sums parts (part j: global chunk (j // per) * stride "
     "+ first + j % per) over every rank of comm, divided by total, rounded once "
     "(glm_exact_mean: `bitexact train --eval-data`'s eval_loss)"},
    NODE_METH("glm_xent_forward", py_xent_fwd,
              "glm_xent_forward(logits, targets, n_global, chunk_tokens, ignore_index, losses, "
              "partials, dlogits, loss_grads, mean, *, num_threads=0): losses, partials (into "
              "loss_grads), dlogits, the exact mean (glm_xent_fwd)"),
    NODE_METH("glm_moe_route", py_moe_route,
              "glm_moe_route(x, router_weight, e_score_correction_bias, config, chunk_tokens, logits, "
              "ids, weights, counts=None, *, num_threads=0): the router's GEMM and top-k "
              "(glm_moe_route)"),
    NODE_METH("glm_moe_forward", py_moe_fwd,
              "glm_moe_forward(x, weights, weights_bf16, config, chunk_tokens, acts, out, *, ep=None, "
              "first_token=0, num_threads=0) -> the EP state (for the backward) or None "
              "(glm_moe_fwd)"),
    NODE_METH("glm_moe_backward", py_moe_bwd,
              "glm_moe_backward(dout, x, weights, weights_bf16, config, chunk_tokens, acts, scratch, "
              "dx, grads, indices, *, ep=None, ep_state=None, num_threads=0) (glm_moe_bwd)"),
    NODE_METH("glm_moe_experts_forward", py_experts_fwd,
              "glm_moe_experts_forward(x, w, weights, weights_bf16, acts, initial, out, *, "
              "num_threads=0) (glm_moe_experts_fwd)"),
    NODE_METH("glm_moe_experts_backward", py_experts_bwd,
              "glm_moe_experts_backward(dout, w, weights, weights_bf16, chunk_tokens, acts, scratch, "
              "dx, dw, grads, indices, *, num_threads=0) (glm_moe_experts_bwd)"),
    {NULL, NULL, 0, NULL}};
