/*
 * backends.c — the registry of device backends (backend.h): the one place
 * that names them. A new backend is its own folder implementing
 * bx_device_backend and one line here.
 */
#include "backend.h"
#include "error.h"

#ifdef BX_HAVE_CUDA
extern const bx_device_backend bx_cuda_backend; /* src/cuda/backend.cu */
#define CUDA_BACKEND (&bx_cuda_backend)
#else
#define CUDA_BACKEND NULL
#endif

/* tests only (bx_backend_cuda_override): a simulated backend in its place */
static const bx_device_backend *g_override;

const bx_device_backend *bx_backend_cuda(void) { return g_override ? g_override : CUDA_BACKEND; }

void bx_backend_cuda_override(const bx_device_backend *be) { g_override = be; }

/* bitexact_cuda.h's (and bitexact.h's) availability check: callable in
 * every build, without CUDA headers. */
bx_status bx_cuda_available(void) {
  const bx_device_backend *be = bx_backend_cuda();
  if (!be)
    return bx_fail(BX_EDEVICE, "bx_cuda_available: this build of bitexact has no CUDA backend "
                   "(built without nvcc, or CUDA=0)");
  return be->available();
}
