/*
 * main.c — the bx_tests runner: the table of every test, the harness
 * (checks, counters, seeds, skips) and the ISA list.
 *
 *   bx_tests            run every test
 *   bx_tests FILTER     run the tests whose name contains FILTER
 *   bx_tests --list     print the names
 *   BX_TEST_SEED=N      seed of the property tests (default below)
 *   BX_TEST_SKIP=A,B    do not run the tests named exactly A, B: counted
 *                       as skipped (for an environment known to break
 *                       them, e.g. fork under qemu-user 7.2: see
 *                       scripts/cross_aarch64.sh)
 *
 * Last line: `N passed, N failed` (`, N skipped` if some could not run).
 */
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <mpfr.h>

#include "harness.h"
#include "kernels.h"
#include "mpfr_ref.h"
#include "tests.h"

#define DEFAULT_SEED 20240917u
#define MAX_PRINTED_FAILURES 12 /* per test; the rest are only counted */

/* ---- the table: every test, in the order they run -------------------- */
typedef struct test_entry {
  const char *name;
  void (*fn)(void);
} test_entry;

static const test_entry TESTS[] = {
    /* the reference checks itself first: nothing else means much if it fails */
    {"ref_decode_16bit", test_ref_decode_16bit},
    {"ref_round_vs_hardware", test_ref_round_vs_hardware},
    {"ref_float_to_half_conversions", test_ref_float_to_half_conversions},
    {"ref_exactness", test_ref_exactness},
    /* ISA dispatch */
    {"isa_force_and_names", test_isa_force_and_names},
    /* accumulator vs MPFR (test_acc.c) */
    {"acc_init_and_layout", test_acc_init_and_layout},
    {"acc_wire_format_positions", test_acc_wire_format_positions},
    {"acc_random_gradients", test_acc_random_gradients},
    {"acc_random_bits", test_acc_random_bits},
    {"acc_adversarial_fp32", test_acc_adversarial_fp32},
    {"acc_adversarial_fp64", test_acc_adversarial_fp64},
    {"acc_adversarial_16bit", test_acc_adversarial_16bit},
    {"acc_ties_value", test_acc_ties_value},
    {"acc_ties_sqrt", test_acc_ties_sqrt},
    {"acc_ties_abs", test_acc_ties_abs},
    {"acc_tiny_runs", test_acc_tiny_runs},
    {"acc_nonfinite_counters", test_acc_nonfinite_counters},
    {"acc_large_chunks", test_acc_large_chunks},
    {"acc_views_and_shapes", test_acc_views_and_shapes},
    {"acc_bad_tensor_leaves_acc", test_acc_bad_tensor_leaves_acc},
    {"acc_negative_words", test_acc_negative_words},
    {"acc_random_words", test_acc_random_words},
    {"acc_compare", test_acc_compare},
    {"acc_misaligned_data", test_acc_misaligned_data},
    /* merge and wire format (test_merge.c) */
    {"merge_partitions_by_hand", test_merge_partitions_by_hand},
    {"merge_random_order", test_merge_random_order},
    {"merge_many_accumulators", test_merge_many_accumulators},
    {"acc_check_versions", test_acc_check_versions},
    /* norms (test_norm.c) */
    {"norm_p2_groups", test_norm_p2_groups},
    {"norm_p1", test_norm_p1},
    {"norm_pinf_and_neginf", test_norm_pinf_and_neginf},
    {"norm_p0", test_norm_p0},
    {"norm_other_p", test_norm_other_p},
    {"norm_nan_inf_rules", test_norm_nan_inf_rules},
    {"norm_error_if_nonfinite", test_norm_error_if_nonfinite},
    {"norm_megatron", test_norm_megatron},
    {"norm_megatron_overflow", test_norm_megatron_overflow},
    {"norm_empty_inputs", test_norm_empty_inputs},
    {"norm_null_opts_and_defaults", test_norm_null_opts_and_defaults},
    {"norm_comm", test_norm_comm},
    {"norm_many_groups", test_norm_many_groups},
    /* invariance (test_invariance.c) */
    {"invariance_p2", test_invariance_p2},
    {"invariance_all_p", test_invariance_all_p},
    {"invariance_split_views", test_invariance_split_views},
    {"invariance_acc_isa_words", test_invariance_acc_isa_words},
    {"concurrent_callers", test_concurrent_callers},
    {"threads_extreme", test_threads_extreme},
    /* several ranks in one process (test_ranks.c) */
    {"ranks_invariance", test_ranks_invariance},
    {"ranks_clip", test_ranks_clip},
    {"ranks_errors", test_ranks_errors},
    /* scaling and clipping (test_scale.c, test_clip.c) */
    {"scale_torch_formula", test_scale_torch_formula},
    {"scale_exact_vs_mpfr", test_scale_exact_vs_mpfr},
    {"scale_exact_ties", test_scale_exact_ties},
    {"scale_exact_subnormal_results", test_scale_exact_subnormal_results},
    {"scale_exact_near_ties", test_scale_exact_near_ties},
    {"scale_special_coefs", test_scale_special_coefs},
    {"scale_signed_zeros", test_scale_signed_zeros},
    {"scale_threads_and_mix", test_scale_threads_and_mix},
    {"clip_coef_formulas", test_clip_coef_formulas},
    {"clip_grad_norm_torch", test_clip_grad_norm_torch},
    {"clip_grad_norm_max_formula", test_clip_grad_norm_max_formula},
    {"clip_max_norm_zero", test_clip_max_norm_zero},
    {"clip_bad_max_norm", test_clip_bad_max_norm},
    {"clip_nonfinite_total", test_clip_nonfinite_total},
    {"clip_threads", test_clip_threads},
    {"clip_all_or_nothing", test_clip_all_or_nothing},
    /* bad input (test_errors.c) */
    {"errors_status_and_version", test_errors_status_and_version},
    {"errors_null_pointers", test_errors_null_pointers},
    {"errors_dtypes", test_errors_dtypes},
    {"errors_devices", test_errors_devices},
    {"errors_shapes", test_errors_shapes},
    {"errors_layouts", test_errors_layouts},
    {"errors_bad_p", test_errors_bad_p},
    {"errors_scale_overlap", test_errors_scale_overlap},
    {"errors_scale_bad_input", test_errors_scale_bad_input},
    {"errors_last_error_thread_local", test_errors_last_error_thread_local},
    /* the CUDA kernels' exact arithmetic on the CPU (test_cuda_sim.c) */
    {"cuda_sim_squares", test_cuda_sim_squares},
    {"cuda_sim_abs", test_cuda_sim_abs},
    {"cuda_sim_megatron", test_cuda_sim_megatron},
    {"cuda_sim_pow", test_cuda_sim_pow},
    {"cuda_sim_adversarial", test_cuda_sim_adversarial},
    {"cuda_refused_without_device", test_cuda_refused_without_device},
    {"device_comm_local_failure_agreed", test_device_comm_local_failure_agreed},
    {"device_comm_tokred", test_device_comm_tokred},
    {"cuda_sim_finish", test_cuda_sim_finish},
    {"cuda_sim_store_rounding", test_cuda_sim_store_rounding},
    /* the training kernels' CUDA decomposition on the CPU (test_train_cuda_sim.c) */
    {"train_cuda_sim_swiglu", test_train_cuda_sim_swiglu},
    {"train_cuda_sim_adamw", test_train_cuda_sim_adamw},
    {"train_cuda_sim_rmsnorm", test_train_cuda_sim_rmsnorm},
    {"train_cuda_sim_rope", test_train_cuda_sim_rope},
    {"train_cuda_sim_gemm", test_train_cuda_sim_gemm},
    /* the router, dispatch, embedding and cross-entropy (test_train_cuda_sim_moe.c) */
    {"train_cuda_sim_router", test_train_cuda_sim_router},
    {"train_cuda_sim_permute", test_train_cuda_sim_permute},
    {"train_cuda_sim_embedding", test_train_cuda_sim_embedding},
    {"train_cuda_sim_xent", test_train_cuda_sim_xent},
    {"train_cuda_dispatch_moe", test_train_cuda_dispatch_moe},
    {"train_cuda_sim_tokred", test_train_cuda_sim_tokred},
    {"train_cuda_sim_wgrad", test_train_cuda_sim_wgrad},
    {"train_cuda_dispatch", test_train_cuda_dispatch},
    {"train_alloc", test_train_alloc},
    {"train_device_sim", test_train_device_sim},
    {"train_device_finish", test_train_device_finish},
    {"train_device_sweep", test_train_device_sweep},
    /* the elementwise math, RoPE's table, the bias partials (test_train_cuda_sim_math.c) */
    {"train_cuda_sim_math", test_train_cuda_sim_math},
    {"train_cuda_sim_rope_table", test_train_cuda_sim_rope_table},
    {"train_cuda_sim_bias_partials", test_train_cuda_sim_bias_partials},
    /* attention's CUDA decomposition on the CPU (test_train_cuda_sim_attn.c) */
    {"train_cuda_sim_attention_fwd", test_train_cuda_sim_attention_fwd},
    {"train_cuda_sim_attention_bwd", test_train_cuda_sim_attention_bwd},
    {"train_cuda_sim_attention_dispatch", test_train_cuda_sim_attention_dispatch},
    /* the block drivers and micro-kernels (test_kernels.c) */
    {"kernels_driver_paths", test_kernels_driver_paths},
    {"kernels_special_near_block_ends", test_kernels_special_near_block_ends},
    {"kernels_f64_bins_flush", test_kernels_f64_bins_flush},
    {"kernels_hostile_fpenv", test_kernels_hostile_fpenv},
    {"kernels_dispatch_reason", test_kernels_dispatch_reason},
    {"kernels_micro_tables", test_kernels_micro_tables},
    /* the shared deterministic power function vs MPFR (test_pow_det.c) */
    {"pow_det_special", test_pow_det_special},
    {"pow_det_random", test_pow_det_random},
    {"pow_det_edges", test_pow_det_edges},
    {"pow_det_roots", test_pow_det_roots},
    {"pow_det_flush_to_zero", test_pow_det_flush_to_zero},
    /* the elementwise math and AdamW of bitexact_train.h (test_math.c, test_adamw.c) */
    {"math_vs_mpfr", test_math_vs_mpfr},
    {"math_tensor_invariance", test_math_tensor_invariance},
    {"math_errors", test_math_errors},
    {"round_bf16", test_round_bf16},
    {"lr_schedule_vs_mpfr", test_lr_schedule_vs_mpfr},
    {"lr_schedule_errors", test_lr_schedule_errors},
    {"adamw_vs_reference", test_adamw_vs_reference},
    {"adamw_threads_and_isa", test_adamw_threads_and_isa},
    {"adamw_errors", test_adamw_errors},
    /* the caller's floating-point environment (test_fpenv.c) */
    {"fpenv_subnormal_counts", test_fpenv_subnormal_counts},
    {"fpenv_callback_sees_caller", test_fpenv_callback_sees_caller},
    {"fpenv_public_api", test_fpenv_public_api},
    /* fork, re-entry, errors (test_calls.c) */
    {"fork_after_threads", test_fork_after_threads},
    {"reentry_from_callback", test_reentry_from_callback},
    {"error_text_not_garbled", test_error_text_not_garbled},
    {"success_keeps_last_error", test_success_keeps_last_error},
    {"error_locations", test_error_locations},
    /* norms in a chosen format, many groups (test_norm_dtype.c) */
    {"norm_dtype_vs_mpfr", test_norm_dtype_vs_mpfr},
    {"norm_dtype_grads", test_norm_dtype_grads},
    {"norm_info_ranks", test_norm_info_ranks},
    {"acc_norm_rules", test_acc_norm_rules},
    {"norm_many_groups_state", test_norm_many_groups_state},
    {"ranks_norm_dtype", test_ranks_norm_dtype},
    /* struct sizes and versions: the ABI (test_abi.c) */
    {"abi_version", test_abi_version},
    {"abi_defaults", test_abi_defaults},
    {"abi_struct_sizes", test_abi_struct_sizes},
    {"abi_old_binary", test_abi_old_binary},
    {"abi_comm_default", test_abi_comm_default},
    /* GEMM (test_gemm.c) */
    {"gemm_vs_reference", test_gemm_vs_reference},
    {"gemm_special_values", test_gemm_special_values},
    {"gemm_batch_invariance", test_gemm_batch_invariance},
    {"gemm_layout_invariance", test_gemm_layout_invariance},
    {"gemm_batched_3d", test_gemm_batched_3d},
    {"gemm_empty", test_gemm_empty},
    {"gemm_bad_input", test_gemm_bad_input},
    /* the token reduction (test_tokred.c) */
    {"tokred_grid_numerics", test_tokred_grid_numerics},
    {"tokred_vs_exact_reference", test_tokred_vs_exact_reference},
    {"tokred_invariance", test_tokred_invariance},
    {"tokred_stated_flag", test_tokred_stated_flag},
    {"tokred_reset", test_tokred_reset},
    {"tokred_ordinary_drifts", test_tokred_ordinary_drifts},
    {"tokred_layout_refused", test_tokred_layout_refused},
    {"tokred_ranks_errors", test_tokred_ranks_errors},
    {"tokred_bad_arguments", test_tokred_bad_arguments},
    /* the MoE router and token dispatch (test_moe.c) */
    {"moe_router_vs_reference", test_moe_router_vs_reference},
    {"moe_router_ties", test_moe_router_ties},
    {"moe_router_backward", test_moe_router_backward},
    {"moe_router_invariance", test_moe_router_invariance},
    {"moe_bias_update", test_moe_bias_update},
    {"moe_router_bad_input", test_moe_router_bad_input},
    {"moe_dispatch_plan", test_moe_dispatch_plan},
    {"moe_dispatch_ranks", test_moe_dispatch_ranks},
    {"moe_permute_roundtrip", test_moe_permute_roundtrip},
    {"moe_dispatch_bad_input", test_moe_dispatch_bad_input},
    /* the canonical NaN (test_nan.c) */
    {"nan_math_adamw", test_nan_math_adamw},
    {"nan_norm_scale", test_nan_norm_scale},
    {"nan_gemm", test_nan_gemm},
    {"nan_layers", test_nan_layers},
    /* the layers: RMSNorm, RoPE, SwiGLU (test_layers.c, test_layers_rope.c) */
    {"rmsnorm_vs_reference", test_rmsnorm_vs_reference},
    {"rmsnorm_batch_invariance", test_rmsnorm_batch_invariance},
    {"rmsnorm_bad_input", test_rmsnorm_bad_input},
    {"rope_vs_reference", test_rope_vs_reference},
    {"rope_batch_invariance", test_rope_batch_invariance},
    {"rope_bad_input", test_rope_bad_input},
    {"swiglu_vs_reference", test_swiglu_vs_reference},
    {"swiglu_batch_invariance", test_swiglu_batch_invariance},
    {"swiglu_bad_input", test_swiglu_bad_input},
    {"layers_threads_and_isa", test_layers_threads_and_isa},
    /* causal GQA attention (test_attention.c) */
    {"attention_vs_reference", test_attention_vs_reference},
    {"attention_reference_gradient", test_attention_reference_gradient},
    {"attention_batch_invariance", test_attention_batch_invariance},
    {"attention_threads_isa", test_attention_threads_isa},
    {"attention_special_values", test_attention_special_values},
    {"attention_bad_input", test_attention_bad_input},
    {"attention_tiling_edges", test_attention_tiling_edges},
    {"attention_tiling_lanes", test_attention_tiling_lanes},
    /* embedding and cross-entropy (test_loss.c) */
    {"loss_embedding", test_loss_embedding},
    {"loss_embedding_tokred", test_loss_embedding_tokred},
    {"loss_xent_vs_reference", test_loss_xent_vs_reference},
    {"loss_xent_special_values", test_loss_xent_special_values},
    {"loss_xent_invariance", test_loss_xent_invariance},
    {"loss_xent_tokred", test_loss_xent_tokred},
    {"loss_bad_input", test_loss_bad_input},
    /* the weight gradient: TN GEMM (test_gemm.c), partials, bounds, the
     * fused call and the grid kernels (test_wgrad.c) */
    {"gemm_tn_chunk_views", test_gemm_tn_chunk_views},
    {"gemm_tn_bad_input", test_gemm_tn_bad_input},
    {"gemm_tn_segments", test_gemm_tn_segments},
    {"wgrad_bias_partials", test_wgrad_bias_partials},
    {"wgrad_bound", test_wgrad_bound},
    {"wgrad_linear", test_wgrad_linear},
    {"wgrad_bad_input", test_wgrad_bad_input},
    {"wgrad_grid_kernels", test_wgrad_grid_kernels},
    /* the vector kernels of the elementwise math (test_math.c; section owner: math) */
    {"math_vector_kernels", test_math_vector_kernels},
    /* any strides in norms and scaling, negative norm_type (test_strided.c,
     * test_negative_p.c; section owner: issue 15, strided) */
    {"strided_norms_random", test_strided_norms_random},
    {"strided_norms_large", test_strided_norms_large},
    {"strided_scale_random", test_strided_scale_random},
    {"strided_scale_large", test_strided_scale_large},
    {"strided_overlaps", test_strided_overlaps},
    {"strided_cuda_dense_only", test_strided_cuda_dense_only},
    {"negative_p_vs_mpfr", test_negative_p_vs_mpfr},
    {"negative_p_special_values", test_negative_p_special_values},
    {"negative_p_invariance", test_negative_p_invariance},
    {"negative_p_ranks", test_negative_p_ranks},
};
#define NTESTS (sizeof TESTS / sizeof TESTS[0])

/* ---- harness state --------------------------------------------------- */
static const char *g_test;   /* running test */
static int g_failures;       /* failed checks in the running test */
static int g_skipped;        /* the running test called bxt_skip */
static uint64_t g_seed = DEFAULT_SEED;

static void report_failure(const char *file, int line, const char *what,
                           const char *fmt, va_list ap) {
  g_failures++;
  if (g_failures > MAX_PRINTED_FAILURES) return;
  fprintf(stdout, "  FAIL %s:%d: %s: ", file, line, what);
  vfprintf(stdout, fmt, ap);
  fputc('\n', stdout);
  if (g_failures == MAX_PRINTED_FAILURES)
    fprintf(stdout, "  (further failures of this test are counted, not printed)\n");
}

int bxt_check(int ok, const char *file, int line, const char *expr,
              const char *fmt, ...) {
  if (ok) return 1;
  va_list ap;
  va_start(ap, fmt);
  report_failure(file, line, expr, fmt, ap);
  va_end(ap);
  return 0;
}

static int same_bits_d(double a, double b) { return memcmp(&a, &b, sizeof a) == 0; }
static int same_bits_f(float a, float b) { return memcmp(&a, &b, sizeof a) == 0; }

int bxt_check_bits_d(double got, double want, const char *file, int line,
                     const char *fmt, ...) {
  if (same_bits_d(got, want)) return 1;
  char what[200];
  uint64_t g, w;
  memcpy(&g, &got, 8);
  memcpy(&w, &want, 8);
  snprintf(what, sizeof what, "got %a (0x%016" PRIx64 ") want %a (0x%016" PRIx64 ")",
           got, g, want, w);
  va_list ap;
  va_start(ap, fmt);
  report_failure(file, line, what, fmt, ap);
  va_end(ap);
  return 0;
}

int bxt_check_bits_f(float got, float want, const char *file, int line,
                     const char *fmt, ...) {
  if (same_bits_f(got, want)) return 1;
  char what[200];
  uint32_t g, w;
  memcpy(&g, &got, 4);
  memcpy(&w, &want, 4);
  snprintf(what, sizeof what, "got %a (0x%08" PRIx32 ") want %a (0x%08" PRIx32 ")",
           (double)got, g, (double)want, w);
  va_list ap;
  va_start(ap, fmt);
  report_failure(file, line, what, fmt, ap);
  va_end(ap);
  return 0;
}

int bxt_check_status(bx_status got, bx_status want, const char *file,
                     int line, const char *fmt, ...) {
  if (got == want) return 1;
  char what[400];
  snprintf(what, sizeof what, "status %d (%s) want %d (%s); last error \"%s\"",
           (int)got, bx_status_str(got), (int)want, bx_status_str(want),
           bx_last_error());
  va_list ap;
  va_start(ap, fmt);
  report_failure(file, line, what, fmt, ap);
  va_end(ap);
  return 0;
}

void bxt_skip(const char *why) {
  if (!g_skipped) fprintf(stdout, "  skip: %s\n", why);
  g_skipped = 1;
}

int bxt_failures(void) { return g_failures; }

/* ---- random numbers -------------------------------------------------- */
uint64_t bxt_seed(void) { return g_seed; }

void bxt_rng_seed(bxt_rng *r, uint64_t seed) { bx_rng_seed(r, seed); }
void bxt_rng_init(bxt_rng *r) { bx_rng_named(r, g_seed, g_test); }
uint64_t bxt_next(bxt_rng *r) { return bx_rng_next(r); }
uint64_t bxt_below(bxt_rng *r, uint64_t n) { return bx_rng_below(r, n); }
double bxt_uniform(bxt_rng *r) { return bx_rng_uniform(r); }
double bxt_normal(bxt_rng *r) { return bx_rng_normal(r); }

void bxt_shuffle(bxt_rng *r, void *base, size_t n, size_t sz) {
  char tmp[256];
  char *b = base;
  if (sz > sizeof tmp) return;
  for (size_t i = n; i > 1; i--) {
    size_t j = (size_t)bxt_below(r, i);
    memcpy(tmp, b + (i - 1) * sz, sz);
    memcpy(b + (i - 1) * sz, b + j * sz, sz);
    memcpy(b + j * sz, tmp, sz);
  }
}

/* ---- ISAs ------------------------------------------------------------ */
static const char *g_isas[4];
static int g_nisas;

int bxt_isa_count(void) { return g_nisas; }
const char *bxt_isa(int i) { return g_isas[i]; }

int bxt_force(int i) {
  if (i < 0) return bx_force_isa(NULL) == BX_OK;
  return bx_force_isa(g_isas[i]) == BX_OK;
}

static void find_isas(void) {
  static const char *all[4] = {"portable", "avx2", "avx512", "avx512-pf1"};
  for (int i = 0; i < 4; i++)
    if (bx_force_isa(all[i]) == BX_OK) g_isas[g_nisas++] = all[i];
  bx_force_isa(NULL);
}

/* Is name in the comma-separated list (exact names)? */
static int in_list(const char *list, const char *name) {
  size_t len = strlen(name);
  for (const char *p = list; p && *p;) {
    const char *end = strchr(p, ',');
    size_t n = end ? (size_t)(end - p) : strlen(p);
    if (n == len && strncmp(p, name, n) == 0) return 1;
    p = end ? end + 1 : NULL;
  }
  return 0;
}

/* ---- main ------------------------------------------------------------ */
int main(int argc, char **argv) {
  const char *filter = NULL;
  const char *env = getenv("BX_TEST_SEED");
  if (env && *env) g_seed = strtoull(env, NULL, 0);
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--list") == 0) {
      for (size_t t = 0; t < NTESTS; t++) printf("%s\n", TESTS[t].name);
      return 0;
    }
    filter = argv[i];
  }
  setvbuf(stdout, NULL, _IOLBF, 0);
  find_isas();
  printf("bx_tests: seed %" PRIu64 " (set BX_TEST_SEED to replay), ISAs:",
         g_seed);
  for (int i = 0; i < g_nisas; i++) printf(" %s", g_isas[i]);
  printf(" (automatic: %s)\n", bx_isa_name());

  int passed = 0, failed = 0, skipped = 0;
  const char *skip_list = getenv("BX_TEST_SKIP");
  for (size_t t = 0; t < NTESTS; t++) {
    if (filter && !strstr(TESTS[t].name, filter)) continue;
    if (in_list(skip_list, TESTS[t].name)) {
      skipped++;
      printf("[SKIP] %s (BX_TEST_SKIP)\n", TESTS[t].name);
      continue;
    }
    g_test = TESTS[t].name;
    g_failures = 0;
    g_skipped = 0;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    long inexact = ref_inexact_events;
    TESTS[t].fn();
    clock_gettime(CLOCK_MONOTONIC, &t1);
    /* the reference itself must have stayed exact */
    CHECK(ref_inexact_events == inexact, "the MPFR reference lost exactness %ld time(s)",
          ref_inexact_events - inexact);
    bx_force_isa(NULL); /* a test may have forced one */
    double secs = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    if (g_failures) {
      failed++;
      printf("[FAIL] %s: %d failed check(s) (%.2fs); replay: BX_TEST_SEED=%" PRIu64
             " bx_tests %s\n",
             g_test, g_failures, secs, g_seed, g_test);
    } else if (g_skipped) {
      skipped++;
      printf("[SKIP] %s\n", g_test);
    } else {
      passed++;
      printf("[ OK ] %s (%.2fs)\n", g_test, secs);
    }
  }
  g_test = NULL;
  mpfr_free_cache();
  if (skipped)
    printf("%d passed, %d failed, %d skipped\n", passed, failed, skipped);
  else
    printf("%d passed, %d failed\n", passed, failed);
  return failed ? 1 : 0;
}
