/*
 * train_ckpt.h — checkpoints of `bitexact train` (DESIGN §10): --save DIR
 * writes, --resume DIR reads back
 *   DIR/config.json          tr_config_save (transformers' config.json)
 *   DIR/model.safetensors    every parameter under its transformers name,
 *                            F32, and the e_score_correction_bias buffers:
 *                            what Glm4MoeForCausalLM.from_pretrained loads
 *                            (or, with --save-max-shard-size, shards
 *                            model-NNNNN-of-NNNNN.safetensors and
 *                            model.safetensors.index.json)
 *   DIR/optimizer/optimizer.safetensors  AdamW state: "NAME.exp_avg",
 *                            "NAME.exp_avg_sq" for every parameter NAME, F32
 *                            (in a subdirectory, where from_pretrained of
 *                            transformers and PaddleFormers does not look;
 *                            --resume reads DIR/optimizer.safetensors, the
 *                            layout before, too)
 *   DIR/trainer_state.json   the run's position and hyperparameters
 * Safetensors files are written deterministically: tensors in bytewise
 * order of their names, each right after the previous one, the header
 * compact JSON with sorted keys ({"__metadata__": {"format": "pt"}}),
 * padded with spaces to a multiple of 8 bytes. So the bytes of a
 * checkpoint depend only on the values (the same for every layout).
 *
 * Atomic: the files are written into a fresh DIR.tmp-XXXXXX beside DIR,
 * synced, and the directory renamed into place (an existing DIR holding
 * only checkpoint files is swapped out and removed); on any error the
 * temporary directory is removed and DIR is as it was.
 */
#ifndef BX_CLI_TRAIN_CKPT_H
#define BX_CLI_TRAIN_CKPT_H

#include <stddef.h>
#include <stdint.h>

#include "st_write.h"
#include "train_config.h"
#include "train_model.h"

/* 2: the grid history (the one-pass step); 1 is still read (no history:
 * the first resumed step runs on its observed grid, two passes). */
#define TC_FORMAT_VERSION 2

/* The trainer's state beside the tensors. Floats are written as hex
 * floats (exact). */
typedef struct tc_state {
  int64_t step;          /* the next step to run (= steps done) */
  uint64_t seed;
  int64_t seq_len, global_batch;
  int shuffle;
  char data_kind[16];    /* "synthetic", "npy", "bin" */
  int64_t data_tokens;   /* N */
  int64_t data_sequences;
  int64_t data_position; /* the next global sequence: step * global_batch */
  double lr, beta1, beta2, eps, weight_decay, clip;
  /* the schedule (lr_schedule in the file; absent before 2026-12-05:
   * "constant", 0, 0, and total_steps = step) */
  char lr_scheduler[24];
  int64_t warmup_steps, total_steps;
  double min_lr;
  char mode[16];         /* "invariant", "ordinary" */
  char compute_dtype[8]; /* "fp32", "bf16" (absent in older checkpoints: "fp32") */
  /* "grid_history": the model's tr_model_history (one exponent per
   * trainable parameter in the params order, then the loss's), NULL/0
   * when there is none (ordinary mode, step 0, format 1). Written as an
   * object {NAME: E, ..., "loss": E}. tc_save borrows it; tc_load
   * allocates it (the caller frees it). */
  int *history;
  size_t nhistory;
} tc_state;

/* Before a run: DIR must be absent (its parent an existing directory) or
 * a directory holding nothing but the checkpoint's files. */
int tc_check_save_dir(const char *dir, char *err, size_t errlen);

/* Writes the checkpoint of the model (params: tr_model_params' list). */
int tc_save(const char *dir, const tr_config *c, const tr_param *params, size_t n,
            const tc_state *st, char *err, size_t errlen);

/* tc_save with the model in shards of at most max_shard_size bytes (a
 * tensor larger than that alone in one) and model.safetensors.index.json,
 * as save_pretrained(max_shard_size=) writes it (train_ckpt_model.h);
 * 0: one model.safetensors. */
int tc_save_shards(const char *dir, const tr_config *c, const tr_param *params, size_t n,
                   const tc_state *st, uint64_t max_shard_size, char *err, size_t errlen);

/* DIR/config.json (read before the model is built). */
int tc_load_config(const char *dir, tr_config *c, char *err, size_t errlen);

/* Reads the tensors and the state of DIR into the model: every name,
 * shape and dtype is checked against params (a missing or extra tensor, a
 * shape or dtype mismatch fails naming it) before anything is copied. */
int tc_load(const char *dir, tr_param *params, size_t n, tc_state *st, char *err, size_t errlen);

#endif /* BX_CLI_TRAIN_CKPT_H */
