/*
 * train_devices.c — the registry of the training kernels' device backends
 * (train_device.h): the one place that names them. A new backend is its
 * own folder implementing bx_train_device and one line here.
 */
#include "error.h"
#include "train_device.h"

#ifdef BX_HAVE_CUDA
extern const bx_train_device bx_cuda_train; /* src/cuda/train/train_table.cu */
#define CUDA_TRAIN (&bx_cuda_train)
#else
#define CUDA_TRAIN NULL
#endif

const bx_train_device *bx_train_device_cuda(void) { return CUDA_TRAIN; }

bx_status bx_train_cuda(const char *fn, const bx_train_device **dev) {
  *dev = bx_train_device_cuda();
  if (!*dev)
    return bx_fail(BX_EDEVICE, "%s: every tensor is a CUDA tensor, but this build of bitexact "
                   "has no CUDA backend (built without nvcc, or CUDA=0)", fn);
  return BX_OK;
}
