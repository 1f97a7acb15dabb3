/*
 * _bxpy.h — what the two C files of bitexact._core share: the DLPack 1.0
 * managed tensor (Debian's dlpack 0.6 header predates it), the record of
 * one consumed capsule, and the error helpers.
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

#endif /* BXPY_H */
