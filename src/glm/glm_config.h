/*
 * glm_config.h — the model configuration of the GLM-4.5 model module
 * (DESIGN §10): the fields of Hugging Face transformers' Glm4MoeConfig that
 * the GLM-4.5 MoE decoder uses, under their config.json names; the
 * built-in tiny config, Glm4MoeConfig's defaults, the one range checker
 * and the parameter count. No JSON here: the command reads and writes
 * config.json (src/cli/train_config.c).
 */
#ifndef BX_GLM_CONFIG_H
#define BX_GLM_CONFIG_H

#include <stddef.h>
#include <stdint.h>

typedef struct tr_config {
  /* sizes */
  int64_t vocab_size;
  int64_t hidden_size;
  int64_t intermediate_size;      /* the dense MLP of the first layers */
  int64_t moe_intermediate_size;  /* each routed expert (and each shared one) */
  int64_t num_hidden_layers;
  int64_t num_attention_heads;
  int64_t num_key_value_heads;
  int64_t head_dim;
  int64_t max_position_embeddings;
  /* attention */
  int attention_bias;             /* q/k/v projections with bias */
  int use_qk_norm;
  double partial_rotary_factor;   /* rotary_dim = int(head_dim * factor) */
  double rope_theta;
  double rms_norm_eps;
  /* MoE */
  int64_t first_k_dense_replace;  /* layers [0, k) dense, the rest MoE */
  int64_t n_routed_experts;
  int64_t num_experts_per_tok;
  int64_t n_shared_experts;
  int64_t n_group;
  int64_t topk_group;
  int norm_topk_prob;
  double routed_scaling_factor;
  /* init and the rest (written to config.json as transformers expects) */
  double initializer_range;
  int tie_word_embeddings;        /* must be 0: the LM head is untied */
  char hidden_act[16];            /* "silu" only */
} tr_config;

/* The built-in tiny config (GLM-4.5-Air-tiny-like: 2 layers, the first
 * dense, 8 routed experts top-2 in 2 groups, 1 shared, GQA with partial
 * RoPE and q/k/v bias, a small vocabulary). */
void tr_config_tiny(tr_config *c);

/* Glm4MoeConfig's defaults (transformers 4.54+): what a config.json field
 * that is absent means. head_dim 0 = derived (hidden_size / heads). */
void tr_config_defaults(tr_config *c);

/* Range checks of every field (the one checker: config.json and the
 * built-in config alike). 0 on success; -1 with a one-line reason in err. */
int tr_config_check(const tr_config *c, char *err, size_t errlen);

/* The number of parameters (INT64_MAX on overflow). */
int64_t tr_config_param_count(const tr_config *c);

#endif /* BX_GLM_CONFIG_H */
