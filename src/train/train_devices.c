/*
 * train_devices.c — the registry of the training kernels' device backends
 * (train_device.h): the one place that names them. A new backend is its
 * own folder implementing bx_train_device and one line here. Also the
 * device path's host copies of device data (train_check.h bx_tc_to_host).
 */
#include "error.h"
#include "train_check.h"
#include "train_device.h"
#include "workspace.h"

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

bx_status bx_tc_to_host(const char *fn, const bx_tc_place *pl, const bx_train_device *dev,
                        const bx_tc_tensor *const *ts, bx_tc_tensor *hosts, size_t count,
                        size_t extra_bytes, void **extra) {
  size_t bytes = 0;
  for (size_t i = 0; i < count; i++)
    if (ts[i] && ts[i]->n) bytes += (ts[i]->n * ts[i]->elsize + 15) & ~(size_t)15;
  size_t at = bytes;
  bytes += extra_bytes;
  char *ws = bx_workspace(bytes ? bytes : 1);
  if (!ws) return bx_fail(BX_ENOMEM, "%s: cannot allocate %zu bytes on the host for the device "
                          "data's checks", fn, bytes);
  size_t off = 0;
  for (size_t i = 0; i < count; i++) {
    if (!ts[i]) continue;
    hosts[i] = *ts[i];
    if (!ts[i]->n) continue;
    size_t b = ts[i]->n * ts[i]->elsize;
    bx_status st = dev->to_host(fn, pl->device, ws + off, ts[i]->data, b);
    if (st != BX_OK) return st;
    hosts[i].data = ws + off;
    off += (b + 15) & ~(size_t)15;
  }
  if (extra) *extra = ws + at;
  return BX_OK;
}
