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

/* Raise the exception for st with text msg; cause (stolen, may be NULL)
 * becomes its __cause__. Returns NULL. */
PyObject *bxpy_raise_status(bx_status st, const char *msg, PyObject *cause);

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
/* acc += sum of squares (or |x|) of t, for any tensor the library accepts:
 * kDLCUDA ones are copied to the host in pieces first (a rare path: the
 * exact tie-break of a narrower norm). Call without the GIL. */
bx_status bxpy_acc_add(bx_acc *acc, const DLTensor *t, int squares);
/* Views.cuda_plan(...) (a method of Views, see _cuda.c). */
PyObject *bxpy_views_cuda_plan(Views *v, PyObject *args, PyObject *kwds);
/* Module functions of _cuda.c and its init (the CudaPlan type); -1 on failure. */
extern PyMethodDef bxpy_cuda_methods[];
int bxpy_cuda_init(PyObject *module);

#endif /* BXPY_H */
