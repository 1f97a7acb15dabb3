/*
 * _core.c — the CPython binding of libbitexact (module bitexact._core).
 *
 * One job: turn Python objects that speak DLPack into borrowed DLTensor
 * views, call the C API on them with the GIL released, and turn a
 * bx_status into a Python exception carrying bx_last_error().
 *
 * Views own what they exported: each DLPack capsule is consumed (renamed
 * "used_dltensor" / "used_dltensor_versioned", as the DLPack Python
 * specification asks of a consumer) and its deleter is called by
 * Views.release() (or when the Views object dies). No data is copied.
 *
 * CUDA tensors (kDLCUDA): the blocking calls below run on the legacy
 * default stream (the library's blocking CUDA path), after a device check
 * that names the tensor at fault (_cuda.c); the stream-ordered path is
 * Views.cuda_plan (_cuda.c).
 *
 * A Python communicator is a callable comm(buf, op): buf is a bytearray
 * holding n native int64 words, op is "sum" or "max"; it replaces buf's
 * contents with the all-reduced words (or returns a bytes-like object of
 * the same size holding them). The library calls it from the calling thread
 * with the GIL released; the trampoline below takes the GIL back.
 */
#include "_bxpy.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Not in the public header: the kernel table chosen for this CPU. */
const char *bx_isa_name(void);

/* ------------------------------------------------------------------------
 * Exceptions: one class per bx_status, each also a builtin Python users
 * expect (ValueError, TypeError, MemoryError); the base is RuntimeError.
 * ---------------------------------------------------------------------- */
static PyObject *Error;
PyObject *bxpy_status_exc[BX_EINTERNAL + 1];

static const struct {
  bx_status status;
  const char *name, *doc;
  PyObject **builtin; /* second base, or NULL */
} exc_table[] = {
    {BX_EINVAL, "InvalidArgumentError", "BX_EINVAL: invalid argument (also a ValueError).",
     &PyExc_ValueError},
    {BX_EDTYPE, "DTypeError", "BX_EDTYPE: unsupported dtype or not a DLPack tensor (also a TypeError).",
     &PyExc_TypeError},
    {BX_EDEVICE, "DeviceError", "BX_EDEVICE: tensor on a device this build cannot read (also a ValueError).",
     &PyExc_ValueError},
    {BX_ELAYOUT, "LayoutError", "BX_ELAYOUT: strided with gaps, aliasing or overlapping (also a ValueError).",
     &PyExc_ValueError},
    {BX_ENONFINITE, "NonFiniteError", "BX_ENONFINITE: NaN/Inf with error_if_nonfinite; nothing was modified.",
     NULL},
    {BX_ENOMEM, "OutOfMemoryError", "BX_ENOMEM: allocation failed (also a MemoryError).",
     &PyExc_MemoryError},
    {BX_ECOMM, "CommError", "BX_ECOMM: the communicator's all-reduce failed.", NULL},
    {BX_EMISMATCH, "MismatchError", "BX_EMISMATCH: ranks disagree on build, groups or options.", NULL},
    {BX_EINTERNAL, "InternalError", "BX_EINTERNAL: a bug in bitexact, please report.", NULL},
};

PyObject *bxpy_raise_status(bx_status st, const char *msg, PyObject *cause) {
  PyObject *cls = st > BX_OK && st <= BX_EINTERNAL && bxpy_status_exc[st] ? bxpy_status_exc[st] : Error;
  PyObject *exc = PyObject_CallFunction(cls, "s", msg && *msg ? msg : bx_status_str(st));
  if (exc) {
    PyObject *code = PyLong_FromLong((long)st);
    if (code) {
      PyObject_SetAttrString(exc, "status", code);
      Py_DECREF(code);
    }
    if (cause) PyException_SetCause(exc, cause); /* steals cause */
    PyErr_SetObject(cls, exc);
    Py_DECREF(exc);
  } else {
    Py_XDECREF(cause);
  }
  return NULL;
}

static PyObject *raise_last(bx_status st) { return bxpy_raise_status(st, bx_last_error(), NULL); }

PyObject *bxpy_take_exception(void) {
  PyObject *t, *v, *tb;
  PyErr_Fetch(&t, &v, &tb);
  if (!t) return NULL;
  PyErr_NormalizeException(&t, &v, &tb);
  if (tb && v) PyException_SetTraceback(v, tb);
  Py_XDECREF(t);
  Py_XDECREF(tb);
  return v;
}

/* ------------------------------------------------------------------------
 * Python communicator trampoline
 * ---------------------------------------------------------------------- */
typedef struct pycomm {
  PyObject *fn;
  PyObject *error; /* the callback's exception, kept for __cause__ */
} pycomm;

static int pycomm_allreduce(int64_t *buf, size_t n, bx_op op, void *ctx) {
  pycomm *c = ctx;
  int rc = 1;
  PyGILState_STATE gil = PyGILState_Ensure();
  Py_ssize_t bytes = (Py_ssize_t)(n * sizeof(int64_t));
  PyObject *ba = PyByteArray_FromStringAndSize((const char *)buf, bytes);
  PyObject *res = ba ? PyObject_CallFunction(c->fn, "Os", ba, op == BX_OP_SUM ? "sum" : "max")
                     : NULL;
  if (res && res != Py_None) { /* the callback returned the words */
    Py_buffer view;
    if (PyObject_GetBuffer(res, &view, PyBUF_SIMPLE) == 0) {
      if (view.len == bytes) {
        memcpy(buf, view.buf, (size_t)bytes);
        rc = 0;
      } else {
        PyErr_Format(PyExc_ValueError, "comm returned %zd bytes, expected %zd", view.len, bytes);
      }
      PyBuffer_Release(&view);
    }
  } else if (res) { /* None: buf was all-reduced in place */
    if (PyByteArray_GET_SIZE(ba) == bytes) {
      memcpy(buf, PyByteArray_AS_STRING(ba), (size_t)bytes);
      rc = 0;
    } else {
      PyErr_SetString(PyExc_ValueError, "comm changed the size of its buffer");
    }
  }
  if (rc != 0 && !c->error) c->error = bxpy_take_exception();
  PyErr_Clear();
  Py_XDECREF(res);
  Py_XDECREF(ba);
  PyGILState_Release(gil);
  return rc;
}

/* After a failed call: raise, with the callback's exception as cause. */
static PyObject *raise_call(bx_status st, pycomm *pc) {
  PyObject *cause = pc ? pc->error : NULL;
  if (pc) pc->error = NULL;
  return bxpy_raise_status(st, bx_last_error(), cause);
}

/* ------------------------------------------------------------------------
 * Views: the exported tensors of one call, grouped.
 * ---------------------------------------------------------------------- */
/* (struct Views is in _bxpy.h: _cuda.c reads it too) */

void bxpy_views_where(const Views *v, Py_ssize_t k, Py_ssize_t *g, Py_ssize_t *i) {
  Py_ssize_t gg = 0;
  while (gg < v->ngroups - 1 && k >= (Py_ssize_t)v->groups[gg].count) {
    k -= (Py_ssize_t)v->groups[gg].count;
    gg++;
  }
  *g = gg;
  *i = k;
}

static void views_release_all(Views *v) {
  for (Py_ssize_t i = 0; i < v->n; i++) bxpy_release_owner(&v->own[i]);
  v->released = 1;
}

static void Views_dealloc(Views *v) {
  if (v->own) views_release_all(v);
  PyMem_Free(v->dl);
  PyMem_Free(v->own);
  PyMem_Free(v->groups);
  Py_TYPE(v)->tp_free((PyObject *)v);
}

/* Views(groups): groups is a sequence of sequences of tensors. */
static PyObject *Views_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
  static char *kwlist[] = {"groups", NULL};
  PyObject *groups_obj;
  if (!PyArg_ParseTupleAndKeywords(args, kwds, "O:Views", kwlist, &groups_obj)) return NULL;
  PyObject *outer = PySequence_Fast(groups_obj, "groups must be a sequence of sequences");
  if (!outer) return NULL;
  Py_ssize_t ng = PySequence_Fast_GET_SIZE(outer), n = 0;
  PyObject **inner = PyMem_Calloc((size_t)(ng ? ng : 1), sizeof *inner);
  Views *v = (Views *)type->tp_alloc(type, 0);
  if (!inner || !v) goto fail;
  for (Py_ssize_t g = 0; g < ng; g++) {
    inner[g] = PySequence_Fast(PySequence_Fast_GET_ITEM(outer, g),
                               "each group must be a sequence of tensors");
    if (!inner[g]) goto fail;
    n += PySequence_Fast_GET_SIZE(inner[g]);
  }
  v->ngroups = ng;
  v->first_cuda = v->first_host = v->other_cuda = -1;
  v->dl = PyMem_Calloc((size_t)(n ? n : 1), sizeof *v->dl);
  v->own = PyMem_Calloc((size_t)(n ? n : 1), sizeof *v->own);
  v->groups = PyMem_Calloc((size_t)(ng ? ng : 1), sizeof *v->groups);
  if (!v->dl || !v->own || !v->groups) {
    PyErr_NoMemory();
    goto fail;
  }
  for (Py_ssize_t g = 0; g < ng; g++) {
    Py_ssize_t cnt = PySequence_Fast_GET_SIZE(inner[g]);
    PyObject **items = PySequence_Fast_ITEMS(inner[g]);
    v->groups[g].tensors = v->dl + v->n;
    v->groups[g].count = (size_t)cnt;
    for (Py_ssize_t i = 0; i < cnt; i++) {
      if (bxpy_export_tensor(items[i], &v->dl[v->n], &v->own[v->n], g, i) < 0) goto fail;
      const DLTensor *t = &v->dl[v->n];
      v->dtypes |= bxpy_dtype_bit(t->dtype);
      if (t->device.device_type == kDLCUDA) {
        if (v->ncuda++ == 0) {
          v->first_cuda = v->n;
          v->cuda_device = t->device.device_id;
        } else if (t->device.device_id != v->cuda_device && v->other_cuda < 0) {
          v->other_cuda = v->n;
        }
      } else if (v->first_host < 0) {
        v->first_host = v->n;
      }
      v->n++;
    }
  }
  for (Py_ssize_t g = 0; g < ng; g++) Py_DECREF(inner[g]);
  PyMem_Free(inner);
  Py_DECREF(outer);
  return (PyObject *)v;
fail:
  if (inner)
    for (Py_ssize_t g = 0; g < ng; g++) Py_XDECREF(inner[g]);
  PyMem_Free(inner);
  Py_DECREF(outer);
  Py_XDECREF(v); /* releases what was exported */
  return NULL;
}

static int views_check(Views *v) {
  if (v->released) {
    PyErr_SetString(bxpy_status_exc[BX_EINVAL], "these views were released");
    return -1;
  }
  if (v->busy) {
    PyErr_SetString(bxpy_status_exc[BX_EINVAL], "these views are in use by another thread");
    return -1;
  }
  return 0;
}

/* Before writing: refuse read-only exports and producer-made copies. */
static int views_check_writable(Views *v) {
  Py_ssize_t k = 0;
  for (Py_ssize_t g = 0; g < v->ngroups; g++)
    for (size_t i = 0; i < v->groups[g].count; i++, k++) {
      if (v->own[k].flags & BXPY_FLAG_READ_ONLY) {
        PyErr_Format(bxpy_status_exc[BX_EINVAL],
                     "group %zd, tensor %zu is read-only (its producer exported it "
                     "with the DLPack read-only flag); nothing was modified",
                     g, i);
        return -1;
      }
      if (v->own[k].flags & BXPY_FLAG_IS_COPIED) {
        PyErr_Format(bxpy_status_exc[BX_EINVAL],
                     "group %zd, tensor %zu was exported as a copy (DLPack IS_COPIED), so "
                     "scaling it in place would be lost; nothing was modified",
                     g, i);
        return -1;
      }
    }
  return 0;
}

/* ---- memory shared between tensors to be scaled ----------------------
 * The stream-ordered CUDA scaling goes through plans of subsets of the
 * tensors (one per dtype class), each of which only sees overlaps among its
 * own tensors, and only when it is enqueued. So before enqueueing any of
 * them, bitexact.torch checks the whole call here (host-side, from the
 * DLPack metadata alone): a tensor that shares memory with another would be
 * scaled twice. The span of a tensor is the byte range its strides reach;
 * the library refuses strided-with-gaps layouts anyway, so for the tensors
 * that get this far the span is exactly their memory. */
typedef struct span {
  int64_t dev; /* device type and id: addresses compare within one device */
  uintptr_t lo, hi;
  Py_ssize_t k; /* flat index */
} span;

static int span_cmp(const void *a, const void *b) {
  const span *x = a, *y = b;
  if (x->dev != y->dev) return x->dev < y->dev ? -1 : 1;
  if (x->lo != y->lo) return x->lo < y->lo ? -1 : 1;
  return x->k < y->k ? -1 : x->k > y->k;
}

/* 0 when no two tensors of v share memory; else -1 with LayoutError set,
 * naming the first pair found (the earlier tensor first). */
static int views_check_disjoint(Views *v) {
  if (v->n < 2) return 0;
  span *sp = PyMem_Malloc((size_t)v->n * sizeof *sp);
  if (!sp) {
    PyErr_NoMemory();
    return -1;
  }
  Py_ssize_t m = 0;
  for (Py_ssize_t k = 0; k < v->n; k++) {
    const DLTensor *t = &v->dl[k];
    uint64_t es = ((uint64_t)t->dtype.bits * (t->dtype.lanes ? t->dtype.lanes : 1) + 7) / 8;
    int64_t neg = 0, pos = 0, n = 1;
    for (int d = 0; d < t->ndim; d++) {
      int64_t len = t->shape ? t->shape[d] : 0;
      if (len <= 0) n = 0;
      if (n == 0) break;
      n *= len;
      if (t->strides) {
        int64_t reach = (len - 1) * t->strides[d];
        if (reach < 0) neg += reach;
        else pos += reach;
      }
    }
    if (n == 0 || !es) continue; /* no element: shares nothing */
    if (!t->strides) pos = n - 1;  /* compact row-major */
    uintptr_t base = (uintptr_t)t->data + (uintptr_t)t->byte_offset;
    sp[m].dev = ((int64_t)t->device.device_type << 32) | (uint32_t)t->device.device_id;
    sp[m].lo = base - (uintptr_t)((uint64_t)(-neg) * es);
    sp[m].hi = base + (uintptr_t)(((uint64_t)pos + 1) * es);
    sp[m].k = k;
    m++;
  }
  qsort(sp, (size_t)m, sizeof *sp, span_cmp);
  Py_ssize_t a = -1, b = -1;
  for (Py_ssize_t j = 1; j < m; j++)
    if (sp[j].dev == sp[j - 1].dev && sp[j].lo < sp[j - 1].hi) {
      a = sp[j - 1].k < sp[j].k ? sp[j - 1].k : sp[j].k;
      b = sp[j - 1].k < sp[j].k ? sp[j].k : sp[j - 1].k;
      break;
    }
  PyMem_Free(sp);
  if (a < 0) return 0;
  Py_ssize_t ga, ia, gb, ib;
  bxpy_views_where(v, a, &ga, &ia);
  bxpy_views_where(v, b, &gb, &ib);
  PyErr_Format(bxpy_status_exc[BX_ELAYOUT],
               "group %zd, tensor %zd and group %zd, tensor %zd share memory (the same tensor "
               "twice, or overlapping views): each element must be scaled once; nothing was "
               "modified (a norm alone accepts them, counting shared elements twice)",
               ga, ia, gb, ib);
  return -1;
}

/* ---- correctly rounded norms in fp32 / bf16 / fp16 --------------------
 * bx_total_norm returns the correctly rounded fp64 norm d. Rounding d again
 * to a narrower format is correct unless d is exactly a midpoint of that
 * format (d is then a (p+1)-bit number: the true norm x may lie on either
 * side of it). Only then is the exact sum needed: its sign against d^2
 * (p = 2) or d (p = 1) decides. Every rank gets the same d, so every rank
 * takes the same branch (and the same extra collective). */
typedef struct fmtinfo {
  int p, emin, emax;
} fmtinfo;
static const fmtinfo formats[4] = {{53, -1022, 1023}, {24, -126, 127}, {8, -126, 127}, {11, -14, 15}};

/* Sign of (exact sum) - (the same sum for the single value d). */
static bx_status exact_sign(Views *v, Py_ssize_t ngroups, int squares, double d,
                            const bx_comm *comm, int *sign) {
  bx_acc s, t;
  bx_status st = BX_OK;
  bx_acc_init(&s);
  for (Py_ssize_t g = 0; g < ngroups; g++)
    for (size_t i = 0; i < v->groups[g].count && st == BX_OK; i++)
      st = bxpy_acc_add(&s, &v->groups[g].tensors[i], squares); /* CUDA ones: via the host */
  if (st != BX_OK) return st;
  if (comm && comm->allreduce_i64((int64_t *)&s, BX_ACC_WORDS, BX_OP_SUM, comm->ctx) != 0)
    return BX_ECOMM;
  int64_t shape = 1;
  DLTensor one = {&d, {kDLCPU, 0}, 1, {kDLFloat, 64, 1}, &shape, NULL, 0};
  bx_acc_init(&t);
  st = squares ? bx_acc_add_squares(&t, &one) : bx_acc_add_abs(&t, &one);
  if (st == BX_OK) *sign = bx_acc_compare(&s, &t);
  return st;
}

/* Round a norm d >= 0 (correctly rounded fp64) to format f, correctly. */
static bx_status round_norm(Views *v, Py_ssize_t ngroups, double p, const bx_comm *comm,
                            const fmtinfo *f, double d, double *out) {
  *out = d;
  if (f->p == 53 || !(d > 0) || isinf(d)) return BX_OK;
  int e = ilogb(d);
  if (e < f->emin) e = f->emin;
  double q = ldexp(1.0, e - f->p + 1), r = fmod(d, q), lo = d - r, res;
  if (r > q / 2) res = lo + q;
  else if (r < q / 2) res = lo;
  else {
    int sign = 0;
    if (p == 2.0 || p == 1.0) {
      bx_status st = exact_sign(v, ngroups, p == 2.0, d, comm, &sign);
      if (st != BX_OK) return st;
    }
    if (sign > 0) res = lo + q;
    else if (sign < 0) res = lo;
    else res = fmod(lo / q, 2.0) == 0.0 ? lo : lo + q; /* ties to even */
  }
  if (res > ldexp(2.0 - ldexp(1.0, 1 - f->p), f->emax)) res = INFINITY;
  *out = res;
  return BX_OK;
}

/* Views.norm(norm_type=2.0, error_if_nonfinite=False, num_threads=0,
 *            flavor=0, comm=None, rank=0, ngroups=-1, group_norms=False,
 *            out_format=0) -> (total, [group norms] or None)
 * ngroups: use only the first ngroups groups (-1: all). out_format: 0 fp64,
 * 1 fp32, 2 bf16, 3 fp16 — total is then the correctly rounded norm in that
 * format (as a float whose value the format holds exactly). */
static PyObject *Views_norm(Views *v, PyObject *args, PyObject *kwds) {
  static char *kwlist[] = {"norm_type", "error_if_nonfinite", "num_threads", "flavor", "comm",
                           "rank", "ngroups", "group_norms", "out_format", NULL};
  bx_norm_opts o = BX_NORM_OPTS_DEFAULT;
  int flavor = 0, rank = 0, want_groups = 0, fmt = 0;
  Py_ssize_t ng = -1;
  PyObject *comm_fn = Py_None;
  if (!PyArg_ParseTupleAndKeywords(args, kwds, "|dpiiOinpi:norm", kwlist, &o.norm_type,
                                   &o.error_if_nonfinite, &o.num_threads, &flavor, &comm_fn,
                                   &rank, &ng, &want_groups, &fmt))
    return NULL;
  if (views_check(v) < 0 || bxpy_views_check_device(v) < 0) return NULL;
  if (ng < 0 || ng > v->ngroups) ng = v->ngroups;
  if (fmt < 0 || fmt > 3) return bxpy_raise_status(BX_EINVAL, "out_format must be 0..3", NULL);
  o.flavor = (bx_norm_flavor)flavor;
  pycomm pc = {comm_fn, NULL};
  bx_comm comm = {.allreduce_i64 = pycomm_allreduce, .ctx = &pc, .rank = rank};
  const bx_comm *cp = comm_fn == Py_None ? NULL : &comm;
  double *gn = want_groups && ng ? PyMem_Malloc((size_t)ng * sizeof(double)) : NULL;
  if (want_groups && ng && !gn) return PyErr_NoMemory();
  double total = 0, rounded = 0;
  bx_status st;
  v->busy = 1;
  Py_BEGIN_ALLOW_THREADS
  st = bx_total_norm(v->groups, (size_t)ng, cp, &o, &total, gn);
  if (st == BX_OK)
    st = round_norm(v, ng, o.flavor == BX_EXACT ? o.norm_type : -1.0, cp, &formats[fmt], total,
                    &rounded);
  Py_END_ALLOW_THREADS
  v->busy = 0;
  PyObject *res = NULL, *list = Py_None;
  Py_INCREF(Py_None);
  if (st != BX_OK) {
    raise_call(st, &pc);
    goto done;
  }
  if (gn) {
    Py_DECREF(list);
    list = PyList_New(ng);
    if (!list) goto done;
    for (Py_ssize_t g = 0; g < ng; g++) PyList_SET_ITEM(list, g, PyFloat_FromDouble(gn[g]));
  } else if (want_groups) {
    Py_DECREF(list);
    list = PyList_New(0);
    if (!list) goto done;
  }
  res = Py_BuildValue("(dO)", rounded, list);
done:
  Py_XDECREF(pc.error);
  Py_XDECREF(list);
  PyMem_Free(gn);
  return res;
}

/* Views.scale(coef, mode=0, num_threads=0): every tensor *= coef. */
static PyObject *Views_scale(Views *v, PyObject *args, PyObject *kwds) {
  static char *kwlist[] = {"coef", "mode", "num_threads", NULL};
  double coef;
  bx_scale_opts o = BX_SCALE_OPTS_DEFAULT;
  int mode = 0;
  if (!PyArg_ParseTupleAndKeywords(args, kwds, "d|ii:scale", kwlist, &coef, &mode,
                                   &o.num_threads))
    return NULL;
  if (views_check(v) < 0 || views_check_writable(v) < 0 || bxpy_views_check_device(v) < 0)
    return NULL;
  o.mode = (bx_scale_mode)mode;
  bx_status st;
  v->busy = 1;
  Py_BEGIN_ALLOW_THREADS
  st = bx_scale(v->dl, (size_t)v->n, coef, &o);
  Py_END_ALLOW_THREADS
  v->busy = 0;
  if (st != BX_OK) return raise_last(st);
  Py_RETURN_NONE;
}

/* Views.clip(max_norm, norm_type=2.0, error_if_nonfinite=False,
 *            num_threads=0, flavor=0, scale_mode=0, eps=1e-6, formula=0,
 *            comm=None, rank=0) -> (total, coef): bx_clip_grad_norm. */
static PyObject *Views_clip(Views *v, PyObject *args, PyObject *kwds) {
  static char *kwlist[] = {"max_norm", "norm_type", "error_if_nonfinite", "num_threads",
                           "flavor", "scale_mode", "eps", "formula", "comm", "rank", NULL};
  bx_clip_opts o = BX_CLIP_OPTS_DEFAULT;
  double max_norm;
  int flavor = 0, mode = 0, formula = 0, rank = 0;
  PyObject *comm_fn = Py_None;
  if (!PyArg_ParseTupleAndKeywords(args, kwds, "d|dpiiidiOi:clip", kwlist, &max_norm,
                                   &o.norm.norm_type, &o.norm.error_if_nonfinite,
                                   &o.norm.num_threads, &flavor, &mode, &o.eps, &formula,
                                   &comm_fn, &rank))
    return NULL;
  if (views_check(v) < 0 || views_check_writable(v) < 0 || bxpy_views_check_device(v) < 0)
    return NULL;
  o.norm.flavor = (bx_norm_flavor)flavor;
  o.scale.mode = (bx_scale_mode)mode;
  o.scale.num_threads = o.norm.num_threads;
  o.formula = (bx_coef_formula)formula;
  pycomm pc = {comm_fn, NULL};
  bx_comm comm = {.allreduce_i64 = pycomm_allreduce, .ctx = &pc, .rank = rank};
  double total = 0, coef = 1;
  bx_status st;
  v->busy = 1;
  Py_BEGIN_ALLOW_THREADS
  st = bx_clip_grad_norm(v->groups, (size_t)v->ngroups, comm_fn == Py_None ? NULL : &comm,
                         max_norm, &o, &total, &coef);
  Py_END_ALLOW_THREADS
  v->busy = 0;
  if (st != BX_OK) return raise_call(st, &pc);
  Py_XDECREF(pc.error);
  return Py_BuildValue("(dd)", total, coef);
}

/* Views.check_scale_targets(): raise unless every tensor may be scaled in
 * place by one call: writable exports (not read-only, not copies) and no
 * two tensors sharing memory (LayoutError naming both). Host-side only;
 * bitexact.torch calls it before enqueueing a stream-ordered scaling. */
static PyObject *Views_check_scale_targets(Views *v, PyObject *unused) {
  (void)unused;
  if (views_check(v) < 0 || views_check_writable(v) < 0 || views_check_disjoint(v) < 0)
    return NULL;
  Py_RETURN_NONE;
}

/* Views.check_device(): raise DeviceError unless the blocking calls can
 * run on these tensors' devices (see bxpy_views_check_device). */
static PyObject *Views_check_device(Views *v, PyObject *unused) {
  (void)unused;
  if (bxpy_views_check_device(v) < 0) return NULL;
  Py_RETURN_NONE;
}

static PyObject *Views_release(Views *v, PyObject *unused) {
  (void)unused;
  if (v->busy) return bxpy_raise_status(BX_EINVAL, "these views are in use by another thread", NULL);
  views_release_all(v);
  Py_RETURN_NONE;
}

static PyObject *Views_enter(Views *v, PyObject *unused) {
  (void)unused;
  Py_INCREF(v);
  return (PyObject *)v;
}

static PyObject *Views_exit(Views *v, PyObject *args) {
  (void)args;
  return Views_release(v, NULL);
}

static Py_ssize_t Views_len(Views *v) { return v->n; }

static PyObject *Views_get_dtypes(Views *v, void *closure) {
  (void)closure;
  return PyLong_FromUnsignedLong(v->dtypes);
}

static PyObject *Views_get_ngroups(Views *v, void *closure) {
  (void)closure;
  return PyLong_FromSsize_t(v->ngroups);
}

/* ("none" | "host" | "cuda" | "mixed", CUDA device id or -1): where the
 * tensors live. "host": no kDLCUDA tensor (the library decides about the
 * other device types); "mixed": kDLCUDA and other tensors, or kDLCUDA
 * tensors on several devices. */
static PyObject *Views_get_device(Views *v, void *closure) {
  (void)closure;
  const char *kind = v->n == 0        ? "none"
                     : v->ncuda == 0  ? "host"
                     : v->ncuda == v->n && v->other_cuda < 0 ? "cuda"
                                                             : "mixed";
  return Py_BuildValue("(si)", kind, v->ncuda ? v->cuda_device : -1);
}

static PyMethodDef Views_methods[] = {
    {"norm", (PyCFunction)(void (*)(void))Views_norm, METH_VARARGS | METH_KEYWORDS,
     "bx_total_norm over the first ngroups groups -> (total, group norms or None)"},
    {"scale", (PyCFunction)(void (*)(void))Views_scale, METH_VARARGS | METH_KEYWORDS,
     "bx_scale over every tensor, in place"},
    {"clip", (PyCFunction)(void (*)(void))Views_clip, METH_VARARGS | METH_KEYWORDS,
     "bx_clip_grad_norm over every group -> (total, coef)"},
    {"cuda_plan", (PyCFunction)(void (*)(void))bxpy_views_cuda_plan,
     METH_VARARGS | METH_KEYWORDS,
     "the cached stream-ordered CUDA plan of (some of) these tensors (see _cuda.c)"},
    {"check_scale_targets", (PyCFunction)Views_check_scale_targets, METH_NOARGS,
     "raise unless every tensor is writable and no two share memory (LayoutError)"},
    {"check_device", (PyCFunction)Views_check_device, METH_NOARGS,
     "raise DeviceError unless one device holds every tensor and can be used"},
    {"release", (PyCFunction)Views_release, METH_NOARGS, "call the DLPack deleters now"},
    {"__enter__", (PyCFunction)Views_enter, METH_NOARGS, NULL},
    {"__exit__", (PyCFunction)Views_exit, METH_VARARGS, NULL},
    {NULL, NULL, 0, NULL}};

static PyGetSetDef Views_getset[] = {
    {"dtypes", (getter)Views_get_dtypes, NULL, "bit mask: 1 f16, 2 bf16, 4 f32, 8 f64, 16 other",
     NULL},
    {"ngroups", (getter)Views_get_ngroups, NULL, "number of groups", NULL},
    {"device", (getter)Views_get_device, NULL,
     "(kind, cuda device): kind 'none', 'host', 'cuda' or 'mixed'", NULL},
    {NULL, NULL, NULL, NULL, NULL}};

static PySequenceMethods Views_as_sequence = {.sq_length = (lenfunc)Views_len};

static PyTypeObject ViewsType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "bitexact._core.Views",
    .tp_basicsize = sizeof(Views),
    .tp_dealloc = (destructor)Views_dealloc,
    .tp_as_sequence = &Views_as_sequence,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Views(groups): borrowed DLPack views of groups of tensors, exported once",
    .tp_methods = Views_methods,
    .tp_getset = Views_getset,
    .tp_new = Views_new,
};

/* ------------------------------------------------------------------------
 * Module functions
 * ---------------------------------------------------------------------- */
static PyObject *mod_clip_coef(PyObject *self, PyObject *args, PyObject *kwds) {
  (void)self;
  static char *kwlist[] = {"total_norm", "max_norm", "eps", "formula", NULL};
  bx_clip_opts o = BX_CLIP_OPTS_DEFAULT;
  double total, max_norm, coef;
  int formula = 0;
  if (!PyArg_ParseTupleAndKeywords(args, kwds, "dd|di:clip_coef", kwlist, &total, &max_norm,
                                   &o.eps, &formula))
    return NULL;
  o.formula = (bx_coef_formula)formula;
  bx_status st = bx_clip_coef(total, max_norm, &o, &coef);
  if (st != BX_OK) return raise_last(st);
  return PyFloat_FromDouble(coef);
}

static PyObject *mod_version(PyObject *self, PyObject *unused) {
  (void)self, (void)unused;
  unsigned v = bx_version();
  return PyUnicode_FromFormat("%u.%u.%u", v / 10000, v / 100 % 100, v % 100);
}

static PyObject *mod_isa(PyObject *self, PyObject *unused) {
  (void)self, (void)unused;
  return PyUnicode_FromString(bx_isa_name());
}

static PyObject *mod_status_str(PyObject *self, PyObject *args) {
  (void)self;
  int st;
  if (!PyArg_ParseTuple(args, "i:status_str", &st)) return NULL;
  return PyUnicode_FromString(bx_status_str((bx_status)st));
}

/* The binding table. */
static PyMethodDef module_methods[] = {
    {"clip_coef", (PyCFunction)(void (*)(void))mod_clip_coef, METH_VARARGS | METH_KEYWORDS,
     "bx_clip_coef(total_norm, max_norm, eps=1e-6, formula=0) -> coef"},
    {"register_exporter", bxpy_register_exporter, METH_VARARGS,
     "register_exporter(type, fn): objects of exactly this type export via fn(obj) -> capsule"},
    {"version", mod_version, METH_NOARGS, "bx_version() as 'major.minor.patch'"},
    {"isa", mod_isa, METH_NOARGS, "the CPU kernel table in use: portable, avx2 or avx512"},
    {"status_str", mod_status_str, METH_VARARGS, "bx_status_str(status)"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "bitexact._core",
                                        "CPython binding of libbitexact", -1, module_methods,
                                        NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__core(void);
PyMODINIT_FUNC PyInit__core(void) {
  PyObject *m = PyModule_Create(&module_def);
  if (!m) return NULL;
  if (PyType_Ready(&ViewsType) < 0) goto fail;
  Py_INCREF(&ViewsType);
  if (PyModule_AddObject(m, "Views", (PyObject *)&ViewsType) < 0) goto fail;
  Error = PyErr_NewExceptionWithDoc(
      "bitexact.Error", "Base of bitexact's errors (a RuntimeError); .status is the bx_status.",
      PyExc_RuntimeError, NULL);
  if (!Error || PyModule_AddObjectRef(m, "Error", Error) < 0) goto fail;
  for (size_t k = 0; k < sizeof exc_table / sizeof exc_table[0]; k++) {
    char qual[96];
    PyOS_snprintf(qual, sizeof qual, "bitexact.%s", exc_table[k].name);
    PyObject *bases = exc_table[k].builtin ? PyTuple_Pack(2, Error, *exc_table[k].builtin)
                                           : PyTuple_Pack(1, Error);
    if (!bases) goto fail;
    PyObject *cls = PyErr_NewExceptionWithDoc(qual, exc_table[k].doc, bases, NULL);
    Py_DECREF(bases);
    if (!cls) goto fail;
    bxpy_status_exc[exc_table[k].status] = cls;
    if (PyModule_AddObjectRef(m, exc_table[k].name, cls) < 0) goto fail;
  }
  if (bxpy_dlpack_init() < 0) goto fail;
  if (PyModule_AddFunctions(m, bxpy_cuda_methods) < 0 || bxpy_cuda_init(m) < 0) goto fail;
  if (PyModule_AddIntConstant(m, "ACC_WORDS", BX_ACC_WORDS) < 0) goto fail;
  return m;
fail:
  Py_DECREF(m);
  return NULL;
}
