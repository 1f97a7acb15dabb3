/*
 * _bxpy.h — what the C files of bitexact._core share: the DLPack 1.0
 * managed tensor (Debian's dlpack 0.6 header predates it), the record of
 * one consumed capsule, the Views object, and the error helpers.
 *
 *   _core.c    module, exceptions, Views (blocking calls: bx_total_norm, ...)
 *   _dlpack.c  consuming DLPack capsules
 *   _cuda.c    the CUDA side: device checks, cached stream-ordered plans
 */
#ifndef BXPY_H
#define BXPY_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>

#include "bitexact.h"
#include "bitexact_train.h"

/* DLPack >= 1.0 (Debian's libdlpack-dev 0.6 predates it): the versioned
 * managed tensor. DLTensor itself is unchanged between 0.6 and 1.x. */
typedef struct bxpy_dlversion {
  uint32_t major, minor;
} bxpy_dlversion;

typedef struct bxpy_managed_v1 {
  bxpy_dlversion version;
  void *manager_ctx;
  void (*deleter)(struct bxpy_managed_v1 *self);
  uint64_t flags;
  DLTensor dl_tensor;
} bxpy_managed_v1;

#define BXPY_FLAG_READ_ONLY (1ull << 0)
#define BXPY_FLAG_IS_COPIED (1ull << 1)

/* One consumed capsule: whose deleter Views.release() must call. */
typedef struct bxpy_owner {
  void *managed; /* DLManagedTensor* or bxpy_managed_v1*, NULL when released */
  uint8_t v1;    /* versioned */
  uint8_t flags; /* BXPY_FLAG_* */
} bxpy_owner;

/* Views: the exported tensors of one call, grouped (_core.c). */
typedef struct Views {
  PyObject_HEAD
  Py_ssize_t n, ngroups;
  DLTensor *dl;      /* n views, group after group */
  bxpy_owner *own;   /* n */
  bx_group *groups;  /* ngroups, pointing into dl */
  unsigned dtypes;   /* bit mask: 1 f16, 2 bf16, 4 f32, 8 f64, 16 other */
  int busy;          /* a call is running with the GIL released */
  int released;
  /* devices: kDLCUDA tensors are the GPU's; every other type is left to
   * the library (host-readable ones are read, the rest refused) */
  Py_ssize_t ncuda;   /* kDLCUDA tensors */
  Py_ssize_t first_cuda, first_host; /* flat indices, -1 if none */
  int cuda_device;    /* device_id of the first kDLCUDA tensor */
  Py_ssize_t other_cuda; /* flat index of a kDLCUDA tensor on another device, or -1 */
} Views;

/* Views.dtypes' bit of a dtype: 1 f16, 2 bf16, 4 f32, 8 f64, 16 other. */
static inline unsigned bxpy_dtype_bit(DLDataType t) {
  if (t.lanes != 1) return 16;
  if (t.code == kDLFloat && t.bits == 16) return 1;
  if (t.code == kDLBfloat && t.bits == 16) return 2;
  if (t.code == kDLFloat && t.bits == 32) return 4;
  if (t.code == kDLFloat && t.bits == 64) return 8;
  return 16;
}

/* flat index k -> (group, index in group) */
void bxpy_views_where(const Views *v, Py_ssize_t k, Py_ssize_t *g, Py_ssize_t *i);

/* The exception class of each bx_status (_core.c). */
extern PyObject *bxpy_status_exc[BX_EINTERNAL + 1];

/* Where an error is, as numbers: the attributes rank, group, tensor,
 * other_group and other_tensor of the exception raised (-1: none), so that
 * bitexact's Python code names the caller's parameters without reading the
 * text. rank: the rank at fault (-1 unknown or no communicator); group and
 * tensor: the tensor at fault (group -1 with a tensor: an index into the
 * flat list of a bx_scale call); other_*: for two tensors that share
 * memory, the second one. From the library: bx_last_error_location(). */
typedef struct bxpy_where {
  long long rank, group, tensor, other_group, other_tensor;
} bxpy_where;
#define BXPY_NOWHERE {-1, -1, -1, -1, -1}

/* The where of tensor (g, i), and of two tensors (g, i) and (g2, i2). */
static inline bxpy_where bxpy_at(Py_ssize_t g, Py_ssize_t i) {
  bxpy_where w = {-1, g, i, -1, -1};
  return w;
}
static inline bxpy_where bxpy_at2(Py_ssize_t g, Py_ssize_t i, Py_ssize_t g2, Py_ssize_t i2) {
  bxpy_where w = {-1, g, i, g2, i2};
  return w;
}

/* Raise the exception for st with text msg (bx_status_str(st) when empty)
 * and location w (NULL: none); cause (stolen, may be NULL) becomes its
 * __cause__. Returns NULL. */
PyObject *bxpy_raise_at(bx_status st, const char *msg, PyObject *cause, const bxpy_where *w);
/* The same without a location. */
PyObject *bxpy_raise_status(bx_status st, const char *msg, PyObject *cause);
/* The same with a formatted text (printf formats, no cause). */
PyObject *bxpy_raise_fmt(bx_status st, const bxpy_where *w, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* The library's last error (bx_last_error() and its location). */
PyObject *bxpy_raise_last(bx_status st, PyObject *cause);

/* The pending Python exception as a normalised value (new reference), or
 * NULL; clears the error indicator. */
PyObject *bxpy_take_exception(void);

/* _dlpack.c: export obj (group g, index i, for messages) into *dl and *own,
 * consuming its DLPack capsule; -1 with an exception set on failure. */
int bxpy_export_tensor(PyObject *obj, DLTensor *dl, bxpy_owner *own, Py_ssize_t g,
                       Py_ssize_t i);
/* Call the deleter of a consumed capsule (once). */
void bxpy_release_owner(bxpy_owner *own);
/* register_exporter(type, fn) of the module. */
PyObject *bxpy_register_exporter(PyObject *self, PyObject *args);
/* Module init of _dlpack.c; -1 on failure. */
int bxpy_dlpack_init(void);

/* ---- _cuda.c ---------------------------------------------------------- */
/* 1 when this build has the CUDA backend (BX_HAVE_CUDA). */
extern const int bxpy_have_cuda;
/* Before a blocking call on v: 0 when v holds no kDLCUDA tensor, or when
 * all of them are on one device of a usable CUDA backend and no tensor is
 * elsewhere; else -1 with DeviceError set (no backend in this build, no
 * device, CPU and CUDA tensors mixed, several devices). */
int bxpy_views_check_device(Views *v);
/* Views.cuda_plan(...) (a method of Views, see _cuda.c). */
PyObject *bxpy_views_cuda_plan(Views *v, PyObject *args, PyObject *kwds);
/* Module functions of _cuda.c and its init (the CudaPlan type); -1 on failure. */
extern PyMethodDef bxpy_cuda_methods[];
int bxpy_cuda_init(PyObject *module);

/* ---- _train*.c: the training kernels of bitexact_train.h ---------------
 * One Python function per kernel (the arguments in the C order, opts
 * fields as keyword-only arguments with the C defaults). A call's tensors
 * are exported into a bxk_call (at most BXK_MAX), the kernel runs with the
 * GIL released, then the capsules are released. Errors name the argument:
 * "fn: argument 'name': <text>" (attributes tensor = the slot, argument =
 * the name). */
#define BXK_MAX 16
typedef struct bxk_call {
  const char *fn;           /* the Python name, for messages */
  int n;                    /* tensor slots */
  const char *const *names; /* their names (the C parameter names) */
  const signed char *loc;   /* the library's tensor index of each slot; NULL: the slot */
  DLTensor dl[BXK_MAX];
  bxpy_owner own[BXK_MAX];
  DLTensor *p[BXK_MAX]; /* &dl[i], or NULL for None */
} bxk_call;
/* Export objs[0..k->n) (bit i of out: an output, refused when read-only or
 * a copy; bit i of opt: None allowed, giving NULL); -1 with the error
 * raised (and everything released) on failure. */
int bxk_export(bxk_call *k, PyObject *const *objs, unsigned out, unsigned opt);
/* Call every deleter (idempotent). */
void bxk_release(bxk_call *k);
/* Raise st with "fn: argument 'name': text" (slot < 0: "fn: text"); cause
 * stolen (may be NULL). Returns NULL. */
PyObject *bxk_raise(const bxk_call *k, bx_status st, int slot, PyObject *cause,
                    const char *fmt, ...) __attribute__((format(printf, 5, 6)));
/* After the C call: release; None when st is BX_OK, else the library's
 * error raised, naming the slot it locates. */
PyObject *bxk_done(bxk_call *k, bx_status st);
/* A Python communicator fn(buf, op) (bitexact.Comm's allreduce) as a
 * bx_comm's allreduce_i64, ctx a bxpy_pycomm (_core.c: Views.norm/clip,
 * _train_tokred.c: TokRed). It takes the GIL; a Python exception is kept
 * in error (a new reference, for __cause__) and fails the collective. */
typedef struct bxpy_pycomm {
  PyObject *fn;
  PyObject *error;
} bxpy_pycomm;
int bxpy_pycomm_allreduce(int64_t *buf, size_t n, bx_op op, void *ctx);
/* The bx_comm of a Python allreduce fn (None: NULL, one process) for rank:
 * *pc and *comm filled, comm returned (both the caller's, for the call). */
const bx_comm *bxpy_pycomm_comm(bxpy_pycomm *pc, bx_comm *comm, PyObject *fn, int rank);

#define BXK_N(a) ((int)(sizeof(a) / sizeof((a)[0])))
/* Declare the call k of Python name fn over the names nm, export objs. */
#define BXK_BEGIN(K_, NAME_, NM_, OBJS_, OUT_, OPT_) \
  bxk_call K_;                                        \
  K_.fn = NAME_;                                      \
  K_.n = BXK_N(NM_);                                  \
  K_.names = NM_;                                     \
  K_.loc = NULL;                                      \
  if (bxk_export(&K_, OBJS_, OUT_, OPT_) < 0) return NULL
/* Run the C call with the GIL released and finish. */
#define BXK_RUN(k, call)            \
  do {                              \
    bx_status st_;                  \
    Py_BEGIN_ALLOW_THREADS st_ = (call); \
    Py_END_ALLOW_THREADS return bxk_done(&(k), st_); \
  } while (0)
#define BXK_ARGS (PyObject * self, PyObject * args, PyObject * kw)
#define BXK_METH(name, fn, doc) {name, (PyCFunction)(void (*)(void))fn, METH_VARARGS | METH_KEYWORDS, doc}

extern PyMethodDef bxpy_train_methods[];    /* _train.c */
extern PyMethodDef bxpy_train_moe_methods[]; /* _train_moe.c */
extern PyMethodDef bxpy_tokred_methods[];   /* _train_tokred.c */
extern PyMethodDef bxpy_glm_methods[];      /* _glm.c: the model module (src/glm) */
/* Adds the training tables (kernels, MoE, token reduction, the model
 * module) and the TokRed type to the module; -1 on failure. */
int bxpy_train_init(PyObject *module);
int bxpy_tokred_init(PyObject *module);
int bxpy_glm_init(PyObject *module); /* _glm.c: the GradRed type */
/* The bx_tokred of a TokRed object, marked in use (a second taker, or a
 * TokRed method, is refused until bxpy_tokred_give), and the gradient
 * descriptors it was created with (*grads, *n; either may be NULL); NULL
 * with the error raised when o is not a TokRed or is in use. Called with
 * the GIL. */
bx_tokred *bxpy_tokred_take(PyObject *o, const char *fn, const DLTensor **grads, size_t *n);
/* A token reduction's gradient descriptors from Python: a sequence of
 * tensors (exported: their shapes and dtypes) or shapes (fp32 host);
 * -1 with the error raised (fn names the caller). Release after use. */
typedef struct bxpy_descs {
  Py_ssize_t n;
  DLTensor *dl;
  bxpy_owner *own;
  int64_t *shp;
} bxpy_descs;
int bxpy_descs_parse(PyObject *gobj, const char *fn, bxpy_descs *d);
void bxpy_descs_release(bxpy_descs *d);
void bxpy_tokred_give(PyObject *o);

#endif /* BXPY_H */
