/*
 * cuda_tests.h — every test of the GPU runner (tests/cuda/main.c holds the
 * table), and the helpers shared between test files.
 */
#ifndef BX_CUDA_TESTS_H
#define BX_CUDA_TESTS_H

#include "ct.h"

/* GPU bx_total_norm (with comm, may be NULL) vs the CPU's (alone) on s in
 * ngroups groups (<= 8): status, total and group norms bit for bit, and
 * on failure the same tensor named. Returns 1 when all matched. */
int ct_compare_norm(const ct_set *s, size_t ngroups, const bx_comm *comm,
                    const bx_norm_opts *o, const char *label);

/* test_norm.c */
void test_norm_dtypes_datasets(void);
void test_norm_layout_invariance(void);
void test_norm_other_p(void);
void test_norm_many_tensors(void);
void test_norm_large_tensors(void);
void test_norm_huge_tensor(void);
/* test_blocking.c */
void test_scale_dtypes_coefs(void);
void test_clip_blocking(void);
void test_blocking_host_comm(void);
void test_blocking_views(void);
void test_blocking_bad_input(void);
/* test_plan.c */
void test_plan_norm_async(void);
void test_plan_clip_async(void);
void test_plan_nonfinite_status(void);
void test_plan_scale_async(void);
void test_plan_graph_capture(void);
void test_plan_async_no_host_sync(void);
void test_plan_launch_count(void);
void test_plan_many_tensors(void);
void test_plan_errors(void);
/* test_nccl.c */
void test_nccl_adapter(void);
void test_nccl_blocking(void);
void test_nccl_plan(void);
/* test_tokred.c */
void test_tokred_device(void);
void test_wgrad_device(void);
void test_nccl_tokred(void);

#endif /* BX_CUDA_TESTS_H */
