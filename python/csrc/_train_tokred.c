/*
 * _train_tokred.c — the CPython binding of the training kernels, part 3:
 * the token reduction state (bx_tokred) as the Python type TokRed, and the
 * calls that feed it: the weight- and bias-gradient partials and bounds,
 * the embedding gradient's bound and add (bitexact_train.h).
 *
 * A TokRed owns its bx_tokred (bx_tokred_destroy when the object dies) and
 * a copy of the gradient descriptors it was created with (shapes, dtype,
 * data NULL: bx_embedding_grad_add wants that array). Its wire words
 * (bx_tokred_words: int64, fixed in memory for the state's life) are the
 * object's buffer: memoryview(state), numpy.frombuffer(state, numpy.int64),
 * torch.frombuffer(state, dtype=torch.int64) share them, so a framework's
 * own SUM all-reduce can run on them in place; a view keeps the state
 * alive. A state is used by one thread at a time: a call while another
 * thread's call on it runs (GIL released) is refused.
 */
#include "_bxpy.h"

#include <string.h>

#include "bitexact_train.h"

typedef struct TokRed {
  PyObject_HEAD
  bx_tokred *s;
  size_t n;          /* tensors */
  DLTensor *grads;   /* n descriptors, data NULL */
  int64_t *shapes;   /* their shapes, one after the other */
  long long chunk_tokens, total_tokens;
  int mode;
  int busy;
  Py_ssize_t shape[1], strides[1]; /* of the exported buffer */
} TokRed;

static PyTypeObject TokRedType;

static int tr_check(TokRed *t, const char *fn) {
  if (t->busy) {
    bxpy_raise_fmt(BX_EINVAL, NULL, "%s: this TokRed is in use by another thread", fn);
    return -1;
  }
  return 0;
}

/* A new TokRed of state s (owned on success and on failure), descriptors
 * copied from grads[0..n). */
static PyObject *tr_wrap(bx_tokred *s, const DLTensor *grads, size_t n, long long ct,
                         long long tt, int mode) {
  TokRed *t = (TokRed *)TokRedType.tp_alloc(&TokRedType, 0);
  if (!t) {
    bx_tokred_destroy(s);
    return NULL;
  }
  t->s = s;
  size_t dims = 0;
  for (size_t i = 0; i < n; i++) dims += (size_t)(grads[i].ndim > 0 ? grads[i].ndim : 0);
  t->grads = PyMem_Calloc(n ? n : 1, sizeof *t->grads);
  t->shapes = PyMem_Calloc(dims ? dims : 1, sizeof *t->shapes);
  if (!t->grads || !t->shapes) {
    Py_DECREF(t);
    return PyErr_NoMemory();
  }
  t->n = n;
  for (size_t i = 0, at = 0; i < n; i++) {
    DLTensor d = grads[i];
    if (d.ndim > 0) memcpy(t->shapes + at, d.shape, (size_t)d.ndim * sizeof(int64_t));
    d.shape = t->shapes + at;
    d.data = NULL;
    d.strides = NULL; /* dense: the state refused anything else */
    d.byte_offset = 0;
    t->grads[i] = d;
    at += (size_t)(d.ndim > 0 ? d.ndim : 0);
  }
  t->chunk_tokens = ct;
  t->total_tokens = tt;
  t->mode = mode;
  return (PyObject *)t;
}

static void TokRed_dealloc(TokRed *t) {
  bx_tokred_destroy(t->s);
  PyMem_Free(t->grads);
  PyMem_Free(t->shapes);
  Py_TYPE(t)->tp_free((PyObject *)t);
}

static int parse_mode(PyObject *o, int *mode) {
  if (PyUnicode_Check(o)) {
    const char *s = PyUnicode_AsUTF8(o);
    if (!s) return -1;
    if (!strcmp(s, "grid")) *mode = BX_TOKRED_GRID;
    else if (!strcmp(s, "ordinary")) *mode = BX_TOKRED_ORDINARY;
    else {
      bxpy_raise_fmt(BX_EINVAL, NULL, "TokRed: mode '%.30s' is not 'grid' or 'ordinary'", s);
      return -1;
    }
    return 0;
  }
  long v = PyLong_AsLong(o);
  if (v == -1 && PyErr_Occurred()) return -1;
  *mode = (int)v; /* the library checks it */
  return 0;
}

void bxpy_descs_release(bxpy_descs *d) {
  for (Py_ssize_t i = 0; d->own && i < d->n; i++) bxpy_release_owner(&d->own[i]);
  PyMem_Free(d->dl);
  PyMem_Free(d->own);
  PyMem_Free(d->shp);
  memset(d, 0, sizeof *d);
}

int bxpy_descs_parse(PyObject *gobj, const char *fn, bxpy_descs *d) {
  memset(d, 0, sizeof *d);
  char what[96];
  PyOS_snprintf(what, sizeof what, "%s: grads must be a sequence of tensors or shapes", fn);
  PyObject *seq = PySequence_Fast(gobj, what);
  if (!seq) return -1;
  Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
  PyObject **items = PySequence_Fast_ITEMS(seq);
  d->n = n;
  d->dl = PyMem_Calloc((size_t)(n ? n : 1), sizeof *d->dl);
  d->own = PyMem_Calloc((size_t)(n ? n : 1), sizeof *d->own);
  size_t dims = 0;
  for (Py_ssize_t i = 0; i < n; i++)
    if (PyTuple_Check(items[i]) || PyList_Check(items[i])) dims += (size_t)PySequence_Size(items[i]);
  d->shp = PyMem_Calloc(dims ? dims : 1, sizeof *d->shp);
  if (!d->dl || !d->own || !d->shp) {
    PyErr_NoMemory();
    goto fail;
  }
  for (Py_ssize_t i = 0, at = 0; i < n; i++) {
    PyObject *it = items[i];
    if (PyTuple_Check(it) || PyList_Check(it)) { /* a shape: an fp32 host gradient */
      Py_ssize_t nd = PySequence_Size(it);
      for (Py_ssize_t k = 0; k < nd; k++) {
        PyObject *e = PySequence_GetItem(it, k);
        d->shp[at + k] = e ? PyLong_AsLongLong(e) : -1;
        Py_XDECREF(e);
        if (PyErr_Occurred()) goto fail;
      }
      DLTensor t = {NULL, {kDLCPU, 0}, (int32_t)nd, {kDLFloat, 32, 1}, d->shp + at, NULL, 0};
      d->dl[i] = t;
      at += nd;
    } else if (bxpy_export_tensor(it, &d->dl[i], &d->own[i], -1, i) < 0) {
      goto fail;
    }
  }
  Py_DECREF(seq);
  return 0;
fail:
  Py_DECREF(seq);
  bxpy_descs_release(d);
  return -1;
}

/* TokRed(grads, chunk_tokens, total_tokens, *, mode='grid') */
static PyObject *TokRed_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
  (void)type;
  static char *kwl[] = {"grads", "chunk_tokens", "total_tokens", "mode", NULL};
  PyObject *gobj, *mobj = NULL;
  long long ct, tt;
  int mode = BX_TOKRED_GRID;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "OLL|$O:TokRed", kwl, &gobj, &ct, &tt, &mobj))
    return NULL;
  if (mobj && parse_mode(mobj, &mode) < 0) return NULL;
  bxpy_descs d;
  if (bxpy_descs_parse(gobj, "TokRed", &d) < 0) return NULL;
  PyObject *res = NULL;
  bx_tokred_opts op = BX_TOKRED_OPTS_DEFAULT;
  op.mode = (bx_tokred_mode)mode;
  bx_tokred *s = NULL;
  bx_status st;
  Py_BEGIN_ALLOW_THREADS st = bx_tokred_create(d.dl, (size_t)d.n, (int64_t)ct, (int64_t)tt, &op, &s);
  Py_END_ALLOW_THREADS if (st != BX_OK) bxpy_raise_fmt(st, NULL, "TokRed: %s", bx_last_error());
  else res = tr_wrap(s, d.dl, (size_t)d.n, ct, tt, mode);
  bxpy_descs_release(&d);
  return res;
}

/* Run call on t with the GIL released, then raise "fn: text" on error. */
#define TR_RUN(t, fn, call)                                             \
  do {                                                                  \
    bx_status st_;                                                      \
    (t)->busy = 1;                                                      \
    Py_BEGIN_ALLOW_THREADS st_ = (call);                                \
    Py_END_ALLOW_THREADS(t)->busy = 0;                                  \
    if (st_ != BX_OK) return bxpy_raise_fmt(st_, NULL, "%s: %s", fn, bx_last_error()); \
  } while (0)

static PyObject *TokRed_chunks(TokRed *t, PyObject *args) {
  long long b, e;
  int64_t cb = 0, ce = 0;
  if (!PyArg_ParseTuple(args, "LL:chunks", &b, &e) || tr_check(t, "TokRed.chunks") < 0) return NULL;
  TR_RUN(t, "TokRed.chunks", bx_tokred_chunks(t->s, (int64_t)b, (int64_t)e, &cb, &ce));
  return Py_BuildValue("(LL)", (long long)cb, (long long)ce);
}

/* bound(tensor, chunk, partial) / add(tensor, chunk, partial) */
static PyObject *tr_partial(TokRed *t, PyObject *args, int add) {
  const char *fn = add ? "TokRed.add" : "TokRed.bound";
  static const char *const nm[] = {"partial"};
  Py_ssize_t ti;
  long long c;
  PyObject *o[1];
  if (!PyArg_ParseTuple(args, add ? "nLO:add" : "nLO:bound", &ti, &c, &o[0]) ||
      tr_check(t, fn) < 0)
    return NULL;
  if (ti < 0) return bxpy_raise_fmt(BX_EINVAL, NULL, "%s: tensor %zd is negative", fn, ti);
  BXK_BEGIN(k, fn, nm, o, 0u, 0u);
  bx_status st;
  t->busy = 1;
  Py_BEGIN_ALLOW_THREADS st = add ? bx_tokred_add(t->s, (size_t)ti, (int64_t)c, k.p[0])
                                  : bx_tokred_bound(t->s, (size_t)ti, (int64_t)c, k.p[0]);
  Py_END_ALLOW_THREADS t->busy = 0;
  if (st != BX_OK) { /* the location is the state's tensor, not an argument */
    bxk_raise(&k, st, -1, NULL, "%s", bx_last_error());
    bxk_release(&k);
    return NULL;
  }
  bxk_release(&k);
  Py_RETURN_NONE;
}
static PyObject *TokRed_bound(TokRed *t, PyObject *args) { return tr_partial(t, args, 0); }
static PyObject *TokRed_add(TokRed *t, PyObject *args) { return tr_partial(t, args, 1); }

static PyObject *TokRed_bound_exp(TokRed *t, PyObject *args) {
  Py_ssize_t ti;
  int e;
  if (!PyArg_ParseTuple(args, "ni:bound_exp", &ti, &e) || tr_check(t, "TokRed.bound_exp") < 0)
    return NULL;
  if (ti < 0) return bxpy_raise_fmt(BX_EINVAL, NULL, "TokRed.bound_exp: tensor %zd is negative", ti);
  TR_RUN(t, "TokRed.bound_exp", bx_tokred_bound_exp(t->s, (size_t)ti, e));
  Py_RETURN_NONE;
}

static PyObject *TokRed_grid_exp(TokRed *t, PyObject *args) {
  Py_ssize_t ti;
  int e = 0;
  if (!PyArg_ParseTuple(args, "n:grid_exp", &ti) || tr_check(t, "TokRed.grid_exp") < 0) return NULL;
  if (ti < 0) return bxpy_raise_fmt(BX_EINVAL, NULL, "TokRed.grid_exp: tensor %zd is negative", ti);
  TR_RUN(t, "TokRed.grid_exp", bx_tokred_grid_exp(t->s, (size_t)ti, &e));
  return PyLong_FromLong(e);
}

/* agree(comm=None, rank=0) / allreduce(comm=None, rank=0) */
static PyObject *tr_collective(TokRed *t, PyObject *args, PyObject *kw, int all) {
  static char *kwl[] = {"comm", "rank", NULL};
  const char *fn = all ? "TokRed.allreduce" : "TokRed.agree";
  PyObject *cfn = Py_None;
  int rank = 0;
  if (!PyArg_ParseTupleAndKeywords(args, kw, all ? "|Oi:allreduce" : "|Oi:agree", kwl, &cfn,
                                   &rank) ||
      tr_check(t, fn) < 0)
    return NULL;
  bxpy_pycomm pc;
  bx_comm comm;
  const bx_comm *cp = bxpy_pycomm_comm(&pc, &comm, cfn, rank);
  bx_status st;
  t->busy = 1;
  Py_BEGIN_ALLOW_THREADS st = all ? bx_tokred_allreduce(t->s, cp) : bx_tokred_agree(t->s, cp);
  Py_END_ALLOW_THREADS t->busy = 0;
  if (st != BX_OK) {
    char msg[1100];
    PyOS_snprintf(msg, sizeof msg, "%s: %s", fn, bx_last_error());
    return bxpy_raise_at(st, msg, pc.error, NULL); /* steals the callback's exception */
  }
  Py_XDECREF(pc.error);
  Py_RETURN_NONE;
}
static PyObject *TokRed_agree(TokRed *t, PyObject *a, PyObject *k) { return tr_collective(t, a, k, 0); }
static PyObject *TokRed_allreduce(TokRed *t, PyObject *a, PyObject *k) {
  return tr_collective(t, a, k, 1);
}

static PyObject *TokRed_fork(TokRed *t, PyObject *unused) {
  (void)unused;
  bx_tokred *s = NULL;
  if (tr_check(t, "TokRed.fork") < 0) return NULL;
  TR_RUN(t, "TokRed.fork", bx_tokred_fork(t->s, &s));
  return tr_wrap(s, t->grads, t->n, t->chunk_tokens, t->total_tokens, t->mode);
}

static PyObject *TokRed_merge(TokRed *t, PyObject *other) {
  if (!PyObject_TypeCheck(other, &TokRedType))
    return bxpy_raise_fmt(BX_EINVAL, NULL, "TokRed.merge: argument 'other' is a %.100s, not a TokRed",
                          Py_TYPE(other)->tp_name);
  TokRed *f = (TokRed *)other;
  if (tr_check(t, "TokRed.merge") < 0 || tr_check(f, "TokRed.merge") < 0) return NULL;
  f->busy = 1;
  bx_status st;
  t->busy = 1;
  Py_BEGIN_ALLOW_THREADS st = bx_tokred_merge(t->s, f->s);
  Py_END_ALLOW_THREADS t->busy = 0;
  f->busy = 0;
  if (st != BX_OK) return bxpy_raise_fmt(st, NULL, "TokRed.merge: %s", bx_last_error());
  Py_RETURN_NONE;
}

/* finish(outs, divisor=1): outs one tensor per state tensor, written. */
static PyObject *TokRed_finish(TokRed *t, PyObject *args, PyObject *kw) {
  static char *kwl[] = {"outs", "divisor", NULL};
  PyObject *oobj;
  long long div = 1;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "O|L:finish", kwl, &oobj, &div) ||
      tr_check(t, "TokRed.finish") < 0)
    return NULL;
  PyObject *seq = PySequence_Fast(oobj, "TokRed.finish: outs must be a sequence of tensors");
  if (!seq) return NULL;
  Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
  DLTensor *dl = PyMem_Calloc((size_t)(n ? n : 1), sizeof *dl);
  bxpy_owner *own = PyMem_Calloc((size_t)(n ? n : 1), sizeof *own);
  PyObject *res = NULL;
  if (!dl || !own) {
    PyErr_NoMemory();
    goto done;
  }
  for (Py_ssize_t i = 0; i < n; i++) {
    if (bxpy_export_tensor(PySequence_Fast_GET_ITEM(seq, i), &dl[i], &own[i], -1, i) < 0) {
      PyObject *exc = bxpy_take_exception();
      PyObject *txt = exc ? PyObject_Str(exc) : NULL;
      PyObject *sto = exc ? PyObject_GetAttrString(exc, "status") : NULL;
      long stv = sto && PyLong_Check(sto) ? PyLong_AsLong(sto) : BX_EINVAL;
      Py_XDECREF(sto);
      PyErr_Clear();
      bxpy_where w = {-1, -1, i, -1, -1};
      bxpy_raise_fmt(stv > 0 ? (bx_status)stv : BX_EINVAL, &w,
                     "TokRed.finish: argument 'outs[%zd]': %s", i,
                     txt ? PyUnicode_AsUTF8(txt) : "?");
      Py_XDECREF(txt);
      Py_XDECREF(exc);
      goto done;
    }
    if (own[i].flags & (BXPY_FLAG_READ_ONLY | BXPY_FLAG_IS_COPIED)) {
      bxpy_where w = {-1, -1, i, -1, -1};
      bxpy_raise_fmt(BX_EINVAL, &w,
                     "TokRed.finish: argument 'outs[%zd]' is read-only or a copy (DLPack flags) "
                     "but it is an output; nothing was modified", i);
      goto done;
    }
  }
  bx_status st;
  t->busy = 1;
  Py_BEGIN_ALLOW_THREADS st = bx_tokred_finish(t->s, dl, (size_t)n, (int64_t)div);
  Py_END_ALLOW_THREADS t->busy = 0;
  if (st != BX_OK) {
    long long at = bx_last_error_location()->tensor;
    bxpy_where w = {-1, -1, at >= 0 && at < n ? at : -1, -1, -1};
    bxpy_raise_fmt(st, &w, "TokRed.finish: %s", bx_last_error());
    goto done;
  }
  Py_INCREF(Py_None);
  res = Py_None;
done:
  for (Py_ssize_t i = 0; own && i < n; i++) bxpy_release_owner(&own[i]);
  PyMem_Free(dl);
  PyMem_Free(own);
  Py_DECREF(seq);
  return res;
}

/* The buffer: the wire words, writable int64 (format 'q'). */
static int TokRed_getbuffer(TokRed *t, Py_buffer *view, int flags) {
  int64_t *w = NULL;
  size_t count = 0;
  bx_status st = bx_tokred_words(t->s, &w, &count);
  if (st != BX_OK) {
    bxpy_raise_fmt(st, NULL, "TokRed words: %s", bx_last_error());
    view->obj = NULL;
    return -1;
  }
  t->shape[0] = (Py_ssize_t)count;
  t->strides[0] = (Py_ssize_t)sizeof(int64_t);
  view->buf = w;
  view->obj = (PyObject *)t;
  Py_INCREF(t);
  view->len = (Py_ssize_t)(count * sizeof(int64_t));
  view->readonly = 0;
  view->itemsize = sizeof(int64_t);
  view->format = flags & PyBUF_FORMAT ? "q" : NULL;
  view->ndim = 1;
  view->shape = flags & PyBUF_ND ? t->shape : NULL;
  view->strides = (flags & PyBUF_STRIDES) == PyBUF_STRIDES ? t->strides : NULL;
  view->suboffsets = NULL;
  view->internal = NULL;
  return 0;
}
static PyBufferProcs TokRed_as_buffer = {(getbufferproc)TokRed_getbuffer, NULL};

static PyObject *TokRed_words(TokRed *t, PyObject *unused) {
  (void)unused;
  return PyMemoryView_FromObject((PyObject *)t);
}

static PyObject *TokRed_get(TokRed *t, void *which) {
  switch ((int)(intptr_t)which) {
    case 0: return PyLong_FromSize_t(t->n);
    case 1: return PyLong_FromLongLong(t->chunk_tokens);
    case 2: return PyLong_FromLongLong(t->total_tokens);
    case 3: return PyLong_FromLongLong(t->chunk_tokens > 0 ? (t->total_tokens + t->chunk_tokens - 1) / t->chunk_tokens : 0);
    default: return PyUnicode_FromString(t->mode == BX_TOKRED_ORDINARY ? "ordinary" : "grid");
  }
}

static PyMethodDef TokRed_methods[] = {
    {"chunks", (PyCFunction)TokRed_chunks, METH_VARARGS,
     "chunks(token_begin, token_end) -> (chunk_begin, chunk_end): bx_tokred_chunks (whole "
     "chunks only: LayoutError otherwise)"},
    {"bound", (PyCFunction)TokRed_bound, METH_VARARGS,
     "bound(tensor, chunk, partial): bx_tokred_bound, before agree (partial: fp32, the "
     "tensor's shape)"},
    {"bound_exp", (PyCFunction)TokRed_bound_exp, METH_VARARGS,
     "bound_exp(tensor, exp2): bx_tokred_bound_exp, the promise |a| < 2^exp2, before agree"},
    {"agree", (PyCFunction)(void (*)(void))TokRed_agree, METH_VARARGS | METH_KEYWORDS,
     "agree(comm=None, rank=0): bx_tokred_agree, one MAX all-reduce through comm(buf, op) "
     "(bitexact's Python communicator; None: this process alone); GIL released"},
    {"grid_exp", (PyCFunction)TokRed_grid_exp, METH_VARARGS,
     "grid_exp(tensor) -> int: the agreed grid exponent (bx_tokred_grid_exp)"},
    {"fork", (PyCFunction)TokRed_fork, METH_NOARGS,
     "fork() -> TokRed: an empty state with this one's agreed grid (bx_tokred_fork)"},
    {"add", (PyCFunction)TokRed_add, METH_VARARGS,
     "add(tensor, chunk, partial): bx_tokred_add after agree; on error the state is unchanged"},
    {"merge", (PyCFunction)TokRed_merge, METH_O, "merge(other): self += other (bx_tokred_merge)"},
    {"allreduce", (PyCFunction)(void (*)(void))TokRed_allreduce, METH_VARARGS | METH_KEYWORDS,
     "allreduce(comm=None, rank=0): bx_tokred_allreduce through comm; or all-reduce words() "
     "yourself"},
    {"finish", (PyCFunction)(void (*)(void))TokRed_finish, METH_VARARGS | METH_KEYWORDS,
     "finish(outs, divisor=1): bx_tokred_finish into outs (one fp32/fp64 tensor per state "
     "tensor, written; nothing written on error)"},
    {"words", (PyCFunction)TokRed_words, METH_NOARGS,
     "words() -> memoryview of the int64 wire words (bx_tokred_words; after agree, grid mode), "
     "writable, sharing the state's memory"},
    {NULL, NULL, 0, NULL}};

static PyGetSetDef TokRed_getset[] = {
    {"ntensors", (getter)TokRed_get, NULL, "number of tensors", (void *)0},
    {"chunk_tokens", (getter)TokRed_get, NULL, "tokens per chunk", (void *)1},
    {"total_tokens", (getter)TokRed_get, NULL, "tokens of the global batch", (void *)2},
    {"nchunks", (getter)TokRed_get, NULL, "ceil(total_tokens / chunk_tokens)", (void *)3},
    {"mode", (getter)TokRed_get, NULL, "'grid' or 'ordinary'", (void *)4},
    {NULL, NULL, NULL, NULL, NULL}};

PyDoc_STRVAR(TokRed_doc,
             "TokRed(grads, chunk_tokens, total_tokens, *, mode='grid')\n--\n\n"
             "A layout-invariant token reduction state (bx_tokred_create) for the gradients "
             "grads (a\nsequence of fp32 tensors, of which only dtype, device and shape are "
             "read, or of shapes),\nchunks of chunk_tokens global tokens, total_tokens in the "
             "global batch. A step:\nbound/bound_exp (or linear_wgrad_bound, "
             "embedding_grad_bound), agree(comm), add (or\nlinear_wgrad, embedding_grad_add), "
             "allreduce(comm) or a SUM all-reduce of words() in\nplace, finish(outs). mode "
             "'ordinary': the negative control (fp32 sums in call order).\nOne thread at a "
             "time; the calls release the GIL. The buffer protocol exposes words().");

static PyTypeObject TokRedType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "bitexact._core.TokRed",
    .tp_basicsize = sizeof(TokRed),
    .tp_dealloc = (destructor)TokRed_dealloc,
    .tp_as_buffer = &TokRed_as_buffer,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = TokRed_doc,
    .tp_methods = TokRed_methods,
    .tp_getset = TokRed_getset,
    .tp_new = TokRed_new,
};

/* ------------------------------------------------------------------------
 * Module functions on a state, and the bounds/partials
 * ---------------------------------------------------------------------- */
static TokRed *as_state(PyObject *o, const char *fn) {
  if (!PyObject_TypeCheck(o, &TokRedType)) {
    bxpy_raise_fmt(BX_EINVAL, NULL, "%s: argument 'state' is a %.100s, not a TokRed", fn,
                   Py_TYPE(o)->tp_name);
    return NULL;
  }
  TokRed *t = (TokRed *)o;
  return tr_check(t, fn) < 0 ? NULL : t;
}

/* None -> BX_WGRAD_NONE; an int >= 0 -> itself. */
static int as_index(PyObject *o, const char *fn, const char *name, size_t *out) {
  if (o == Py_None) {
    *out = BX_WGRAD_NONE;
    return 0;
  }
  Py_ssize_t v = PyNumber_AsSsize_t(o, PyExc_OverflowError);
  if (v == -1 && PyErr_Occurred()) return -1;
  if (v < 0) {
    bxpy_raise_fmt(BX_EINVAL, NULL, "%s: argument '%s' = %zd is negative", fn, name, v);
    return -1;
  }
  *out = (size_t)v;
  return 0;
}

#define ST_RUN(t, k, call)                                   \
  do {                                                       \
    bx_status st_;                                           \
    (t)->busy = 1;                                           \
    Py_BEGIN_ALLOW_THREADS st_ = (call);                     \
    Py_END_ALLOW_THREADS(t)->busy = 0;                       \
    return bxk_done(&(k), st_);                              \
  } while (0)

static PyObject *k_wgrad_bound_exp(PyObject *self, PyObject *args) {
  (void)self;
  long long rows;
  float a, b;
  if (!PyArg_ParseTuple(args, "Lff:wgrad_bound_exp", &rows, &a, &b)) return NULL;
  return PyLong_FromLong(bx_wgrad_bound_exp((int64_t)rows, a, b));
}

static PyObject *k_bias_partials BXK_ARGS {
  (void)self;
  static char *kwl[] = {"dy", "chunk_tokens", "partials", "num_threads", NULL};
  static const char *const nm[] = {"dy", "partials"};
  PyObject *o[2];
  long long ct;
  bx_wgrad_opts op = BX_WGRAD_OPTS_DEFAULT;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "OLO|$i:bias_grad_partials", kwl, &o[0], &ct, &o[1],
                                   &op.num_threads))
    return NULL;
  BXK_BEGIN(k, "bias_grad_partials", nm, o, 2u, 0u);
  BXK_RUN(k, bx_bias_grad_partials(k.p[0], (int64_t)ct, k.p[1], &op));
}

static PyObject *k_wgrad(PyObject *args, PyObject *kw, int bound) {
  static char *kwl[] = {"state", "w_tensor", "b_tensor", "dy", "x", "token_begin", "num_threads",
                        NULL};
  static const char *const nm[] = {"dy", "x"};
  const char *fn = bound ? "linear_wgrad_bound" : "linear_wgrad";
  PyObject *so, *wo, *bo, *o[2];
  long long tb;
  bx_wgrad_opts op = BX_WGRAD_OPTS_DEFAULT;
  size_t wi, bi;
  if (!PyArg_ParseTupleAndKeywords(args, kw, bound ? "OOOOOL|$i:linear_wgrad_bound"
                                                   : "OOOOOL|$i:linear_wgrad",
                                   kwl, &so, &wo, &bo, &o[0], &o[1], &tb, &op.num_threads))
    return NULL;
  TokRed *t = as_state(so, fn);
  if (!t || as_index(wo, fn, "w_tensor", &wi) < 0 || as_index(bo, fn, "b_tensor", &bi) < 0)
    return NULL;
  BXK_BEGIN(k, fn, nm, o, 0u, 2u);
  if (bound) ST_RUN(t, k, bx_linear_wgrad_bound(t->s, wi, bi, k.p[0], k.p[1], (int64_t)tb, &op));
  ST_RUN(t, k, bx_linear_wgrad(t->s, wi, bi, k.p[0], k.p[1], (int64_t)tb, &op));
}
static PyObject *k_wgrad_bound BXK_ARGS {
  (void)self;
  return k_wgrad(args, kw, 1);
}
static PyObject *k_linear_wgrad BXK_ARGS {
  (void)self;
  return k_wgrad(args, kw, 0);
}

static PyObject *k_emb_bound BXK_ARGS {
  (void)self;
  static char *kwl[] = {"state", "tensor", "rows", "offsets", NULL};
  static const char *const nm[] = {"rows", "offsets"};
  static const signed char loc[] = {1, 2};
  PyObject *so, *o[2];
  Py_ssize_t ti;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "OnOO:embedding_grad_bound", kwl, &so, &ti, &o[0],
                                   &o[1]))
    return NULL;
  TokRed *t = as_state(so, "embedding_grad_bound");
  if (!t) return NULL;
  if (ti < 0) return bxpy_raise_fmt(BX_EINVAL, NULL, "embedding_grad_bound: tensor %zd is negative", ti);
  BXK_BEGIN(k, "embedding_grad_bound", nm, o, 0u, 0u);
  k.loc = loc;
  ST_RUN(t, k, bx_embedding_grad_bound(t->s, (size_t)ti, k.p[0], k.p[1]));
}

static PyObject *k_emb_add BXK_ARGS {
  (void)self;
  static char *kwl[] = {"state", "tensor", "first_chunk", "row_ids", "rows", "offsets", NULL};
  static const char *const nm[] = {"row_ids", "rows", "offsets"};
  PyObject *so, *o[3];
  Py_ssize_t ti;
  long long fc;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "OnLOOO:embedding_grad_add", kwl, &so, &ti, &fc,
                                   &o[0], &o[1], &o[2]))
    return NULL;
  TokRed *t = as_state(so, "embedding_grad_add");
  if (!t) return NULL;
  if (ti < 0) return bxpy_raise_fmt(BX_EINVAL, NULL, "embedding_grad_add: tensor %zd is negative", ti);
  BXK_BEGIN(k, "embedding_grad_add", nm, o, 0u, 0u);
  ST_RUN(t, k, bx_embedding_grad_add(t->s, t->grads, t->n, (size_t)ti, (int64_t)fc, k.p[0],
                                     k.p[1], k.p[2]));
}

PyMethodDef bxpy_tokred_methods[] = {
    {"wgrad_bound_exp", k_wgrad_bound_exp, METH_VARARGS,
     "wgrad_bound_exp(rows, max_abs_a, max_abs_b) -> int\n--\n\nbx_wgrad_bound_exp: the "
     "smallest E with every finite element of a TN chunk partial over rows tokens below 2^E "
     "(the maxima rounded to fp32 first)."},
    BXK_METH("bias_grad_partials", k_bias_partials,
             "bias_grad_partials(dy, chunk_tokens, partials, *, num_threads=0)\n--\n\n"
             "The bias-gradient chunk partials (bx_bias_grad_partials): partials[j][n] = fp32 "
             "sum of\ndy[t][n] over chunk j's tokens in order from +0. dy [T, N] (or 3-D) fp32 "
             "or bf16, partials\n[ceil(T / chunk_tokens), N] fp32 written. GIL released."),
    BXK_METH("linear_wgrad_bound", k_wgrad_bound,
             "linear_wgrad_bound(state, w_tensor, b_tensor, dy, x, token_begin, *, "
             "num_threads=0)\n--\n\n"
             "Before state.agree: raise the bounds of state tensors w_tensor ([N, K]) and "
             "b_tensor ([N])\n(an int or None) from dy [T, N] and x [T, K] (x may be None "
             "without w_tensor), the local\nrows being global tokens [token_begin, token_begin "
             "+ T), whole chunks\n(bx_linear_wgrad_bound). state unchanged on error. GIL "
             "released."),
    BXK_METH("linear_wgrad", k_linear_wgrad,
             "linear_wgrad(state, w_tensor, b_tensor, dy, x, token_begin, *, num_threads=0)\n"
             "--\n\n"
             "After state.agree: add the weight (TN GEMM over each chunk's rows) and bias "
             "partials of\nevery local chunk to state tensors w_tensor and b_tensor "
             "(bx_linear_wgrad). state\nunchanged on error. Threads: the GEMM's blocks. GIL "
             "released."),
    BXK_METH("embedding_grad_bound", k_emb_bound,
             "embedding_grad_bound(state, tensor, rows, offsets)\n--\n\n"
             "Before state.agree: raise tensor's bound over the compact rows of an "
             "embedding_backward\noutput (bx_embedding_grad_bound). GIL released."),
    BXK_METH("embedding_grad_add", k_emb_add,
             "embedding_grad_add(state, tensor, first_chunk, row_ids, rows, offsets)\n--\n\n"
             "After state.agree: add every chunk j of an embedding_backward output as global "
             "chunk\nfirst_chunk + j of state tensor tensor (the [V, H] gradient; "
             "bx_embedding_grad_add).\nSingle-threaded; GIL released."),
    {NULL, NULL, 0, NULL}};

bx_tokred *bxpy_tokred_take(PyObject *o, const char *fn, const DLTensor **grads, size_t *n) {
  if (!PyObject_TypeCheck(o, &TokRedType)) {
    bxpy_raise_fmt(BX_EINVAL, NULL, "%s: the gradient state must be a TokRed, got %.80s", fn,
                   Py_TYPE(o)->tp_name);
    return NULL;
  }
  TokRed *t = (TokRed *)o;
  if (tr_check(t, fn) < 0) return NULL;
  t->busy = 1;
  if (grads) *grads = t->grads;
  if (n) *n = t->n;
  return t->s;
}

void bxpy_tokred_give(PyObject *o) { ((TokRed *)o)->busy = 0; }

int bxpy_tokred_init(PyObject *m) {
  if (PyType_Ready(&TokRedType) < 0) return -1;
  Py_INCREF(&TokRedType);
  if (PyModule_AddObject(m, "TokRed", (PyObject *)&TokRedType) < 0) {
    Py_DECREF(&TokRedType);
    return -1;
  }
  return 0;
}
