/*
 * glm_config.c — the model configuration (glm_config.h): Glm4MoeConfig's
 * defaults, the range checks, the parameter count, and the built-in tiny
 * config of `bitexact train`: GLM-4.5-Air-like in miniature. 2 layers (the first
 * dense, the second MoE), 8 routed experts top-2 in 2 groups (1 kept),
 * 1 shared expert, GQA 4 query / 2 key-value heads of 32 with partial
 * RoPE (factor 0.5) and q/k/v bias, vocabulary 1024. A step of global
 * batch 8 x seq 64 runs well under a second on one core.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "errbuf.h"
#include "glm_config.h"

void tr_config_tiny(tr_config *c) {
  memset(c, 0, sizeof *c);
  c->vocab_size = 1024;
  c->hidden_size = 128;
  c->intermediate_size = 384;
  c->moe_intermediate_size = 64;
  c->num_hidden_layers = 2;
  c->num_attention_heads = 4;
  c->num_key_value_heads = 2;
  c->head_dim = 32;
  c->max_position_embeddings = 4096;
  c->attention_bias = 1;
  c->use_qk_norm = 0;
  c->partial_rotary_factor = 0.5;
  c->rope_theta = 1000000.0;
  c->rms_norm_eps = 1e-5;
  c->first_k_dense_replace = 1;
  c->n_routed_experts = 8;
  c->num_experts_per_tok = 2;
  c->n_shared_experts = 1;
  c->n_group = 2;
  c->topk_group = 1;
  c->norm_topk_prob = 1;
  c->routed_scaling_factor = 1.0;
  c->initializer_range = 0.02;
  c->tie_word_embeddings = 0;
  strcpy(c->hidden_act, "silu");
}

/* Glm4MoeConfig's defaults (transformers 4.54+). head_dim 0 = derived. */
void tr_config_defaults(tr_config *c) {
  memset(c, 0, sizeof *c);
  c->vocab_size = 151552;
  c->hidden_size = 4096;
  c->intermediate_size = 10944;
  c->moe_intermediate_size = 1408;
  c->num_hidden_layers = 46;
  c->num_attention_heads = 96;
  c->num_key_value_heads = 8;
  c->head_dim = 0;
  c->max_position_embeddings = 131072;
  c->attention_bias = 0;
  c->use_qk_norm = 0;
  c->partial_rotary_factor = 0.5;
  c->rope_theta = 10000.0;
  c->rms_norm_eps = 1e-5;
  c->first_k_dense_replace = 1;
  c->n_routed_experts = 128;
  c->num_experts_per_tok = 8;
  c->n_shared_experts = 1;
  c->n_group = 1;
  c->topk_group = 1;
  c->norm_topk_prob = 1;
  c->routed_scaling_factor = 1.0;
  c->initializer_range = 0.02;
  c->tie_word_embeddings = 0;
  snprintf(c->hidden_act, sizeof c->hidden_act, "silu");
}

/* ---- range checks ----------------------------------------------------- */

#define TR_MAX_PARAMS ((int64_t)1 << 32)

static int range(const char *key, int64_t v, int64_t lo, int64_t hi, char *err, size_t errlen) {
  if (v < lo || v > hi)
    return cli_errf(err, errlen, "%s: %lld is out of range [%lld, %lld]", key, (long long)v,
                 (long long)lo, (long long)hi);
  return 0;
}

/* a += x * y with overflow to INT64_MAX */
static void acc(int64_t *a, int64_t x, int64_t y) {
  int64_t p;
  if (__builtin_mul_overflow(x, y, &p) || __builtin_add_overflow(*a, p, a)) *a = INT64_MAX;
}

int64_t tr_config_param_count(const tr_config *c) {
  int64_t n = 0, H = c->hidden_size, hd = c->head_dim, E = c->n_routed_experts;
  int64_t q = c->num_attention_heads * hd, kv = c->num_key_value_heads * hd;
  acc(&n, 2 * c->vocab_size, H); /* embed_tokens, lm_head */
  acc(&n, H, 1);                 /* model.norm */
  int64_t layer = 0;
  acc(&layer, 2, H);
  acc(&layer, q + 2 * kv, H);
  acc(&layer, H, q);
  if (c->attention_bias) acc(&layer, q + 2 * kv, 1);
  if (c->use_qk_norm) acc(&layer, 2, hd);
  int64_t dense = layer, moe = layer;
  acc(&dense, 3 * H, c->intermediate_size);
  acc(&moe, E, H + 1); /* router and its bias buffer */
  acc(&moe, 3 * H, c->moe_intermediate_size * (E + c->n_shared_experts));
  acc(&n, dense, c->first_k_dense_replace);
  acc(&n, moe, c->num_hidden_layers - c->first_k_dense_replace);
  return n;
}

int tr_config_check(const tr_config *c, char *err, size_t errlen) {
  const int64_t M = (int64_t)1 << 20;
  if (range("vocab_size", c->vocab_size, 2, (int64_t)1 << 24, err, errlen) ||
      range("hidden_size", c->hidden_size, 1, 65536, err, errlen) ||
      range("intermediate_size", c->intermediate_size, 1, M, err, errlen) ||
      range("moe_intermediate_size", c->moe_intermediate_size, 1, M, err, errlen) ||
      range("num_hidden_layers", c->num_hidden_layers, 1, 1024, err, errlen) ||
      range("num_attention_heads", c->num_attention_heads, 1, 1024, err, errlen) ||
      range("num_key_value_heads", c->num_key_value_heads, 1, c->num_attention_heads, err,
            errlen) ||
      range("head_dim", c->head_dim, 1, 4096, err, errlen) ||
      range("max_position_embeddings", c->max_position_embeddings, 1, (int64_t)1 << 24, err,
            errlen) ||
      range("first_k_dense_replace", c->first_k_dense_replace, 0, c->num_hidden_layers, err,
            errlen) ||
      range("n_routed_experts", c->n_routed_experts, 1, 4096, err, errlen) ||
      range("num_experts_per_tok", c->num_experts_per_tok, 1, c->n_routed_experts, err, errlen) ||
      range("n_shared_experts", c->n_shared_experts, 0, 64, err, errlen) ||
      range("n_group", c->n_group, 1, c->n_routed_experts, err, errlen) ||
      range("topk_group", c->topk_group, 1, c->n_group, err, errlen))
    return -1;
  if (c->num_attention_heads % c->num_key_value_heads != 0)
    return cli_errf(err, errlen,
                 "num_attention_heads: %lld is not a multiple of num_key_value_heads (%lld)",
                 (long long)c->num_attention_heads, (long long)c->num_key_value_heads);
  if (c->n_routed_experts % c->n_group != 0)
    return cli_errf(err, errlen, "n_routed_experts: %lld is not a multiple of n_group (%lld)",
                 (long long)c->n_routed_experts, (long long)c->n_group);
  int64_t per_group = c->n_routed_experts / c->n_group;
  if (c->num_experts_per_tok > c->topk_group * per_group)
    return cli_errf(err, errlen,
                 "num_experts_per_tok: %lld exceeds topk_group (%lld) x experts per group (%lld)",
                 (long long)c->num_experts_per_tok, (long long)c->topk_group,
                 (long long)per_group);
  if (c->n_group > 1 && per_group < 2)
    return cli_errf(err, errlen,
                 "n_group: %lld groups of %lld expert leave no top-2 score per group (transformers "
                 "scores a group by its top-2 experts)",
                 (long long)c->n_group, (long long)per_group);
  if (!(c->partial_rotary_factor > 0 && c->partial_rotary_factor <= 1))
    return cli_errf(err, errlen, "partial_rotary_factor: %.17g is out of range (0, 1]",
                 c->partial_rotary_factor);
  int64_t rot = (int64_t)((double)c->head_dim * c->partial_rotary_factor);
  if (rot < 2 || rot % 2 != 0)
    return cli_errf(err, errlen,
                 "partial_rotary_factor: %.17g gives a rotary dimension int(head_dim %lld x "
                 "factor) = %lld, which must be even and >= 2",
                 c->partial_rotary_factor, (long long)c->head_dim, (long long)rot);
  if (!(c->rope_theta > 1 && isfinite(c->rope_theta)))
    return cli_errf(err, errlen, "rope_theta: %.17g must be finite and > 1", c->rope_theta);
  if (!(c->rms_norm_eps > 0 && c->rms_norm_eps < 1))
    return cli_errf(err, errlen, "rms_norm_eps: %.17g is out of range (0, 1)", c->rms_norm_eps);
  if (!(c->routed_scaling_factor > 0 && c->routed_scaling_factor <= 1e6))
    return cli_errf(err, errlen, "routed_scaling_factor: %.17g is out of range (0, 1e6]",
                 c->routed_scaling_factor);
  if (!(c->initializer_range >= 0 && c->initializer_range <= 10))
    return cli_errf(err, errlen, "initializer_range: %.17g is out of range [0, 10]",
                 c->initializer_range);
  if (c->tie_word_embeddings)
    return cli_errf(err, errlen, "tie_word_embeddings: true is not supported (the LM head is untied)");
  if (strcmp(c->hidden_act, "silu") != 0)
    return cli_errf(err, errlen, "hidden_act: \"%.15s\" is not supported (only \"silu\")",
                 c->hidden_act);
  int64_t n = tr_config_param_count(c);
  if (n > TR_MAX_PARAMS)
    return cli_errf(err, errlen,
                 "the model has %lld parameters, beyond this trainer's limit of %lld (absent "
                 "fields take Glm4MoeConfig's full-size defaults)",
                 (long long)n, (long long)TR_MAX_PARAMS);
  return 0;
}
