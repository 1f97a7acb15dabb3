/*
 * cuda_stub.c — the CUDA hooks of a build without the CUDA backend (no nvcc,
 * or make CUDA=0): CUDA tensors and device communicators are refused with
 * BX_EDEVICE / a failing all-reduce, and bx_cuda_available says why.
 * Compiled only when BX_HAVE_CUDA is not defined.
 */
#include "internal.h"

#ifndef BX_HAVE_CUDA

#define NO_BACKEND "this build of bitexact has no CUDA backend (built without nvcc, or CUDA=0)"

bx_status bx_cuda_available(void);
bx_status bx_cuda_available(void) {
  return bx_fail(BX_EDEVICE, "bx_cuda_available: " NO_BACKEND);
}

bx_status bx_cuda_partials(const char *fn, const bx_group *groups, size_t ngroups, bx_mode m,
                           double p, int rank, bx_partial *parts, int64_t *offender) {
  (void)groups, (void)ngroups, (void)m, (void)p, (void)parts, (void)offender;
  return bx_fail(BX_EDEVICE, "%s: rank %d: CUDA tensors, but " NO_BACKEND, fn, rank);
}

bx_status bx_cuda_scale_blocking(const char *fn, const DLTensor *flat, size_t count,
                                 const bx_group *groups, size_t ngroups, double coef,
                                 const bx_scale_opts *o, int skip_one) {
  (void)flat, (void)count, (void)groups, (void)ngroups, (void)coef, (void)o, (void)skip_one;
  return bx_fail(BX_EDEVICE, "%s: CUDA tensors, but " NO_BACKEND, fn);
}

int bx_cuda_allreduce_staged(const bx_comm *comm, int64_t *buf, size_t n, bx_op op) {
  (void)comm, (void)buf, (void)n, (void)op;
  return -1; /* reported as BX_ECOMM by the caller */
}

#else
typedef int bx_cuda_stub_unused; /* ISO C: a translation unit is not empty */
#endif
