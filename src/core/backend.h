/*
 * backend.h — the device backends the core drives through a table (BLIS's
 * registry: the core knows this interface only; src/cuda implements it and
 * is registered in one line of backends.c). A build without a backend
 * refuses device tensors and device communicators with BX_EDEVICE.
 *
 * A blocking call on device tensors goes: prepare (validate, reserve every
 * byte the call will need, upload the work list: all before the first
 * collective, so a failure there fails every rank in the agreement and
 * nothing can run out of memory after the ranks have agreed) → partials
 * (the reduction; every group's words back on the host) → the collectives
 * (staged through the prepared device memory) → scale (no allocation) →
 * release (nothing freed: the memory is kept for the thread's next call).
 */
#ifndef BX_BACKEND_H
#define BX_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "bitexact.h"
#include "norm_state.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct bx_device_call bx_device_call; /* a prepared blocking call */

typedef struct bx_device_prep {
  const bx_group *groups; /* the tensors: groups, or flat[0..count) when groups is NULL */
  size_t ngroups;
  const DLTensor *flat;
  size_t count;
  int reduce;          /* the norm will run (mode, p) */
  int mode;            /* bx_mode */
  double p;
  int scale;           /* the tensors may be scaled (checked: no shared memory) */
  size_t stage_words;  /* int64 words a device communicator's all-reduce stages */
  int rank;            /* for messages */
} bx_device_prep;

typedef struct bx_device_backend {
  const char *name;
  /* BX_OK when a device is usable, else BX_EDEVICE with the reason. */
  bx_status (*available)(void);
  /* Everything before the first collective (see above); *out only on
   * success. */
  bx_status (*prepare)(const char *fn, const bx_device_prep *prep, bx_device_call **out);
  /* Every group's partial (accumulator normalised), the first NaN/Inf key
   * of this rank (-1 none), and the dtypes seen (bit d: dtype d). */
  bx_status (*partials)(bx_device_call *c, bx_partial *parts, int64_t *offender, unsigned *dtypes);
  /* A device communicator's all-reduce of host words, staged through the
   * call's device memory; waits. Returns the communicator's code (0 ok). */
  int (*allreduce_staged)(bx_device_call *c, const bx_comm *comm, int64_t *buf, size_t n,
                          bx_op op);
  /* Scale every tensor by coef (bx_scale_mode rounding); waits. */
  bx_status (*scale)(bx_device_call *c, double coef, const bx_scale_opts *o);
  void (*release)(bx_device_call *c);
} bx_device_backend;

/* The CUDA backend, or NULL in a build without one. */
const bx_device_backend *bx_backend_cuda(void);

/* Tests only (tests/test_device_agree.c): be (NULL: the real one again) in place of the
 * CUDA backend, so the device communicator's paths run on the CPU. Not thread-safe: set it
 * before the calls. Not exported. */
void bx_backend_cuda_override(const bx_device_backend *be);

#ifdef __cplusplus
}
#endif

#endif /* BX_BACKEND_H */
