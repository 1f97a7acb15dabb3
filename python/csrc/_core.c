/*
 * _core.c — the CPython binding of libbitexact (module bitexact._core).
 *
 * One job: turn Python objects that speak DLPack into borrowed DLTensor
 * views, call the C API on them with the GIL released, and turn a
 * bx_status into a Python exception carrying bx_last_error() as its text
 * and bx_last_error_location() as integer attributes (rank, group, tensor;
 * other_group and other_tensor for the second of two tensors sharing
 * memory), from which bitexact's Python code names the caller's
 * parameters. No numerics here: norms are rounded into the requested
 * dtype by the library (bx_norm_opts.norm_dtype), overlaps are found by
 * the library's one check (bx_check_writable).
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
 * with the GIL released; the trampoline below takes the GIL back. It may
 * call bitexact again (re-entry, up to BX_MAX_NESTING calls deep).
 */
#include "_bxpy.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "call.h"        /* src/core: a call frame around bx_check_writable */
#include "error.h"       /* src/core: bx_error_save / bx_error_restore */
#include "fpenv.h"       /* src/core: the library's floating-point environment */
#include "norm_finish.h" /* src/common: bx_norm_store, a norm's bits in a dtype */
#include "tensor.h"      /* src/core: bx_check_writable, the one overlap check */

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

/* The exception's attributes: status and where (see bxpy_where). */
static const char *const where_names[5] = {"rank", "group", "tensor", "other_group",
                                           "other_tensor"};

static int set_int_attr(PyObject *exc, const char *name, long long v) {
  PyObject *o = PyLong_FromLongLong(v);
  int rc = o ? PyObject_SetAttrString(exc, name, o) : -1;
  Py_XDECREF(o);
  return rc;
}

PyObject *bxpy_raise_at(bx_status st, const char *msg, PyObject *cause, const bxpy_where *w) {
  static const bxpy_where none = BXPY_NOWHERE;
  if (!w) w = &none;
  PyObject *cls = st > BX_OK && st <= BX_EINTERNAL && bxpy_status_exc[st] ? bxpy_status_exc[st] : Error;
  PyObject *exc = PyObject_CallFunction(cls, "s", msg && *msg ? msg : bx_status_str(st));
  if (!exc) {
    Py_XDECREF(cause);
    return NULL;
  }
  const long long at[5] = {w->rank, w->group, w->tensor, w->other_group, w->other_tensor};
  int rc = set_int_attr(exc, "status", (long long)st);
  for (int k = 0; k < 5 && rc == 0; k++) rc = set_int_attr(exc, where_names[k], at[k]);
  if (rc < 0) { /* out of memory: that error instead */
    Py_DECREF(exc);
    Py_XDECREF(cause);
    return NULL;
  }
  if (cause) PyException_SetCause(exc, cause); /* steals cause */
  PyErr_SetObject(cls, exc);
  Py_DECREF(exc);
  return NULL;
}

PyObject *bxpy_raise_status(bx_status st, const char *msg, PyObject *cause) {
  return bxpy_raise_at(st, msg, cause, NULL);
}

PyObject *bxpy_raise_fmt(bx_status st, const bxpy_where *w, const char *fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  PyOS_vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  return bxpy_raise_at(st, msg, NULL, w);
}

/* bx_last_error_location() as a bxpy_where (no second tensor). */
static bxpy_where last_where(void) {
  const bx_error_location *loc = bx_last_error_location();
  bxpy_where w = {loc->rank, loc->group, loc->tensor, -1, -1};
  return w;
}

PyObject *bxpy_raise_last(bx_status st, PyObject *cause) {
  bxpy_where w = last_where();
  return bxpy_raise_at(st, bx_last_error(), cause, &w);
}

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
const bx_comm *bxpy_pycomm_comm(bxpy_pycomm *pc, bx_comm *comm, PyObject *fn, int rank) {
  pc->fn = fn;
  pc->error = NULL;
  bx_comm c = BX_COMM_DEFAULT;
  c.allreduce_i64 = bxpy_pycomm_allreduce;
  c.ctx = pc;
  c.rank = rank;
  *comm = c;
  return fn == Py_None ? NULL : comm;
}

int bxpy_pycomm_allreduce(int64_t *buf, size_t n, bx_op op, void *ctx) {
  bxpy_pycomm *c = ctx;
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
  if (v->released || v->busy) {
    bxpy_raise_status(BX_EINVAL, v->released ? "these views were released"
                                             : "these views are in use by another thread",
                      NULL);
    return -1;
  }
  return 0;
}

/* Before writing: refuse read-only exports and producer-made copies (the
 * DLPack flags: the library never sees them). */
static int views_check_writable(Views *v) {
  Py_ssize_t k = 0;
  for (Py_ssize_t g = 0; g < v->ngroups; g++)
    for (size_t i = 0; i < v->groups[g].count; i++, k++) {
      bxpy_where w = bxpy_at(g, (Py_ssize_t)i);
      if (v->own[k].flags & BXPY_FLAG_READ_ONLY) {
        bxpy_raise_fmt(BX_EINVAL, &w,
                       "group %zd, tensor %zu is read-only (its producer exported it "
                       "with the DLPack read-only flag); nothing was modified",
                       g, i);
        return -1;
      }
      if (v->own[k].flags & BXPY_FLAG_IS_COPIED) {
        bxpy_raise_fmt(BX_EINVAL, &w,
                       "group %zd, tensor %zu was exported as a copy (DLPack IS_COPIED), so "
                       "scaling it in place would be lost; nothing was modified",
                       g, i);
        return -1;
      }
    }
  return 0;
}

/* ---- tensors written in place: the library's one check -----------------
 * bx_check_writable (src/core/tensor.h) validates tensors to be written
 * (dtype, dense layout, device class) and refuses two that share a byte,
 * naming both in its text and locating one of them. The binding calls it
 * directly for the stream-ordered CUDA scaling (Views.check_scale_targets),
 * which runs through several plans, each seeing only its own tensors. */

/* bx_check_writable in a call frame of its own: the check uses the
 * workspace of the innermost call of this thread, and this one may be made
 * from a communicator callback of another call. */
static bx_status check_writable(const char *fn, const DLTensor *flat, size_t count,
                                const bx_group *groups, size_t ngroups, int cuda) {
  bx_call c;
  bx_status st = bx_call_enter(&c, fn);
  if (st != BX_OK) return st;
  st = bx_check_writable(fn, flat, count, groups, ngroups, cuda);
  bx_call_leave(&c);
  return st;
}

/* After BX_ELAYOUT located at *w (a tensor of v; group -1: v's flat
 * numbering, as bx_scale's): if that tensor is fine alone, it shares memory
 * with another, which the library's text names too; put that one into
 * w->other_*, found by the same check on pairs. The library sorts the
 * tensors (by address, then position), names the first adjacent pair
 * (a, b) that overlaps and locates b; a is the only tensor overlapping b
 * that sorts before it (those before b are disjoint from each other, so
 * only the last reaches b), and a check of a pair locates b exactly when
 * the other tensor sorts first. Failure path only: n checks of two. The
 * library's last error is left as it was. */
static void find_partner(const Views *v, bxpy_where *w) {
  Py_ssize_t k;
  if (w->tensor < 0) return;
  if (w->group >= 0) {
    if (w->group >= v->ngroups || (size_t)w->tensor >= v->groups[w->group].count) return;
    k = (Py_ssize_t)(v->groups[w->group].tensors - v->dl) + (Py_ssize_t)w->tensor;
  } else {
    if (w->tensor >= v->n) return;
    k = (Py_ssize_t)w->tensor;
  }
  int cuda = v->dl[k].device.device_type == kDLCUDA;
  bx_error_saved saved;
  bx_error_save(&saved);
  if (check_writable("", &v->dl[k], 1, NULL, 0, cuda) == BX_OK) {
    for (Py_ssize_t j = 0; j < v->n; j++) {
      if (j == k || (v->dl[j].device.device_type == kDLCUDA) != cuda) continue;
      DLTensor pair[2] = {v->dl[j < k ? j : k], v->dl[j < k ? k : j]};
      if (check_writable("", pair, 2, NULL, 0, cuda) == BX_ELAYOUT &&
          bx_last_error_location()->tensor == (j < k ? 1 : 0)) {
        Py_ssize_t g, i;
        bxpy_views_where(v, j, &g, &i);
        w->other_group = w->group >= 0 ? g : -1;
        w->other_tensor = w->group >= 0 ? i : j;
        break;
      }
    }
  }
  bx_error_restore(&saved);
}

/* After a failed call on v: raise bx_last_error() with its location (and
 * the second tensor of an overlap), the callback's exception as cause.
 * rank: this rank (-1 without a communicator): locations on other ranks
 * are not in v. */
static PyObject *raise_call(Views *v, bx_status st, bxpy_pycomm *pc, int rank) {
  PyObject *cause = pc ? pc->error : NULL;
  if (pc) pc->error = NULL;
  bxpy_where w = last_where();
  if (st == BX_ELAYOUT && (w.rank < 0 || w.rank == rank)) find_partner(v, &w);
  return bxpy_raise_at(st, bx_last_error(), cause, &w);
}

/* 0 when every tensor of v may be written in place by one call; else -1
 * with the library's error raised. Views holding host and CUDA tensors are
 * checked once per device class, the other class's tensors replaced by
 * empty placeholders of this one, so that positions (and so the library's
 * text and location) stay v's. */
static int views_check_targets(Views *v, const char *fn) {
  static int64_t zero_shape[1] = {0};
  int mixed = v->ncuda > 0 && v->ncuda < v->n;
  DLTensor *alt = NULL;
  bx_group *alt_groups = NULL;
  bx_status st = BX_OK;
  if (mixed) {
    alt = PyMem_Malloc((size_t)v->n * sizeof *alt);
    alt_groups = PyMem_Malloc((size_t)(v->ngroups ? v->ngroups : 1) * sizeof *alt_groups);
    if (!alt || !alt_groups) {
      PyMem_Free(alt);
      PyMem_Free(alt_groups);
      PyErr_NoMemory();
      return -1;
    }
    for (Py_ssize_t g = 0; g < v->ngroups; g++) {
      alt_groups[g].tensors = alt + (v->groups[g].tensors - v->dl);
      alt_groups[g].count = v->groups[g].count;
    }
  }
  for (int cuda = 0; cuda < 2 && st == BX_OK; cuda++) {
    if ((cuda ? v->ncuda : v->n - v->ncuda) == 0) continue;
    if (!mixed) {
      st = check_writable(fn, NULL, 0, v->groups, (size_t)v->ngroups, cuda);
      continue;
    }
    for (Py_ssize_t k = 0; k < v->n; k++) {
      if ((v->dl[k].device.device_type == kDLCUDA) == cuda) {
        alt[k] = v->dl[k];
      } else {
        DLTensor empty = {NULL, {cuda ? kDLCUDA : kDLCPU, 0}, 1, {kDLFloat, 32, 1},
                          zero_shape, NULL, 0};
        alt[k] = empty;
      }
    }
    st = check_writable(fn, NULL, 0, alt_groups, (size_t)v->ngroups, cuda);
  }
  PyMem_Free(alt);
  PyMem_Free(alt_groups);
  if (st == BX_OK) return 0;
  raise_call(v, st, NULL, -1);
  return -1;
}

/* The bits of a norm v of the format norm_dtype names (a value of that
 * format, as the library returned it), as the signed integer of the same
 * size (torch: int64/int32/int16, viewed as the float dtype); norm_dtype is
 * a resolved one (never BX_NORM_GRADS). Stored by the library's own code
 * in its floating-point environment: the caller's may flush subnormals
 * (torch.set_flush_denormal sets FTZ/DAZ, under which converting v to fp32
 * in C or Python or torch would give 0). */
static PyObject *norm_bits(double v, int norm_dtype) {
  static const int codes[5] = {BX_DT_F64, -1, BX_DT_F32, BX_DT_BF16, BX_DT_F16};
  int code = norm_dtype >= 0 && norm_dtype <= 4 ? codes[norm_dtype] : -1;
  if (code < 0) Py_RETURN_NONE;
  unsigned char out[8];
  bx_fpenv saved;
  bx_fpenv_enter(&saved);
  bx_norm_store(code, out, v);
  bx_fpenv_leave(&saved);
  int64_t b64;
  int32_t b32;
  int16_t b16;
  switch (code) {
    case BX_DT_F64: memcpy(&b64, out, 8); return PyLong_FromLongLong((long long)b64);
    case BX_DT_F32: memcpy(&b32, out, 4); return PyLong_FromLong((long)b32);
    default: memcpy(&b16, out, 2); return PyLong_FromLong((long)b16);
  }
}

/* Views.norm(norm_type=2.0, error_if_nonfinite=False, num_threads=0,
 *            flavor=0, comm=None, rank=0, ngroups=-1, group_norms=False,
 *            norm_dtype=0) -> (total, [group norms] or None, bits, dtype):
 * bx_total_norm_info. ngroups: use only the first ngroups groups (-1: all).
 * norm_dtype: the bx_norm_dtype (0 fp64, 1 the gradients' dtype as torch
 * promotes it over all ranks, 2 fp32, 3 bf16, 4 fp16): the norms are
 * rounded once into it by the library (floats holding that format's values
 * exactly); dtype: the format the library chose (norm_dtype, or for 1 the
 * one agreed over the ranks: never 1); bits: total's bit pattern in that
 * format (norm_bits), from which bitexact.torch makes its tensor without
 * a conversion. */
static PyObject *Views_norm(Views *v, PyObject *args, PyObject *kwds) {
  static char *kwlist[] = {"norm_type", "error_if_nonfinite", "num_threads", "flavor", "comm",
                           "rank", "ngroups", "group_norms", "norm_dtype", NULL};
  bx_norm_opts o = BX_NORM_OPTS_DEFAULT;
  int flavor = 0, rank = 0, want_groups = 0, norm_dtype = 0;
  Py_ssize_t ng = -1;
  PyObject *comm_fn = Py_None;
  if (!PyArg_ParseTupleAndKeywords(args, kwds, "|dpiiOinpi:norm", kwlist, &o.norm_type,
                                   &o.error_if_nonfinite, &o.num_threads, &flavor, &comm_fn,
                                   &rank, &ng, &want_groups, &norm_dtype))
    return NULL;
  if (views_check(v) < 0 || bxpy_views_check_device(v) < 0) return NULL;
  if (ng < 0 || ng > v->ngroups) ng = v->ngroups;
  o.flavor = (bx_norm_flavor)flavor;
  o.norm_dtype = (bx_norm_dtype)norm_dtype; /* checked by the library */
  bxpy_pycomm pc;
  bx_comm comm;
  const bx_comm *cp = bxpy_pycomm_comm(&pc, &comm, comm_fn, rank);
  double *gn = want_groups && ng ? PyMem_Malloc((size_t)ng * sizeof(double)) : NULL;
  if (want_groups && ng && !gn) return PyErr_NoMemory();
  double total = 0;
  bx_norm_info info = BX_NORM_INFO_DEFAULT;
  bx_status st;
  v->busy = 1;
  Py_BEGIN_ALLOW_THREADS
  st = bx_total_norm_info(v->groups, (size_t)ng, cp, &o, &total, gn, &info);
  Py_END_ALLOW_THREADS
  v->busy = 0;
  PyObject *res = NULL, *list = Py_None, *bits;
  Py_INCREF(Py_None);
  if (st != BX_OK) {
    raise_call(v, st, &pc, cp ? rank : -1);
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
  bits = norm_bits(total, (int)info.norm_dtype);
  if (!bits) goto done;
  res = Py_BuildValue("(dNNi)", total, list, bits, (int)info.norm_dtype);
  list = NULL; /* stolen by "N" (also when building fails) */
done:
  Py_XDECREF(pc.error);
  Py_XDECREF(list);
  PyMem_Free(gn);
  return res;
}

/* Views.scale(coef, mode=0, num_threads=0): every tensor *= coef
 * (bx_scale over the flat list: its errors locate tensors by flat index). */
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
  if (st != BX_OK) return raise_call(v, st, NULL, -1);
  Py_RETURN_NONE;
}

/* Views.clip(max_norm, norm_type=2.0, error_if_nonfinite=False,
 *            num_threads=0, flavor=0, scale_mode=0, eps=1e-6, formula=0,
 *            comm=None, rank=0, norm_dtype=0) -> (total, coef):
 * bx_clip_grad_norm (norm_dtype as for Views.norm: the coefficient is
 * computed from the norm in that format). */
static PyObject *Views_clip(Views *v, PyObject *args, PyObject *kwds) {
  static char *kwlist[] = {"max_norm", "norm_type", "error_if_nonfinite", "num_threads",
                           "flavor", "scale_mode", "eps", "formula", "comm", "rank",
                           "norm_dtype", NULL};
  bx_clip_opts o = BX_CLIP_OPTS_DEFAULT;
  double max_norm;
  int flavor = 0, mode = 0, formula = 0, rank = 0, norm_dtype = 0;
  PyObject *comm_fn = Py_None;
  if (!PyArg_ParseTupleAndKeywords(args, kwds, "d|dpiiidiOii:clip", kwlist, &max_norm,
                                   &o.norm.norm_type, &o.norm.error_if_nonfinite,
                                   &o.norm.num_threads, &flavor, &mode, &o.eps, &formula,
                                   &comm_fn, &rank, &norm_dtype))
    return NULL;
  if (views_check(v) < 0 || views_check_writable(v) < 0 || bxpy_views_check_device(v) < 0)
    return NULL;
  o.norm.flavor = (bx_norm_flavor)flavor;
  o.norm.norm_dtype = (bx_norm_dtype)norm_dtype;
  o.scale.mode = (bx_scale_mode)mode;
  o.scale.num_threads = o.norm.num_threads;
  o.formula = (bx_coef_formula)formula;
  bxpy_pycomm pc;
  bx_comm comm;
  const bx_comm *cp = bxpy_pycomm_comm(&pc, &comm, comm_fn, rank);
  double total = 0, coef = 1;
  bx_status st;
  v->busy = 1;
  Py_BEGIN_ALLOW_THREADS
  st = bx_clip_grad_norm(v->groups, (size_t)v->ngroups, cp, max_norm, &o, &total, &coef);
  Py_END_ALLOW_THREADS
  v->busy = 0;
  if (st != BX_OK) return raise_call(v, st, &pc, cp ? rank : -1);
  Py_XDECREF(pc.error);
  return Py_BuildValue("(dd)", total, coef);
}

/* Views.check_scale_targets(): raise unless every tensor may be scaled in
 * place by one call: writable exports (not read-only, not copies), each
 * valid for writing and no two sharing memory (bx_check_writable: a
 * LayoutError naming both, located by the exception's group, tensor,
 * other_group and other_tensor). Host-side only (DLPack metadata);
 * bitexact.torch calls it before enqueueing a stream-ordered scaling. */
static PyObject *Views_check_scale_targets(Views *v, PyObject *unused) {
  (void)unused;
  if (views_check(v) < 0 || views_check_writable(v) < 0 ||
      views_check_targets(v, "check_scale_targets") < 0)
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
  if (st != BX_OK) return bxpy_raise_last(st, NULL);
  return PyFloat_FromDouble(coef);
}

/* The linked library's version text (bx_version_string), the source of
 * bitexact.__version__. */
static PyObject *mod_version(PyObject *self, PyObject *unused) {
  (void)self, (void)unused;
  return PyUnicode_FromString(bx_version_string());
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
    {"version", mod_version, METH_NOARGS, "bx_version_string(): 'major.minor.patch'"},
    {"isa", mod_isa, METH_NOARGS, "the CPU kernel table in use: portable, avx2, avx512 or avx512-pf1"},
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
  /* class defaults of the attributes every raised instance sets */
  PyObject *defaults = Py_BuildValue("{sOsisisisisi}", "status", Py_None, "rank", -1, "group",
                                     -1, "tensor", -1, "other_group", -1, "other_tensor", -1);
  if (!defaults) goto fail;
  Error = PyErr_NewExceptionWithDoc(
      "bitexact.Error",
      "Base of bitexact's errors (a RuntimeError). Attributes: status (the bx_status), and "
      "where the error is, as integers (-1: none): rank (the rank at fault: this one for a "
      "local failure, else the lowest failing rank), group and tensor (the tensor at fault: "
      "its group and index there, or group -1 and its index in a flat list), other_group and "
      "other_tensor (the second of two tensors that share memory).",
      PyExc_RuntimeError, defaults);
  Py_DECREF(defaults);
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
  if (bxpy_train_init(m) < 0) goto fail; /* the training kernels (_train*.c) */
  if (PyModule_AddIntConstant(m, "ACC_WORDS", BX_ACC_WORDS) < 0) goto fail;
  /* bx_version() of the library compiled in, and the version of the
   * headers it was compiled with (equal in a sound build) */
  if (PyModule_AddIntConstant(m, "VERSION_NUMBER", (long)bx_version()) < 0) goto fail;
  if (PyModule_AddIntConstant(m, "HEADER_VERSION_NUMBER", BX_VERSION_NUMBER) < 0) goto fail;
  return m;
fail:
  Py_DECREF(m);
  return NULL;
}
