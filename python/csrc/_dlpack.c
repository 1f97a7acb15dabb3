/*
 * _dlpack.c — consuming DLPack capsules for bitexact._core.
 *
 * An object is exported through a fast exporter registered for its exact
 * type (torch.Tensor: torch._C._to_dlpack), else through
 * obj.__dlpack__(max_version=(1, 0)), falling back to obj.__dlpack__() for
 * producers that predate DLPack 1.0 (remembered per type); a capsule passed
 * directly is used as is. The capsule is then consumed as the DLPack Python
 * specification asks: renamed "used_dltensor[_versioned]", its deleter
 * called by the consumer (bxpy_release_owner) when done.
 */
#include "_bxpy.h"

#include <string.h>

#define MAX_FAST 8
static struct {
  PyTypeObject *type;
  PyObject *fn;
} fast_exporters[MAX_FAST]; /* exact type -> fn(obj) -> capsule */
static int nfast;
static PyObject *legacy_types; /* set of types whose __dlpack__ takes no max_version */
static PyObject *str_dlpack, *kw_versioned;

/* The capsule for obj (new reference) or NULL with an exception set. */
static PyObject *capsule_of(PyObject *obj, Py_ssize_t g, Py_ssize_t i) {
  if (PyCapsule_CheckExact(obj)) {
    Py_INCREF(obj);
    return obj;
  }
  for (int k = 0; k < nfast; k++)
    if (Py_TYPE(obj) == fast_exporters[k].type) {
      PyObject *cap = PyObject_CallOneArg(fast_exporters[k].fn, obj);
      if (cap) return cap;
      goto failed;
    }
  PyObject *meth = PyObject_GetAttr(obj, str_dlpack);
  if (!meth) {
    PyErr_Clear();
    bxpy_where w = bxpy_at(g, i);
    return bxpy_raise_fmt(BX_EDTYPE, &w,
                          "group %zd, tensor %zd: an object of type %.200s is not a tensor "
                          "(it has no __dlpack__ method)",
                          g, i, Py_TYPE(obj)->tp_name);
  }
  PyObject *cap = NULL;
  int legacy = PySet_Contains(legacy_types, (PyObject *)Py_TYPE(obj));
  if (legacy == 0) {
    PyObject *args = PyTuple_New(0);
    cap = args ? PyObject_Call(meth, args, kw_versioned) : NULL;
    Py_XDECREF(args);
    if (!cap && PyErr_ExceptionMatches(PyExc_TypeError)) { /* pre-1.0 producer */
      PyErr_Clear();
      PySet_Add(legacy_types, (PyObject *)Py_TYPE(obj));
      legacy = 1;
    }
  }
  if (legacy == 1) cap = PyObject_CallNoArgs(meth);
  Py_DECREF(meth);
  if (cap) return cap;
failed:;
  PyObject *cause = bxpy_take_exception();
  PyObject *text = cause ? PyObject_Str(cause) : NULL;
  char msg[512];
  PyOS_snprintf(msg, sizeof msg, "group %zd, tensor %zd: exporting it through DLPack failed: %s",
                g, i, text ? PyUnicode_AsUTF8(text) : "?");
  PyErr_Clear();
  Py_XDECREF(text);
  bxpy_where w = bxpy_at(g, i);
  return bxpy_raise_at(BX_EINVAL, msg, cause, &w);
}

/* Export obj into *dl and *own (consuming its capsule). */
int bxpy_export_tensor(PyObject *obj, DLTensor *dl, bxpy_owner *own, Py_ssize_t g,
                       Py_ssize_t i) {
  PyObject *cap = capsule_of(obj, g, i);
  if (!cap) return -1;
  int rc = -1;
  bxpy_where w = bxpy_at(g, i);
  if (PyCapsule_IsValid(cap, "dltensor_versioned")) {
    bxpy_managed_v1 *m = PyCapsule_GetPointer(cap, "dltensor_versioned");
    if (m->version.major != 1) { /* unknown ABI: leave it to its producer */
      bxpy_raise_fmt(BX_EINVAL, &w,
                     "group %zd, tensor %zd: DLPack version %u.%u is not supported (1.x is)", g,
                     i, m->version.major, m->version.minor);
      goto done;
    }
    if (PyCapsule_SetName(cap, "used_dltensor_versioned") < 0) goto done;
    own->managed = m;
    own->v1 = 1;
    own->flags = (uint8_t)(m->flags & (BXPY_FLAG_READ_ONLY | BXPY_FLAG_IS_COPIED));
    *dl = m->dl_tensor;
    rc = 0;
  } else if (PyCapsule_IsValid(cap, "dltensor")) {
    DLManagedTensor *m = PyCapsule_GetPointer(cap, "dltensor");
    if (PyCapsule_SetName(cap, "used_dltensor") < 0) goto done;
    own->managed = m;
    own->v1 = 0;
    own->flags = 0;
    *dl = m->dl_tensor;
    rc = 0;
  } else {
    bxpy_raise_fmt(BX_EINVAL, &w,
                   "group %zd, tensor %zd: __dlpack__ returned %.100s, not an unused DLPack "
                   "capsule (a capsule can be consumed only once)",
                   g, i, Py_TYPE(cap)->tp_name);
  }
done:
  Py_DECREF(cap);
  return rc;
}

void bxpy_release_owner(bxpy_owner *own) {
  if (!own->managed) return;
  /* A deleter may run Python code (a ctypes callback): it must not see, or
   * clear, the exception pending when views die after a failed call. */
  PyObject *t, *v, *tb;
  PyErr_Fetch(&t, &v, &tb);
  if (own->v1) {
    bxpy_managed_v1 *m = own->managed;
    if (m->deleter) m->deleter(m);
  } else {
    DLManagedTensor *m = own->managed;
    if (m->deleter) m->deleter(m);
  }
  own->managed = NULL;
  if (t) PyErr_Restore(t, v, tb);
}

PyObject *bxpy_register_exporter(PyObject *self, PyObject *args) {
  (void)self;
  PyObject *type, *fn;
  if (!PyArg_ParseTuple(args, "O!O:register_exporter", &PyType_Type, &type, &fn)) return NULL;
  for (int k = 0; k < nfast; k++)
    if (fast_exporters[k].type == (PyTypeObject *)type) {
      Py_INCREF(fn);
      Py_SETREF(fast_exporters[k].fn, fn);
      Py_RETURN_NONE;
    }
  if (nfast == MAX_FAST) return bxpy_raise_status(BX_EINVAL, "too many exporters", NULL);
  Py_INCREF(type);
  Py_INCREF(fn);
  fast_exporters[nfast].type = (PyTypeObject *)type;
  fast_exporters[nfast].fn = fn;
  nfast++;
  Py_RETURN_NONE;
}

int bxpy_dlpack_init(void) {
  legacy_types = PySet_New(NULL);
  str_dlpack = PyUnicode_InternFromString("__dlpack__");
  kw_versioned = Py_BuildValue("{s(ii)}", "max_version", 1, 0);
  return legacy_types && str_dlpack && kw_versioned ? 0 : -1;
}
