/*
 * train_config_tiny.c — the built-in tiny config of `bitexact train`
 * (train_config.h): GLM-4.5-Air-like in miniature. 2 layers (the first
 * dense, the second MoE), 8 routed experts top-2 in 2 groups (1 kept),
 * 1 shared expert, GQA 4 query / 2 key-value heads of 32 with partial
 * RoPE (factor 0.5) and q/k/v bias, vocabulary 1024. A step of global
 * batch 8 x seq 64 runs well under a second on one core.
 */
#include <string.h>

#include "train_config.h"

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
