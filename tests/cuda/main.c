/*
 * main.c — bx_cuda_tests, the GPU test runner: the CUDA backend and the
 * NCCL adapter against the CPU backend, bit for bit.
 *
 *   bx_cuda_tests            run every test
 *   bx_cuda_tests FILTER     run the tests whose name contains FILTER
 *   bx_cuda_tests --list     print the names
 *   BX_TEST_SEED=N           seed of the random data (default below)
 *   BX_CUDA_TEST_HUGE=0      skip the > 2^31-element tensor (4.3 GB)
 *   BX_CUDA_STRICT_NAN=1     NaN payloads of scaled gradients must match too
 *
 * Without a usable GPU (or a build without the CUDA backend) it prints
 * "GPU tests NOT RUN: <why>", reports every test as skipped and exits 0:
 * nothing is counted as passed. Last line: `N passed, N failed` (`, N
 * skipped` when some could not run); exit status non-zero on any failure.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ct.h"
#include "cuda_tests.h"

#define DEFAULT_SEED 20240917u

typedef struct test_entry {
  const char *name;
  void (*fn)(void);
} test_entry;

/* Quick checks first, the largest data last. */
static const test_entry TESTS[] = {
    {"blocking_bad_input", test_blocking_bad_input},
    {"plan_errors", test_plan_errors},
    {"norm_dtypes_datasets", test_norm_dtypes_datasets},
    {"norm_layout_invariance", test_norm_layout_invariance},
    {"norm_other_p", test_norm_other_p},
    {"blocking_views", test_blocking_views},
    {"norm_many_tensors", test_norm_many_tensors},
    {"scale_dtypes_coefs", test_scale_dtypes_coefs},
    {"clip_blocking", test_clip_blocking},
    {"blocking_host_comm", test_blocking_host_comm},
    {"plan_norm_async", test_plan_norm_async},
    {"plan_clip_async", test_plan_clip_async},
    {"plan_nonfinite_status", test_plan_nonfinite_status},
    {"plan_scale_async", test_plan_scale_async},
    {"plan_graph_capture", test_plan_graph_capture},
    {"plan_async_no_host_sync", test_plan_async_no_host_sync},
    {"plan_launch_count", test_plan_launch_count},
    {"plan_many_tensors", test_plan_many_tensors},
    {"nccl_adapter", test_nccl_adapter},
    {"nccl_blocking", test_nccl_blocking},
    {"nccl_plan", test_nccl_plan},
    {"tokred_device", test_tokred_device},
    {"wgrad_device", test_wgrad_device},
    {"nccl_tokred", test_nccl_tokred},
    {"norm_large_tensors", test_norm_large_tensors},
    {"norm_huge_tensor", test_norm_huge_tensor},
};
#define NTESTS (sizeof TESTS / sizeof TESTS[0])

/* Why the GPU tests cannot run here, or NULL when they can. */
static const char *why_not_run(char *buf, size_t len) {
  if (bx_cuda_available() != BX_OK) {
    snprintf(buf, len, "%s", *bx_last_error() ? bx_last_error() : "bx_cuda_available() failed");
    return buf;
  }
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n < 1) {
    snprintf(buf, len, "cudaGetDeviceCount: %s", e != cudaSuccess ? cudaGetErrorString(e) : "no device");
    return buf;
  }
  return NULL;
}

static void describe_device(void) {
  int dev = 0, rt = 0, drv = 0;
  struct cudaDeviceProp p;
  cudaGetDevice(&dev);
  cudaRuntimeGetVersion(&rt);
  cudaDriverGetVersion(&drv);
  if (cudaGetDeviceProperties(&p, dev) == cudaSuccess)
    printf("bx_cuda_tests: device %d: %s, sm_%d%d, %d SMs, %.1f GiB; runtime %d, driver %d\n", dev,
           p.name, p.major, p.minor, p.multiProcessorCount, (double)p.totalGlobalMem / (1u << 30), rt,
           drv);
}

int main(int argc, char **argv) {
  const char *filter = NULL;
  uint64_t seed = DEFAULT_SEED;
  const char *env = getenv("BX_TEST_SEED");
  if (env && *env) seed = strtoull(env, NULL, 0);
  ct_set_seed(seed);
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--list") == 0) {
      for (size_t t = 0; t < NTESTS; t++) printf("%s\n", TESTS[t].name);
      return 0;
    }
    filter = argv[i];
  }
  setvbuf(stdout, NULL, _IOLBF, 0);
  int passed = 0, failed = 0, skipped = 0;
  char why[512];
  if (why_not_run(why, sizeof why)) {
    printf("GPU tests NOT RUN: %s\n", why);
    for (size_t t = 0; t < NTESTS; t++) {
      if (filter && !strstr(TESTS[t].name, filter)) continue;
      printf("[SKIP] %s\n", TESTS[t].name);
      skipped++;
    }
    printf("%d passed, %d failed, %d skipped\n", passed, failed, skipped);
    return 0;
  }
  printf("bx_cuda_tests: seed %" PRIu64 " (set BX_TEST_SEED to replay), bitexact %u\n", seed,
         bx_version());
  describe_device();
  const char *broken = NULL; /* a sticky CUDA error ends the run */
  for (size_t t = 0; t < NTESTS; t++) {
    if (filter && !strstr(TESTS[t].name, filter)) continue;
    if (broken) {
      printf("[FAIL] %s: not run, the device is in error (%s)\n", TESTS[t].name, broken);
      failed++;
      continue;
    }
    ct_begin(TESTS[t].name);
    (void)cudaGetLastError();
    double t0 = ct_now();
    TESTS[t].fn();
    cudaError_t e = cudaDeviceSynchronize();
    if (e != cudaSuccess) {
      CT_CHECK(0, "CUDA error after the test: %s", cudaGetErrorString(e));
      if (cudaDeviceSynchronize() != cudaSuccess) broken = cudaGetErrorString(e);
    } else if ((e = cudaGetLastError()) != cudaSuccess) {
      /* the library must not leave an error in the runtime's last-error
       * slot: torch's next kernel-launch check would raise it */
      CT_CHECK(0, "cudaGetLastError() after the test: %s (left by a library or test call)",
               cudaGetErrorString(e));
    }
    double secs = ct_now() - t0;
    if (ct_failures()) {
      failed++;
      printf("[FAIL] %s: %d failed check(s) (%.2fs); replay: BX_TEST_SEED=%" PRIu64
             " bx_cuda_tests %s\n",
             TESTS[t].name, ct_failures(), secs, seed, TESTS[t].name);
    } else if (ct_skipped()) {
      skipped++;
      printf("[SKIP] %s\n", TESTS[t].name);
    } else {
      passed++;
      printf("[ OK ] %s (%.2fs)\n", TESTS[t].name, secs);
    }
  }
  if (skipped)
    printf("%d passed, %d failed, %d skipped\n", passed, failed, skipped);
  else
    printf("%d passed, %d failed\n", passed, failed);
  return failed ? 1 : 0;
}
