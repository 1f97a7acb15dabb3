/*
 * test_train_device.c — where a training call runs (bitexact_train.h,
 * Devices) and the memory bx_train_alloc gives: host tensors on the host;
 * kDLCUDAManaged tensors on the device backend when it is usable, on the
 * host otherwise; and the host simulation of the device backend
 * (src/hostsim), whose launchers refuse memory it did not hand out — the
 * check that lets `BITEXACT_TEST_DEVICE=sim bitexact train --device cuda`
 * stand in for a GPU in CI (tests/cli/cases_device.py).
 */
#include <stdint.h>
#include <string.h>

#include "bitexact_train.h"
#include "dl_view.h"
#include "harness.h"
#include "tests.h"
#include "train_device.h"

static DLTensor managed_view(void *p, int ndim, int64_t *shape) {
  DLTensor t = bxt_f32_view(p, ndim, shape);
  t.device.device_type = kDLCUDAManaged;
  return t;
}

void test_train_alloc(void) {
  DLDevice cpu = {kDLCPU, 0};
  void *p = (void *)1;
  CHECK_STATUS(bx_train_alloc(cpu, 1000, &p), BX_OK, "host memory");
  CHECK(p && ((uintptr_t)p & 63) == 0, "64-byte aligned");
  int zero = 1;
  for (size_t i = 0; p && i < 1000; i++) zero &= ((unsigned char *)p)[i] == 0;
  CHECK(zero, "zeroed");
  bx_train_free(cpu, p);
  CHECK_STATUS(bx_train_alloc(cpu, 0, &p), BX_OK, "0 bytes: a block of 1");
  bx_train_free(cpu, p);
  bx_train_free(cpu, NULL);
  DLDevice cuda = {kDLCUDA, 0};
  p = (void *)1;
  CHECK_STATUS(bx_train_alloc(cuda, 16, &p), BX_EDEVICE, "kDLCUDA is not offered");
  CHECK(p == NULL && strstr(bx_last_error(), "kDLCUDAManaged"), "*ptr NULL, names the types: %s",
        bx_last_error());
  CHECK_STATUS(bx_train_alloc(cpu, 16, NULL), BX_EINVAL, "ptr NULL");
  DLDevice managed = {kDLCUDAManaged, 0};
  if (bx_cuda_available() != BX_OK) {
    CHECK_STATUS(bx_train_alloc(managed, 16, &p), BX_EDEVICE, "managed memory without a GPU");
    CHECK(p == NULL, "*ptr NULL");
  }
  bx_train_device_use_sim(1);
  CHECK_STATUS(bx_train_alloc(managed, 16, &p), BX_OK, "simulated managed memory");
  CHECK(p && ((uintptr_t)p & 63) == 0, "aligned");
  bx_train_free(managed, p);
  bx_train_device_use_sim(0);
}

/* C = A B^T of 2x3 by 2x3 on the host, as the reference. */
static void host_gemm(const float *a, const float *b, float *c) {
  int64_t s23[2] = {2, 3}, s22[2] = {2, 2};
  DLTensor ta = bxt_f32_view((void *)a, 2, s23), tb = bxt_f32_view((void *)b, 2, s23),
           tc = bxt_f32_view(c, 2, s22);
  CHECK_STATUS(bx_gemm(&ta, &tb, BX_GEMM_NT, &tc, NULL), BX_OK, "host GEMM");
}

void test_train_device_sim(void) {
  const float a[6] = {1.5f, -2, 3, 0.25f, 5, -6}, b[6] = {7, 8, -9, 1, 0.5f, 2};
  float want[4];
  host_gemm(a, b, want);
  int64_t s23[2] = {2, 3}, s22[2] = {2, 2};
  DLDevice managed = {kDLCUDAManaged, 0};
  /* host memory tagged managed: with no usable device, the host path runs on it */
  if (bx_cuda_available() != BX_OK) {
    float c[4] = {0};
    DLTensor ta = managed_view((void *)a, 2, s23), tb = managed_view((void *)b, 2, s23),
             tc = managed_view(c, 2, s22);
    CHECK_STATUS(bx_gemm(&ta, &tb, BX_GEMM_NT, &tc, NULL), BX_OK, "managed, no device: host");
    CHECK(!memcmp(c, want, sizeof c), "the host's bits");
  }
  bx_train_device_use_sim(1);
  float *d = NULL;
  CHECK_STATUS(bx_train_alloc(managed, 16 * sizeof(float), (void **)&d), BX_OK, "device memory");
  if (d) {
    memcpy(d, a, sizeof a);
    memcpy(d + 6, b, sizeof b);
    DLTensor ta = managed_view(d, 2, s23), tb = managed_view(d + 6, 2, s23),
             tc = managed_view(d + 12, 2, s22);
    CHECK_STATUS(bx_gemm(&ta, &tb, BX_GEMM_NT, &tc, NULL), BX_OK, "simulated device GEMM");
    CHECK(!memcmp(d + 12, want, sizeof want), "the device's bits are the host's");
    /* an operand in memory the device did not hand out: what a GPU faults on */
    float c[4] = {9, 9, 9, 9};
    DLTensor th = managed_view(c, 2, s22);
    CHECK_STATUS(bx_gemm(&ta, &tb, BX_GEMM_NT, &th, NULL), BX_EDEVICE, "host memory as device");
    CHECK(strstr(bx_last_error(), "bx_gemm") && strstr(bx_last_error(), "not device memory"),
          "names the call and the problem: %s", bx_last_error());
    CHECK(c[0] == 9.0f, "nothing written");
    /* past the end of an allocation */
    int64_t s33[2] = {3, 3}, s32[2] = {3, 2};
    DLTensor ta3 = managed_view(d, 2, s32), tb3 = managed_view(d + 6, 2, s23);
    DLTensor tc3 = managed_view(d + 14, 2, s33); /* 9 floats from element 14 of 16 */
    CHECK_STATUS(bx_gemm(&ta3, &tb3, BX_GEMM_NN, &tc3, NULL), BX_EDEVICE, "past the end");
    /* mixed host and managed tensors: the host path, which reads both */
    float c2[4] = {0};
    DLTensor tm = bxt_f32_view(c2, 2, s22);
    CHECK_STATUS(bx_gemm(&ta, &tb, BX_GEMM_NT, &tm, NULL), BX_OK, "mixed: host");
    CHECK(!memcmp(c2, want, sizeof want), "the host's bits");
    /* another entry with a device kernel: SwiGLU on simulated device memory */
    DLTensor tg = managed_view(d, 2, s23), tu = managed_view(d + 6, 2, s23);
    float hw[6];
    DLTensor thw = bxt_f32_view(hw, 2, s23);
    DLTensor tgh = bxt_f32_view((void *)a, 2, s23), tuh = bxt_f32_view((void *)b, 2, s23);
    CHECK_STATUS(bx_swiglu_forward(&tgh, &tuh, &thw, NULL), BX_OK, "host SwiGLU");
    float *h = d + 12; /* 4 floats left: too short for 6 outputs */
    DLTensor tho = managed_view(h, 2, s23);
    CHECK_STATUS(bx_swiglu_forward(&tg, &tu, &tho, NULL), BX_EDEVICE, "h past the end");
  }
  bx_train_free(managed, d);
  bx_train_device_use_sim(0);
}

/* kDLCUDA view of p (device memory for the device, the simulation's too). */
static DLTensor cuda_view(void *p, int ndim, int64_t *shape) {
  DLTensor t = bxt_f32_view(p, ndim, shape);
  t.device.device_type = kDLCUDA;
  return t;
}

/* The last entries on the simulated device (issue 30): bx_tokred_finish
 * into kDLCUDA outputs (host staging, then copied), its refusals (mixed
 * outputs, memory the device did not hand out) writing nothing, also when
 * the second of two outputs is the bad one; a math call on host memory
 * labelled kDLCUDA refused with nothing written. */
void test_train_device_finish(void) {
  bx_train_device_use_sim(1);
  int64_t s4[1] = {4}, s3[1] = {3};
  DLTensor g[2] = {bxt_f32_view(NULL, 1, s4), bxt_f32_view(NULL, 1, s3)};
  bx_tokred *s = NULL;
  CHECK_STATUS(bx_tokred_create(g, 2, 1, 1, NULL, &s), BX_OK, "state");
  float p0[4] = {1.5f, -0.25f, 3.0f, 1e-3f}, p1[3] = {-7.0f, 0.5f, 2.0f};
  DLTensor tp0 = bxt_f32_view(p0, 1, s4), tp1 = bxt_f32_view(p1, 1, s3);
  CHECK_STATUS(bx_tokred_bound(s, 0, 0, &tp0), BX_OK, "bound 0");
  CHECK_STATUS(bx_tokred_bound(s, 1, 0, &tp1), BX_OK, "bound 1");
  CHECK_STATUS(bx_tokred_agree(s, NULL), BX_OK, "agree");
  CHECK_STATUS(bx_tokred_add(s, 0, 0, &tp0), BX_OK, "add 0");
  CHECK_STATUS(bx_tokred_add(s, 1, 0, &tp1), BX_OK, "add 1");
  float want[7];
  DLTensor th[2] = {bxt_f32_view(want, 1, s4), bxt_f32_view(want + 4, 1, s3)};
  CHECK_STATUS(bx_tokred_finish(s, th, 2, 3), BX_OK, "host finish");
  DLDevice managed = {kDLCUDAManaged, 0};
  float *d = NULL;
  CHECK_STATUS(bx_train_alloc(managed, 8 * sizeof(float), (void **)&d), BX_OK, "device memory");
  if (d && s) {
    for (int i = 0; i < 8; i++) d[i] = 9.0f;
    DLTensor td[2] = {cuda_view(d, 1, s4), cuda_view(d + 4, 1, s3)};
    CHECK_STATUS(bx_tokred_finish_check(s, td, 2, 3), BX_OK, "device check");
    CHECK_STATUS(bx_tokred_finish(s, td, 2, 3), BX_OK, "device finish");
    CHECK(!memcmp(d, want, sizeof want), "the device outputs hold the host's bits");
    for (int i = 0; i < 8; i++) d[i] = 9.0f;
    float h[3] = {9, 9, 9};
    DLTensor mixed[2] = {td[0], bxt_f32_view(h, 1, s3)};
    CHECK_STATUS(bx_tokred_finish(s, mixed, 2, 3), BX_EDEVICE, "mixed outputs");
    CHECK(strstr(bx_last_error(), "all be kDLCUDA"), "says why: %s", bx_last_error());
    DLTensor bad[2] = {td[0], cuda_view(h, 1, s3)}; /* the second: host memory as device */
    CHECK_STATUS(bx_tokred_finish(s, bad, 2, 3), BX_EDEVICE, "host memory as device");
    CHECK(strstr(bx_last_error(), "not device memory"), "names the problem: %s", bx_last_error());
    CHECK(d[0] == 9.0f && d[3] == 9.0f && h[0] == 9.0f, "nothing written");
    /* a math call on host memory labelled kDLCUDA: refused, nothing written */
    float x[3] = {1, 2, 3};
    DLTensor tx = cuda_view(x, 1, s3), ty = cuda_view(d, 1, s3);
    CHECK_STATUS(bx_exp(&tx, &ty, NULL), BX_EDEVICE, "x not device memory");
    CHECK(d[0] == 9.0f, "nothing written");
    DLTensor tx2 = cuda_view(d + 4, 1, s3);
    CHECK_STATUS(bx_exp(&tx2, &ty, NULL), BX_OK, "exp on the device");
    CHECK(d[0] == bx_exp_f32(9.0f), "exp's bits");
  }
  bx_train_free(managed, d);
  bx_tokred_destroy(s);
  bx_train_device_use_sim(0);
}
