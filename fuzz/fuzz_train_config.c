/*
 * fuzz_train_config.c — libFuzzer harness for the config.json reader of
 * `bitexact train --config` (src/cli/train_config.c, tr_config_parse):
 * any byte string gives either a config that passes every range check or
 * a one-line error naming the field — no crash, no leak, no overread
 * (ASan, UBSan). On success: the range checks hold (tr_config_check
 * agrees), the parameter count is within the limit, and the config saved
 * to a file reads back identical (every 64th accepted input, to keep the
 * file system out of the way).
 *
 * Input: the JSON text (no prefix byte).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "train_config.h"

#define CHECK(c)                 \
  do {                           \
    if (!(c)) __builtin_trap();  \
  } while (0)

static int same(const tr_config *a, const tr_config *b) {
  return a->vocab_size == b->vocab_size && a->hidden_size == b->hidden_size &&
         a->head_dim == b->head_dim && a->num_key_value_heads == b->num_key_value_heads &&
         a->n_routed_experts == b->n_routed_experts && a->n_group == b->n_group &&
         a->topk_group == b->topk_group && a->num_experts_per_tok == b->num_experts_per_tok &&
         a->rope_theta == b->rope_theta && a->partial_rotary_factor == b->partial_rotary_factor &&
         a->rms_norm_eps == b->rms_norm_eps && a->routed_scaling_factor == b->routed_scaling_factor &&
         a->initializer_range == b->initializer_range && a->attention_bias == b->attention_bias &&
         a->use_qk_norm == b->use_qk_norm && a->norm_topk_prob == b->norm_topk_prob &&
         a->first_k_dense_replace == b->first_k_dense_replace &&
         strcmp(a->hidden_act, b->hidden_act) == 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static unsigned accepted;
  if (size > (1u << 16)) return 0;
  char *text = malloc(size ? size : 1);
  if (!text) return 0;
  memcpy(text, data, size);
  tr_config c;
  char err[512];
  memset(err, 0, sizeof err);
  if (tr_config_parse(text, size, &c, err, sizeof err) == 0) {
    CHECK(tr_config_check(&c, err, sizeof err) == 0);
    CHECK(tr_config_param_count(&c) <= ((int64_t)1 << 32));
    CHECK(c.num_attention_heads % c.num_key_value_heads == 0);
    CHECK(c.n_routed_experts % c.n_group == 0 && c.topk_group <= c.n_group);
    if (accepted++ % 64 == 0) {
      char path[64];
      snprintf(path, sizeof path, "/tmp/fuzz_train_config.%d.json", (int)getpid());
      tr_config back;
      CHECK(tr_config_save(&c, path, err, sizeof err) == 0);
      CHECK(tr_config_load(path, &back, err, sizeof err) == 0);
      CHECK(same(&c, &back));
      unlink(path);
    }
  } else {
    CHECK(memchr(err, 0, sizeof err) != NULL && err[0] != 0);
    CHECK(strchr(err, '\n') == NULL);
  }
  free(text);
  return 0;
}
