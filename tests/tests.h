/*
 * tests.h — the prototype of every test (the table lives in main.c).
 */
#ifndef BX_TEST_TESTS_H
#define BX_TEST_TESTS_H

/* test_ref.c: the reference checks itself against the hardware */
void test_ref_decode_16bit(void);
void test_ref_round_vs_hardware(void);
void test_ref_float_to_half_conversions(void);
void test_ref_exactness(void);

/* test_isa.c */
void test_isa_force_and_names(void);

/* test_acc.c */
void test_acc_init_and_layout(void);
void test_acc_wire_format_positions(void);
void test_acc_random_gradients(void);
void test_acc_random_bits(void);
void test_acc_adversarial_fp32(void);
void test_acc_adversarial_fp64(void);
void test_acc_adversarial_16bit(void);
void test_acc_tiny_runs(void);

/* test_ties.c */
void test_acc_ties_value(void);
void test_acc_ties_sqrt(void);
void test_acc_ties_abs(void);
void test_acc_nonfinite_counters(void);
void test_acc_large_chunks(void);
void test_acc_views_and_shapes(void);
void test_acc_bad_tensor_leaves_acc(void);
void test_acc_negative_words(void);
void test_acc_random_words(void);
void test_acc_compare(void);
void test_acc_misaligned_data(void);

/* test_merge.c */
void test_merge_partitions_by_hand(void);
void test_merge_random_order(void);
void test_merge_many_accumulators(void);
void test_acc_check_versions(void);

/* test_norm.c */
void test_norm_p2_groups(void);
void test_norm_p1(void);
void test_norm_pinf_and_neginf(void);
void test_norm_p0(void);
void test_norm_other_p(void);
void test_norm_nan_inf_rules(void);
void test_norm_error_if_nonfinite(void);
void test_norm_megatron(void);
void test_norm_megatron_overflow(void);
void test_norm_empty_inputs(void);
void test_norm_null_opts_and_defaults(void);
void test_norm_comm(void);
void test_norm_many_groups(void);

/* test_invariance.c */
void test_invariance_p2(void);
void test_invariance_all_p(void);
void test_invariance_split_views(void);
void test_invariance_acc_isa_words(void);
void test_concurrent_callers(void);
void test_threads_extreme(void);

/* test_ranks.c */
void test_ranks_invariance(void);
void test_ranks_clip(void);
void test_ranks_errors(void);


/* test_scale.c */
void test_scale_torch_formula(void);
void test_scale_exact_vs_mpfr(void);
void test_scale_exact_ties(void);
void test_scale_exact_subnormal_results(void);
void test_scale_exact_near_ties(void);
void test_scale_special_coefs(void);
void test_scale_signed_zeros(void);
void test_scale_threads_and_mix(void);

/* test_clip.c */
void test_clip_coef_formulas(void);
void test_clip_grad_norm_torch(void);
void test_clip_grad_norm_max_formula(void);
void test_clip_max_norm_zero(void);
void test_clip_bad_max_norm(void);
void test_clip_nonfinite_total(void);
void test_clip_threads(void);
void test_clip_all_or_nothing(void);

/* test_errors.c */
void test_errors_status_and_version(void);
void test_errors_null_pointers(void);
void test_errors_dtypes(void);
void test_errors_devices(void);
void test_errors_shapes(void);
void test_errors_layouts(void);
void test_errors_bad_p(void);
void test_errors_scale_overlap(void);
void test_errors_scale_bad_input(void);
void test_errors_last_error_thread_local(void);

/* test_train_cuda_sim.c */
void test_train_cuda_sim_swiglu(void);
void test_train_cuda_sim_adamw(void);
void test_train_cuda_sim_rmsnorm(void);
void test_train_cuda_sim_rope(void);
void test_train_cuda_sim_gemm(void);
/* test_train_cuda_sim_moe.c */
void test_train_cuda_sim_router(void);
void test_train_cuda_sim_permute(void);
void test_train_cuda_sim_embedding(void);
void test_train_cuda_sim_xent(void);
void test_train_cuda_dispatch_moe(void);
/* test_train_cuda_sim_tokred.c */
void test_train_cuda_sim_tokred(void);
void test_train_cuda_sim_wgrad(void);
void test_train_cuda_dispatch(void);
/* test_train_device.c */
void test_train_alloc(void);
void test_train_device_finish(void);
void test_train_device_sim(void);
/* test_train_device_sweep.c */
void test_train_device_sweep(void);
/* test_train_cuda_sim_math.c */
void test_train_cuda_sim_math(void);
void test_train_cuda_sim_rope_table(void);
void test_train_cuda_sim_bias_partials(void);
/* test_train_cuda_sim_attn.c */
void test_train_cuda_sim_attention_fwd(void);
void test_train_cuda_sim_attention_bwd(void);
void test_train_cuda_sim_attention_dispatch(void);
/* test_cuda_sim.c */
void test_cuda_sim_squares(void);
void test_cuda_sim_abs(void);
void test_cuda_sim_megatron(void);
void test_cuda_sim_pow(void);
void test_cuda_sim_adversarial(void);
void test_cuda_refused_without_device(void);
void test_device_comm_local_failure_agreed(void);
void test_device_comm_tokred(void);
void test_cuda_sim_finish(void);
void test_cuda_sim_store_rounding(void);

/* test_kernels.c */
void test_kernels_driver_paths(void);
void test_kernels_special_near_block_ends(void);
void test_kernels_f64_bins_flush(void);
void test_kernels_hostile_fpenv(void);
void test_kernels_dispatch_reason(void);
void test_kernels_micro_tables(void);

/* test_pow_det.c */
void test_pow_det_special(void);
void test_pow_det_random(void);
void test_pow_det_edges(void);
void test_pow_det_roots(void);
void test_pow_det_flush_to_zero(void);

/* test_math.c */
void test_math_vs_mpfr(void);
void test_math_tensor_invariance(void);
void test_math_errors(void);
void test_round_bf16(void);

/* test_lr.c */
void test_lr_schedule_vs_mpfr(void);
void test_lr_schedule_errors(void);

/* test_adamw.c */
void test_adamw_vs_reference(void);
void test_adamw_threads_and_isa(void);
void test_adamw_errors(void);

/* test_fpenv.c */
void test_fpenv_subnormal_counts(void);
void test_fpenv_callback_sees_caller(void);
void test_fpenv_public_api(void);

/* test_calls.c */
void test_fork_after_threads(void);
void test_reentry_from_callback(void);
void test_error_text_not_garbled(void);
void test_success_keeps_last_error(void);
void test_error_locations(void);

/* test_norm_dtype.c */
void test_norm_dtype_vs_mpfr(void);
void test_norm_dtype_grads(void);
void test_norm_info_ranks(void);
void test_acc_norm_rules(void);
void test_norm_many_groups_state(void);
void test_ranks_norm_dtype(void); /* test_ranks.c */

/* test_abi.c */
void test_abi_version(void);
void test_abi_defaults(void);
void test_abi_struct_sizes(void);
void test_abi_old_binary(void);
void test_abi_comm_default(void);

/* test_gemm.c */
void test_gemm_vs_reference(void);
void test_gemm_special_values(void);
void test_gemm_batch_invariance(void);
void test_gemm_layout_invariance(void);
void test_gemm_batched_3d(void);
void test_gemm_empty(void);
void test_gemm_bad_input(void);
/* test_tokred.c: the layout-invariant token reduction (bitexact_train.h) */
void test_tokred_grid_numerics(void);
void test_tokred_vs_exact_reference(void);
void test_tokred_invariance(void);
void test_tokred_stated_flag(void);
void test_tokred_reset(void);
void test_tokred_ordinary_drifts(void);
void test_tokred_layout_refused(void);
void test_tokred_ranks_errors(void);
void test_tokred_bad_arguments(void);
/* test_nan.c: every NaN stored is the canonical pattern (docs/design.md "NaN") */
void test_nan_math_adamw(void);
void test_nan_norm_scale(void);
void test_nan_gemm(void);
void test_nan_layers(void);

/* test_layers.c, test_layers_rope.c: RMSNorm, RoPE, SwiGLU (bitexact_train.h) */
void test_rmsnorm_vs_reference(void);
void test_rmsnorm_batch_invariance(void);
void test_rmsnorm_bad_input(void);
void test_rope_vs_reference(void);
void test_rope_batch_invariance(void);
void test_rope_bad_input(void);
void test_swiglu_vs_reference(void);
void test_swiglu_batch_invariance(void);
void test_swiglu_bad_input(void);
void test_layers_threads_and_isa(void);

/* test_moe.c: the MoE router and token dispatch (bitexact_train.h) */
void test_moe_router_vs_reference(void);
void test_moe_router_ties(void);
void test_moe_router_backward(void);
void test_moe_router_invariance(void);
void test_moe_bias_update(void);
void test_moe_router_bad_input(void);
void test_moe_dispatch_plan(void);
void test_moe_dispatch_ranks(void);
void test_moe_permute_roundtrip(void);
void test_moe_dispatch_bad_input(void);
/* test_attention.c: causal GQA attention (bitexact_train.h) */
void test_attention_vs_reference(void);
void test_attention_reference_gradient(void);
void test_attention_batch_invariance(void);
void test_attention_threads_isa(void);
void test_attention_special_values(void);
void test_attention_bad_input(void);
/* test_attention_tiles.c: the tiling's edges */
void test_attention_tiling_edges(void);
void test_attention_tiling_lanes(void);

/* test_loss.c: embedding and cross-entropy layers (bitexact_train.h) */
void test_loss_embedding(void);
void test_loss_embedding_tokred(void);
void test_loss_xent_vs_reference(void);
void test_loss_xent_special_values(void);
void test_loss_xent_invariance(void);
void test_loss_xent_tokred(void);
void test_loss_bad_input(void);
/* the weight gradient (section gemm): TN views and bad input in
 * test_gemm.c, the segmented TN product, partials, bounds and
 * bx_linear_wgrad in test_wgrad.c, errors and grid kernels in
 * test_wgrad_errors.c */
void test_gemm_tn_chunk_views(void);
void test_gemm_tn_bad_input(void);
void test_gemm_tn_segments(void);
void test_wgrad_bias_partials(void);
void test_wgrad_bound(void);
void test_wgrad_linear(void);
void test_wgrad_bad_input(void);
void test_wgrad_grid_kernels(void);

/* test_math.c: the vector kernels of the elementwise math (section owner: math) */
void test_math_vector_kernels(void);

/* test_strided.c, test_negative_p.c: any strides in norms and scaling;
 * negative norm_type (issue 15) */
void test_strided_norms_random(void);
void test_strided_norms_large(void);
void test_strided_scale_random(void);
void test_strided_scale_large(void);
void test_strided_overlaps(void);
void test_strided_cuda_dense_only(void);
void test_negative_p_vs_mpfr(void);
void test_negative_p_special_values(void);
void test_negative_p_invariance(void);
void test_negative_p_ranks(void);

#endif /* BX_TEST_TESTS_H */
