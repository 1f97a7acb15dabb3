/*
 * train_devices.c — the registry of the training kernels' device backends
 * (train_device.h): the one place that names them. A new backend is its
 * own folder implementing bx_train_device and one line here. Also the
 * public allocator of training tensors (bx_train_alloc), which the model
 * module uses for its buffers under `bitexact train --device cuda`.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bitexact_train.h"
#include "error.h"
#include "train_device.h"

#ifdef BX_HAVE_CUDA
extern const bx_train_device bx_cuda_train; /* src/cuda/train/train_table.cu */
#define CUDA_TRAIN (&bx_cuda_train)
#else
#define CUDA_TRAIN NULL
#endif

/* 0: not decided yet; 1: the build's backend; 2: the host simulation; 3: the
 * host simulation with a planted error (BITEXACT_TEST_DEVICE=sim-plant). */
static atomic_int g_choice;
/* 0: not asked; 1: managed calls run on the device; 2: on the host. */
static atomic_int g_managed;

static int choice(void) {
  int c = atomic_load(&g_choice);
  if (c) return c;
  const char *e = getenv("BITEXACT_TEST_DEVICE");
  c = e && !strcmp(e, "sim") ? 2 : e && !strcmp(e, "sim-plant") ? 3 : 1;
  int expected = 0;
  atomic_compare_exchange_strong(&g_choice, &expected, c);
  return atomic_load(&g_choice);
}

void bx_train_device_use_sim(int on) {
  atomic_store(&g_choice, on ? 2 : 1);
  atomic_store(&g_managed, 0);
}

const bx_train_device *bx_train_device_cuda(void) {
  return choice() >= 2 ? &bx_hostsim_train : CUDA_TRAIN;
}

int bx_train_device_sim_plant(void) { return choice() == 3; }

/* The device calls by entry (bx_train_device_calls): fn is always a string
 * literal, so its address names the entry. */
#define MAX_NAMES 64
static pthread_mutex_t g_calls_lock = PTHREAD_MUTEX_INITIALIZER;
static const char *g_call_name[MAX_NAMES];
static uint64_t g_call_count[MAX_NAMES];
static size_t g_call_names;

static void count_call(const char *fn) {
  pthread_mutex_lock(&g_calls_lock);
  size_t i = 0;
  while (i < g_call_names && g_call_name[i] != fn && strcmp(g_call_name[i], fn)) i++;
  if (i == g_call_names && i < MAX_NAMES) g_call_name[g_call_names++] = fn;
  if (i < g_call_names) g_call_count[i]++;
  pthread_mutex_unlock(&g_calls_lock);
}

size_t bx_train_device_calls(char *buf, size_t cap) {
  pthread_mutex_lock(&g_calls_lock);
  size_t need = 0;
  for (size_t i = 0; i < g_call_names; i++) {
    char line[160];
    int n = snprintf(line, sizeof line, "%s %llu\n", g_call_name[i],
                     (unsigned long long)g_call_count[i]);
    if (n < 0) continue;
    if (buf && need + (size_t)n < cap) memcpy(buf + need, line, (size_t)n);
    need += (size_t)n;
  }
  if (buf && cap) buf[need < cap ? need : cap - 1] = 0;
  pthread_mutex_unlock(&g_calls_lock);
  return need + 1;
}

bx_status bx_train_cuda(const char *fn, const bx_train_device **dev) {
  *dev = bx_train_device_cuda();
  if (!*dev)
    return bx_fail(BX_EDEVICE, "%s: every tensor is a CUDA tensor, but this build of bitexact "
                   "has no CUDA backend (built without nvcc, or CUDA=0)", fn);
  count_call(fn);
  return BX_OK;
}

int bx_train_managed_on_device(void) {
  int m = atomic_load(&g_managed);
  if (!m) {
    const bx_train_device *dev = bx_train_device_cuda();
    m = 2;
    if (dev) {
      bx_error_saved saved;
      bx_error_save(&saved); /* the answer "no" is not an error of the caller's */
      if (dev->usable("bx_train_managed_on_device") == BX_OK) m = 1;
      bx_error_restore(&saved);
    }
    atomic_store(&g_managed, m);
  }
  return m == 1;
}

bx_status bx_train_alloc(DLDevice device, size_t bytes, void **ptr) {
  if (!ptr) return bx_fail(BX_EINVAL, "bx_train_alloc: ptr is NULL");
  *ptr = NULL;
  size_t n = bytes ? bytes : 1;
  if (device.device_type == kDLCPU) {
    if (n > SIZE_MAX - 63) return bx_fail(BX_ENOMEM, "bx_train_alloc: %zu bytes", bytes);
    void *p = aligned_alloc(64, (n + 63) / 64 * 64);
    if (!p) return bx_fail(BX_ENOMEM, "bx_train_alloc: %zu bytes of host memory", bytes);
    memset(p, 0, n);
    *ptr = p;
    return BX_OK;
  }
  if (device.device_type != kDLCUDAManaged)
    return bx_fail(BX_EDEVICE, "bx_train_alloc: device type %d: only kDLCPU (%d) and "
                   "kDLCUDAManaged (%d) memory", (int)device.device_type, (int)kDLCPU,
                   (int)kDLCUDAManaged);
  const bx_train_device *dev = bx_train_device_cuda();
  if (!dev)
    return bx_fail(BX_EDEVICE, "bx_train_alloc: managed memory needs the CUDA backend, and this "
                   "build of bitexact has none (built without nvcc, or CUDA=0)");
  bx_status st = dev->usable("bx_train_alloc");
  if (st != BX_OK) return st;
  return dev->alloc_managed("bx_train_alloc", n, ptr);
}

void bx_train_free(DLDevice device, void *ptr) {
  if (!ptr) return;
  if (device.device_type == kDLCUDAManaged) {
    const bx_train_device *dev = bx_train_device_cuda();
    if (dev) dev->free_managed(ptr);
    return;
  }
  free(ptr);
}
