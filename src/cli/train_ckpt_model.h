/*
 * train_ckpt_model.h — the model part of `bitexact train`'s checkpoints
 * (docs/train_cli.md, "Checkpoints"), between a checkpoint directory
 * (ckpt_model.h: one model.safetensors, or shards with
 * model.safetensors.index.json) and the model's tr_param list:
 *   --resume DIR     every parameter and e_score_correction_bias buffer,
 *                    F32 (the bits of the run that saved it);
 *   --init-from DIR  a transformers-style checkpoint (transformers' or
 *                    PaddleFormers' save_pretrained, bitexact's --save):
 *                    F32, BF16 or F16 tensors widened exactly to the fp32
 *                    masters; an absent e_score_correction_bias keeps its
 *                    initial zeros; no NaN or infinity;
 *   --save DIR [--save-max-shard-size SIZE]  one F32 model.safetensors, or
 *                    shards and an index as save_pretrained(max_shard_size=)
 *                    writes them.
 * Every name, shape and dtype is checked before anything is copied; a
 * missing or extra tensor fails naming it.
 */
#ifndef BX_CLI_TRAIN_CKPT_MODEL_H
#define BX_CLI_TRAIN_CKPT_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "ckpt_model.h"
#include "train_model.h"

typedef enum tcm_mode { TCM_RESUME, TCM_INIT } tcm_mode;

/* Checks m against params (n). 0 / -1 with err naming the file and tensor. */
int tcm_check(const ck_model *m, const tr_param *params, size_t n, tcm_mode mode, char *err,
              size_t errlen);

/* Copies (widens) every tensor of m into its parameter (after tcm_check). */
void tcm_copy(const ck_model *m, tr_param *params, size_t n);

/* --init-from DIR: opens, checks and copies DIR's model into params. The
 * AdamW state is left as it is (a fresh model's zeros). */
int tcm_init_from(const char *dir, tr_param *params, size_t n, char *err, size_t errlen);

/* Writes the model into the directory dir (a fresh one): model.safetensors
 * when max_shard_size is 0 or everything fits one shard, else the shards
 * and the index. Tensors are planned in the order of transformers'
 * state_dict (the params order, each e_score_correction_bias right after
 * its router's weight). 0 / -1 with err. */
int tcm_write(const char *dir, const tr_param *params, size_t n, uint64_t max_shard_size,
              char *err, size_t errlen);

/* Whether name is a file a model written by tcm_write may hold:
 * model.safetensors, the index, model-NNNNN-of-NNNNN.safetensors. */
int tcm_is_model_file(const char *name);

#endif /* BX_CLI_TRAIN_CKPT_MODEL_H */
