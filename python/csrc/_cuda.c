/*
 * _cuda.c — the CUDA side of bitexact._core.
 *
 * Blocking calls (Views.norm / scale / clip) on kDLCUDA tensors go straight
 * to the library, which runs them on the legacy default stream; this file
 * only checks beforehand that they can run (a CUDA backend in this build, a
 * device, one device for the whole call) so that the error names the
 * tensor at fault.
 *
 * Stream-ordered calls go through plans (bitexact_cuda.h): Views.cuda_plan
 * returns a CudaPlan for the tensors' data addresses and options, from a
 * small LRU cache keyed by everything the plan depends on (device, every
 * tensor's address, shape, strides and dtype, the groups, the options), so
 * a training loop builds its plans once and afterwards only enqueues work.
 * Eviction drops the cache's reference; the last reference destroys the
 * plan (bx_cuda_plan_destroy waits for the work enqueued on it). Plans are
 * never created during CUDA graph capture (that would allocate): a miss
 * while the stream is capturing raises, naming the cure.
 *
 * A plan's accumulator buffers are shared by all work enqueued on it, so
 * work from two streams must be ordered: after each use outside capture an
 * event is recorded on the stream used, and a use on another stream waits
 * for it first (never during capture, where torch.cuda.graph has already
 * synchronised, and events recorded in capture do not exist outside it).
 *
 * A plan accepts tensors that share memory: its norms count them twice (as
 * on the CPU), its clip and scaling calls fail with BX_ELAYOUT. The scaling
 * of bitexact.torch spans several plans (one per dtype class), so it checks
 * the whole call first (Views.check_scale_targets, _core.c).
 *
 * The norm can be written in the gradients' dtype (norm_async_dtype:
 * bx_cuda_norm_async_dtype): every norm rounded once into it on the device
 * by the library's finish, the code the CPU path runs (p = 2 and 1 from
 * the exact sum), so the bits are the CPU's; nothing is rounded here.
 *
 * The CUDA calls here use this extension's own (static) CUDA runtime; its
 * streams, events and device pointers are the driver's, shared with every
 * other runtime in the process (torch's, CuPy's).
 */
#include "_bxpy.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if BX_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "bitexact_cuda.h"
const int bxpy_have_cuda = 1;
#else
const int bxpy_have_cuda = 0;
#endif

#define NO_BACKEND                                                                       \
  "this build of bitexact has no CUDA backend (it was built without nvcc; reinstall " \
  "with nvcc on PATH or CUDA_HOME set, and BITEXACT_CUDA=1 to insist)"

/* Raise status st with a formatted message (no location). Returns -1. */
static int fail(bx_status st, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int fail(bx_status st, const char *fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  bxpy_raise_status(st, msg, NULL);
  return -1;
}

int bxpy_views_check_device(Views *v) {
  if (v->ncuda == 0) return 0;
  Py_ssize_t g, i, g2, i2;
  bxpy_views_where(v, v->first_cuda, &g, &i);
  bxpy_where w = bxpy_at(g, i);
  if (!bxpy_have_cuda) {
    bxpy_raise_fmt(BX_EDEVICE, &w,
                   "group %zd, tensor %zd: a CUDA tensor (device type %d, cuda:%d), but %s", g, i,
                   (int)kDLCUDA, v->cuda_device, NO_BACKEND);
    return -1;
  }
  if (v->first_host >= 0) {
    bxpy_views_where(v, v->first_host, &g2, &i2);
    const DLTensor *h = &v->dl[v->first_host];
    w = bxpy_at2(g, i, g2, i2);
    bxpy_raise_fmt(BX_EDEVICE, &w,
                   "group %zd, tensor %zd is on cuda:%d and group %zd, tensor %zd is not "
                   "(device type %d): one call takes the tensors of one device (all on the "
                   "CPU, or all on one GPU)",
                   g, i, v->cuda_device, g2, i2, (int)h->device.device_type);
    return -1;
  }
  if (v->other_cuda >= 0) {
    bxpy_views_where(v, v->other_cuda, &g2, &i2);
    w = bxpy_at2(g, i, g2, i2);
    bxpy_raise_fmt(BX_EDEVICE, &w,
                   "group %zd, tensor %zd is on cuda:%d and group %zd, tensor %zd on cuda:%d: "
                   "one call takes the tensors of one GPU",
                   g, i, v->cuda_device, g2, i2, v->dl[v->other_cuda].device.device_id);
    return -1;
  }
#if BX_HAVE_CUDA
  bx_status st = bx_cuda_available();
  if (st != BX_OK) {
    bxpy_raise_fmt(BX_EDEVICE, &w, "group %zd, tensor %zd: a CUDA tensor (cuda:%d), but %s", g,
                   i, v->cuda_device, bx_last_error()[0] ? bx_last_error() : bx_status_str(st));
    return -1;
  }
#endif
  return 0;
}

/* ------------------------------------------------------------------------
 * Plans and their cache (CUDA builds)
 * ---------------------------------------------------------------------- */
#if BX_HAVE_CUDA

typedef struct CudaPlan {
  PyObject_HEAD
  bx_cuda_plan *plan;
  int device;
  Py_ssize_t ngroups, ntensors;
  cudaEvent_t done;      /* recorded on the last stream used (outside capture) */
  cudaStream_t done_on;  /* that stream */
  int done_valid;
} CudaPlan;

static PyTypeObject CudaPlanType;

static int is_finalizing(void) {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsFinalizing();
#else
  return _Py_IsFinalizing();
#endif
}

static void CudaPlan_dealloc(CudaPlan *p) {
  /* At interpreter exit the CUDA runtime may be gone already: leak. */
  if (!is_finalizing()) {
    bx_cuda_plan *plan = p->plan;
    cudaEvent_t ev = p->done;
    Py_BEGIN_ALLOW_THREADS
    bx_cuda_plan_destroy(plan); /* waits for the work enqueued on it */
    if (ev) cudaEventDestroy(ev);
    Py_END_ALLOW_THREADS
  }
  Py_TYPE(p)->tp_free((PyObject *)p);
}

/* 1 if s is capturing (or cannot be asked: e.g. the legacy stream while
 * another stream of the device captures), else 0. */
static int capturing(cudaStream_t s) {
  enum cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(s, &cs) != cudaSuccess) {
    cudaGetLastError();
    return 1;
  }
  return cs != cudaStreamCaptureStatusNone;
}

/* Before enqueueing on s: wait for the plan's work on another stream. */
static int join_before(CudaPlan *p, cudaStream_t s, int *cap) {
  *cap = capturing(s);
  if (*cap || !p->done_valid || p->done_on == s) return 0;
  if (cudaStreamWaitEvent(s, p->done, 0) != cudaSuccess) {
    const char *e = cudaGetErrorString(cudaGetLastError());
    return fail(BX_EDEVICE, "cudaStreamWaitEvent (ordering a CUDA plan's streams): %s", e);
  }
  return 0;
}

static void record_after(CudaPlan *p, cudaStream_t s, int cap) {
  if (cap) { /* the graph's work is ordered by whoever replays it */
    p->done_valid = 0;
    return;
  }
  if (cudaEventRecord(p->done, s) == cudaSuccess) {
    p->done_on = s;
    p->done_valid = 1;
  } else {
    cudaGetLastError();
    p->done_valid = 0;
  }
}

static PyObject *enqueue_failed(bx_status st) { return bxpy_raise_last(st, NULL); }

/* CudaPlan.norm_async(stream, d_total, d_group_norms=0, d_status=0) */
static PyObject *CudaPlan_norm_async(CudaPlan *p, PyObject *args, PyObject *kwds) {
  static char *kwlist[] = {"stream", "d_total", "d_group_norms", "d_status", NULL};
  unsigned long long stream, total, groups = 0, status = 0;
  if (!PyArg_ParseTupleAndKeywords(args, kwds, "KK|KK:norm_async", kwlist, &stream, &total,
                                   &groups, &status))
    return NULL;
  cudaStream_t s = (cudaStream_t)(uintptr_t)stream;
  int cap;
  if (join_before(p, s, &cap) < 0) return NULL;
  bx_status st = bx_cuda_norm_async(p->plan, s, (double *)(uintptr_t)total,
                                    (double *)(uintptr_t)groups, (int32_t *)(uintptr_t)status);
  if (st != BX_OK) return enqueue_failed(st);
  record_after(p, s, cap);
  Py_RETURN_NONE;
}

/* CudaPlan.norm_async_dtype(stream, norm_dtype, d_total, d_status=0):
 * bx_cuda_norm_async_dtype, the total norm written at d_total in the
 * format norm_dtype names (Views.norm's numbering, bx_norm_dtype: 0
 * float64, 2 float32, 3 bfloat16, 4 float16), rounded once into it on the
 * device by the library's finish (the CPU's code: the same bits). */
static PyObject *CudaPlan_norm_async_dtype(CudaPlan *p, PyObject *args, PyObject *kwds) {
  static char *kwlist[] = {"stream", "norm_dtype", "d_total", "d_status", NULL};
  static const DLDataType dts[5] = {{kDLFloat, 64, 1}, {0, 0, 0}, {kDLFloat, 32, 1},
                                    {kDLBfloat, 16, 1}, {kDLFloat, 16, 1}};
  unsigned long long stream, total, status = 0;
  int nd;
  if (!PyArg_ParseTupleAndKeywords(args, kwds, "KiK|K:norm_async_dtype", kwlist, &stream, &nd,
                                   &total, &status))
    return NULL;
  if (nd < 0 || nd > 4 || nd == BX_NORM_GRADS)
    return bxpy_raise_status(BX_EINVAL,
                             "norm_async_dtype: norm_dtype must be 0 (float64), 2 (float32), "
                             "3 (bfloat16) or 4 (float16)",
                             NULL);
  cudaStream_t s = (cudaStream_t)(uintptr_t)stream;
  int cap;
  if (join_before(p, s, &cap) < 0) return NULL;
  bx_status st = bx_cuda_norm_async_dtype(p->plan, s, dts[nd], (void *)(uintptr_t)total,
                                          (int32_t *)(uintptr_t)status);
  if (st != BX_OK) return enqueue_failed(st);
  record_after(p, s, cap);
  Py_RETURN_NONE;
}

/* CudaPlan.clip_async(max_norm, stream, d_total, d_coef=0, d_status=0) */
static PyObject *CudaPlan_clip_async(CudaPlan *p, PyObject *args, PyObject *kwds) {
  static char *kwlist[] = {"max_norm", "stream", "d_total", "d_coef", "d_status", NULL};
  double max_norm;
  unsigned long long stream, total, coef = 0, status = 0;
  if (!PyArg_ParseTupleAndKeywords(args, kwds, "dKK|KK:clip_async", kwlist, &max_norm, &stream,
                                   &total, &coef, &status))
    return NULL;
  cudaStream_t s = (cudaStream_t)(uintptr_t)stream;
  int cap;
  if (join_before(p, s, &cap) < 0) return NULL;
  bx_status st = bx_cuda_clip_async(p->plan, s, max_norm, (double *)(uintptr_t)total,
                                    (double *)(uintptr_t)coef, (int32_t *)(uintptr_t)status);
  if (st != BX_OK) return enqueue_failed(st);
  record_after(p, s, cap);
  Py_RETURN_NONE;
}

/* CudaPlan.scale_async(d_coef, d_status=0, stream=0) */
static PyObject *CudaPlan_scale_async(CudaPlan *p, PyObject *args, PyObject *kwds) {
  static char *kwlist[] = {"d_coef", "d_status", "stream", NULL};
  unsigned long long coef, status = 0, stream = 0;
  if (!PyArg_ParseTupleAndKeywords(args, kwds, "K|KK:scale_async", kwlist, &coef, &status,
                                   &stream))
    return NULL;
  cudaStream_t s = (cudaStream_t)(uintptr_t)stream;
  int cap;
  if (join_before(p, s, &cap) < 0) return NULL;
  bx_status st = bx_cuda_scale_async(p->plan, s, (const double *)(uintptr_t)coef,
                                     (const int32_t *)(uintptr_t)status);
  if (st != BX_OK) return enqueue_failed(st);
  record_after(p, s, cap);
  Py_RETURN_NONE;
}

static PyObject *CudaPlan_get_device(CudaPlan *p, void *c) {
  (void)c;
  return PyLong_FromLong(p->device);
}
static PyObject *CudaPlan_get_ngroups(CudaPlan *p, void *c) {
  (void)c;
  return PyLong_FromSsize_t(p->ngroups);
}
static PyObject *CudaPlan_get_ntensors(CudaPlan *p, void *c) {
  (void)c;
  return PyLong_FromSsize_t(p->ntensors);
}

static PyMethodDef CudaPlan_methods[] = {
    {"norm_async", (PyCFunction)(void (*)(void))CudaPlan_norm_async,
     METH_VARARGS | METH_KEYWORDS,
     "norm_async(stream, d_total, d_group_norms=0, d_status=0): bx_cuda_norm_async"},
    {"norm_async_dtype", (PyCFunction)(void (*)(void))CudaPlan_norm_async_dtype,
     METH_VARARGS | METH_KEYWORDS,
     "norm_async_dtype(stream, norm_dtype, d_total, d_status=0): bx_cuda_norm_async_dtype "
     "(norm_dtype: 0 float64, 2 float32, 3 bfloat16, 4 float16)"},
    {"clip_async", (PyCFunction)(void (*)(void))CudaPlan_clip_async,
     METH_VARARGS | METH_KEYWORDS,
     "clip_async(max_norm, stream, d_total, d_coef=0, d_status=0): bx_cuda_clip_async"},
    {"scale_async", (PyCFunction)(void (*)(void))CudaPlan_scale_async,
     METH_VARARGS | METH_KEYWORDS,
     "scale_async(d_coef, d_status=0, stream=0): bx_cuda_scale_async"},
    {NULL, NULL, 0, NULL}};

static PyGetSetDef CudaPlan_getset[] = {
    {"device", (getter)CudaPlan_get_device, NULL, "the CUDA device ordinal", NULL},
    {"ngroups", (getter)CudaPlan_get_ngroups, NULL, "number of groups (group norms)", NULL},
    {"ntensors", (getter)CudaPlan_get_ntensors, NULL, "number of tensors", NULL},
    {NULL, NULL, NULL, NULL, NULL}};

static PyTypeObject CudaPlanType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "bitexact._core.CudaPlan",
    .tp_basicsize = sizeof(CudaPlan),
    .tp_dealloc = (destructor)CudaPlan_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A bx_cuda_plan (made by Views.cuda_plan, cached); pointers and streams are ints",
    .tp_methods = CudaPlan_methods,
    .tp_getset = CudaPlan_getset,
};

/* The LRU cache: entry 0 is the most recently used. */
#define CACHE_MAX 256
static struct {
  PyObject *key; /* bytes */
  CudaPlan *plan;
} cache[CACHE_MAX];
static int cache_len, cache_size = 8;

static void cache_trim(int size) {
  while (cache_len > size) {
    cache_len--;
    PyObject *key = cache[cache_len].key;
    CudaPlan *plan = cache[cache_len].plan;
    cache[cache_len].key = NULL;
    cache[cache_len].plan = NULL;
    Py_DECREF(key);
    Py_DECREF(plan); /* destroyed here unless the caller still holds it */
  }
}

static CudaPlan *cache_find(PyObject *key) {
  for (int k = 0; k < cache_len; k++) {
    if (PyBytes_GET_SIZE(cache[k].key) != PyBytes_GET_SIZE(key) ||
        memcmp(PyBytes_AS_STRING(cache[k].key), PyBytes_AS_STRING(key),
               (size_t)PyBytes_GET_SIZE(key)) != 0)
      continue;
    PyObject *ck = cache[k].key;
    CudaPlan *p = cache[k].plan;
    memmove(&cache[1], &cache[0], (size_t)k * sizeof cache[0]);
    cache[0].key = ck;
    cache[0].plan = p;
    Py_INCREF(p);
    return p;
  }
  return NULL;
}

static void cache_insert(PyObject *key, CudaPlan *p) {
  if (cache_size == 0) return;
  cache_trim(cache_size - 1);
  memmove(&cache[1], &cache[0], (size_t)cache_len * sizeof cache[0]);
  Py_INCREF(key);
  Py_INCREF(p);
  cache[0].key = key;
  cache[0].plan = p;
  cache_len++;
}

/* The key of a plan: every input of bx_cuda_plan_create, as int64 words. */
static PyObject *plan_key(Views *v, Py_ssize_t ng, unsigned mask, const bx_clip_opts *o,
                          Py_ssize_t *ntensors) {
  Py_ssize_t words = 12, count = 0;
  for (Py_ssize_t g = 0; g < ng; g++) {
    words++;
    for (size_t i = 0; i < v->groups[g].count; i++) {
      const DLTensor *t = &v->groups[g].tensors[i];
      if (mask && !(bxpy_dtype_bit(t->dtype) & mask)) continue;
      words += 5 + 2 * (Py_ssize_t)(t->ndim > 0 ? t->ndim : 0);
      count++;
    }
  }
  *ntensors = count;
  PyObject *key = PyBytes_FromStringAndSize(NULL, words * (Py_ssize_t)sizeof(int64_t));
  if (!key) return NULL;
  int64_t *w = (int64_t *)PyBytes_AS_STRING(key);
  Py_ssize_t k = 0;
  double dbl[2] = {o->norm.norm_type, o->eps};
  w[k++] = 0x6278706c616e0001LL; /* "bxplan", key format 1 */
  w[k++] = v->cuda_device;
  w[k++] = ng;
  w[k++] = mask;
  memcpy(&w[k++], &dbl[0], 8);
  memcpy(&w[k++], &dbl[1], 8);
  w[k++] = o->norm.error_if_nonfinite;
  w[k++] = o->norm.flavor;
  w[k++] = o->norm.num_threads;
  w[k++] = o->scale.mode;
  w[k++] = o->formula;
  w[k++] = count;
  for (Py_ssize_t g = 0; g < ng; g++) {
    w[k++] = -1 - g; /* group separator */
    for (size_t i = 0; i < v->groups[g].count; i++) {
      const DLTensor *t = &v->groups[g].tensors[i];
      if (mask && !(bxpy_dtype_bit(t->dtype) & mask)) continue;
      int nd = t->ndim > 0 ? t->ndim : 0;
      w[k++] = (int64_t)(uintptr_t)t->data;
      w[k++] = (int64_t)t->byte_offset;
      w[k++] = ((int64_t)t->device.device_type << 32) | (uint32_t)t->device.device_id;
      w[k++] = ((int64_t)t->dtype.code << 32) | ((int64_t)t->dtype.bits << 16) | t->dtype.lanes;
      w[k++] = t->ndim;
      for (int d = 0; d < nd; d++) w[k++] = t->shape ? t->shape[d] : -1;
      for (int d = 0; d < nd; d++) w[k++] = t->strides ? t->strides[d] : INT64_MIN;
    }
  }
  return key;
}

/* Views.cuda_plan(ngroups=-1, dtype_mask=0, stream=0, norm_type=2.0,
 *                 error_if_nonfinite=False, flavor=0, scale_mode=0,
 *                 eps=1e-6, formula=0) -> CudaPlan
 * The plan of the first ngroups groups (-1: all); with dtype_mask != 0
 * only the tensors of those dtypes (Views.dtypes bits), as one group (for
 * scaling each dtype by its own coefficient). stream: where the plan will
 * be used; a cache miss while it is capturing raises. */
PyObject *bxpy_views_cuda_plan(Views *v, PyObject *args, PyObject *kwds) {
  static char *kwlist[] = {"ngroups", "dtype_mask", "stream", "norm_type",
                           "error_if_nonfinite", "flavor", "scale_mode", "eps", "formula", NULL};
  Py_ssize_t ng = -1;
  unsigned int mask = 0;
  unsigned long long stream = 0;
  int flavor = 0, mode = 0, formula = 0;
  bx_clip_opts o = BX_CLIP_OPTS_DEFAULT;
  if (!PyArg_ParseTupleAndKeywords(args, kwds, "|nIKdpiidi:cuda_plan", kwlist, &ng, &mask,
                                   &stream, &o.norm.norm_type, &o.norm.error_if_nonfinite,
                                   &flavor, &mode, &o.eps, &formula))
    return NULL;
  o.norm.flavor = (bx_norm_flavor)flavor;
  o.scale.mode = (bx_scale_mode)mode;
  o.formula = (bx_coef_formula)formula;
  if (v->released || v->busy) {
    fail(BX_EINVAL, "%s", v->released ? "these views were released"
                                : "these views are in use by another thread");
    return NULL;
  }
  if (ng < 0 || ng > v->ngroups) ng = v->ngroups;
  if (bxpy_views_check_device(v) < 0) return NULL;
  if (v->ncuda == 0) {
    fail(BX_EDEVICE, "CUDA plans take CUDA tensors; these are not");
    return NULL;
  }
  Py_ssize_t count = 0;
  PyObject *key = plan_key(v, ng, mask, &o, &count);
  if (!key) return NULL;
  CudaPlan *p = cache_find(key);
  if (p) {
    Py_DECREF(key);
    return (PyObject *)p;
  }
  bx_group *sel = NULL, one;
  DLTensor *picked = NULL;
  if (count == 0) {
    fail(BX_EINVAL, "no tensor selected for a CUDA plan");
    goto done;
  }
  if (capturing((cudaStream_t)(uintptr_t)stream)) {
    fail(BX_EINVAL,
         "no CUDA plan is cached for these tensors and options, and none can be made while "
         "the stream is capturing a CUDA graph (making one allocates device memory): make "
         "the same call once before capturing (the warm-up torch.cuda.graph asks for)");
    goto done;
  }
  Py_ssize_t nsel = ng;
  if (mask) {
    picked = PyMem_Malloc((size_t)count * sizeof *picked);
    if (!picked) {
      PyErr_NoMemory();
      goto done;
    }
    Py_ssize_t k = 0;
    for (Py_ssize_t g = 0; g < ng; g++)
      for (size_t i = 0; i < v->groups[g].count; i++)
        if (bxpy_dtype_bit(v->groups[g].tensors[i].dtype) & mask)
          picked[k++] = v->groups[g].tensors[i];
    one.tensors = picked;
    one.count = (size_t)k;
    sel = &one;
    nsel = 1;
  } else {
    sel = v->groups;
  }
  p = PyObject_New(CudaPlan, &CudaPlanType);
  if (!p) goto done;
  p->plan = NULL;
  p->done = NULL;
  p->done_on = NULL;
  p->done_valid = 0;
  p->device = v->cuda_device;
  p->ngroups = nsel;
  p->ntensors = count;
  bx_status st;
  cudaError_t ce = cudaSuccess;
  v->busy = 1;
  Py_BEGIN_ALLOW_THREADS
  st = bx_cuda_plan_create(sel, (size_t)nsel, NULL, &o, &p->plan);
  if (st == BX_OK) {
    int prev = 0;
    cudaGetDevice(&prev);
    if (prev != p->device) cudaSetDevice(p->device);
    ce = cudaEventCreateWithFlags(&p->done, cudaEventDisableTiming);
    if (prev != p->device) cudaSetDevice(prev);
  }
  Py_END_ALLOW_THREADS
  v->busy = 0;
  if (st != BX_OK) {
    if (mask) { /* positions in the plan's one group of picked tensors are not v's: dropped
                   (the scaling checked every tensor first, Views.check_scale_targets) */
      bxpy_where w = {bx_last_error_location()->rank, -1, -1, -1, -1};
      bxpy_raise_at(st, bx_last_error(), NULL, &w);
    } else {
      bxpy_raise_last(st, NULL);
    }
    Py_CLEAR(p); /* plan is NULL: destroy(NULL) is allowed */
    goto done;
  }
  if (ce != cudaSuccess) {
    p->done = NULL;
    fail(BX_EDEVICE, "cudaEventCreate: %s", cudaGetErrorString(ce));
    cudaGetLastError();
    Py_CLEAR(p);
    goto done;
  }
  cache_insert(key, p);
done:
  PyMem_Free(picked);
  Py_DECREF(key);
  return (PyObject *)p;
}

static PyObject *mod_cuda_plan_cache(PyObject *self, PyObject *args) {
  (void)self;
  int size = -1;
  if (!PyArg_ParseTuple(args, "|i:cuda_plan_cache", &size)) return NULL;
  int old = cache_size;
  if (size >= 0) {
    cache_size = size > CACHE_MAX ? CACHE_MAX : size;
    cache_trim(cache_size);
  }
  return Py_BuildValue("(ii)", cache_len, old);
}

static PyObject *mod_cuda_plan_cache_clear(PyObject *self, PyObject *unused) {
  (void)self, (void)unused;
  int n = cache_len;
  cache_trim(0);
  return PyLong_FromLong(n);
}

#else /* !BX_HAVE_CUDA */

PyObject *bxpy_views_cuda_plan(Views *v, PyObject *args, PyObject *kwds) {
  (void)args, (void)kwds;
  if (bxpy_views_check_device(v) == 0) fail(BX_EDEVICE, "CUDA plans: %s", NO_BACKEND);
  return NULL;
}

static int cache_size = 8; /* kept for the API; nothing is ever cached */

static PyObject *mod_cuda_plan_cache(PyObject *self, PyObject *args) {
  (void)self;
  int size = -1;
  if (!PyArg_ParseTuple(args, "|i:cuda_plan_cache", &size)) return NULL;
  int old = cache_size;
  if (size >= 0) cache_size = size;
  return Py_BuildValue("(ii)", 0, old);
}

static PyObject *mod_cuda_plan_cache_clear(PyObject *self, PyObject *unused) {
  (void)self, (void)unused;
  return PyLong_FromLong(0);
}

#endif /* BX_HAVE_CUDA */

/* cuda_available() -> (bool, reason) */
static PyObject *mod_cuda_available(PyObject *self, PyObject *unused) {
  (void)self, (void)unused;
#if BX_HAVE_CUDA
  bx_status st;
  Py_BEGIN_ALLOW_THREADS
  st = bx_cuda_available();
  Py_END_ALLOW_THREADS
  if (st == BX_OK) return Py_BuildValue("(Os)", Py_True, "");
  return Py_BuildValue("(Os)", Py_False,
                       bx_last_error()[0] ? bx_last_error() : bx_status_str(st));
#else
  return Py_BuildValue("(Os)", Py_False, NO_BACKEND);
#endif
}

PyMethodDef bxpy_cuda_methods[] = {
    {"cuda_available", mod_cuda_available, METH_NOARGS,
     "cuda_available() -> (usable, reason): bx_cuda_available()"},
    {"cuda_plan_cache", mod_cuda_plan_cache, METH_VARARGS,
     "cuda_plan_cache(size=-1) -> (plans cached, previous size); size >= 0 sets the size"},
    {"cuda_plan_cache_clear", mod_cuda_plan_cache_clear, METH_NOARGS,
     "drop every cached CUDA plan; returns how many there were"},
    {NULL, NULL, 0, NULL}};

int bxpy_cuda_init(PyObject *module) {
#if BX_HAVE_CUDA
  if (PyType_Ready(&CudaPlanType) < 0) return -1;
  Py_INCREF(&CudaPlanType);
  if (PyModule_AddObject(module, "CudaPlan", (PyObject *)&CudaPlanType) < 0) return -1;
#endif
  return PyModule_AddIntConstant(module, "HAVE_CUDA", bxpy_have_cuda);
}
