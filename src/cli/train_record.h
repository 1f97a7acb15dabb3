/*
 * train_record.h — the run record of `bitexact train --record FILE.jsonl`
 * (DESIGN §10): one JSON object per step, one line each, keys in this
 * order, floats as C99 hex-float strings ("%a": "0x1.62e43p+2"; "nan",
 * "inf", "-inf") so that `bitexact diff A.jsonl B.jsonl` compares them bit
 * for bit:
 *   step              the step index (integer)
 *   loss              the step's loss: mean over its B*L predictions (fp32)
 *   grad_norm         the exact L2 norm of all gradients before clipping
 *   grad_norm_dense   the same over the dense group
 *   grad_norm_expert  the same over the routed experts' group
 *   clip_coef         the coefficient the gradients were scaled by (1: none)
 *   lr                the learning rate of the step
 *   tokens            predictions in the step (B*L, integer)
 *   loss_hash         "xxh3:" + 16 hex digits: XXH3-64 (seed 0) of the B*L
 *                     per-token losses as fp32 little-endian bytes, in
 *                     global token order (sequence s*B+b, position t)
 *   compute_dtype     "fp32" or "bf16": the GEMMs' operand dtype
 *                     (--compute-dtype; fp32 accumulation either way)
 *   passes            forward + backward passes the step ran (1: the grid
 *                     stated from the history held; 2: it did not, or
 *                     there was none, and the step ran on its observed
 *                     grid; ordinary mode: 1): a function of the data
 *   record_format     TREC_FORMAT: 2 since the one-pass step (format 1,
 *                     the two-pass step's records, had no such key)
 *   eval_loss         (steps after which --eval-data was evaluated) the
 *                     exact mean loss over the eval sequences (fp32,
 *                     rounded once), of the model after this step's update
 *   entropy_rate      (synthetic corpus only) the source's entropy rate in
 *                     nats: the loss a perfect model reaches
 */
#ifndef BX_CLI_TRAIN_RECORD_H
#define BX_CLI_TRAIN_RECORD_H

#include <stdint.h>
#include <stdio.h>

typedef struct trec_step {
  int64_t step;
  float loss;
  double grad_norm, norm_dense, norm_expert, clip_coef, lr;
  int64_t tokens;
  uint64_t loss_hash;
  double entropy_rate; /* NaN: not written */
  const char *compute_dtype; /* "fp32" / "bf16" */
  int passes;
  int has_eval;
  float eval_loss;
} trec_step;

#define TREC_FORMAT 2

/* XXH3-64 of n fp32 values as little-endian bytes. */
uint64_t trec_loss_hash(const float *v, size_t n);

/* The line of s (without the newline) into buf. */
void trec_format(const trec_step *s, char *buf, size_t len);

/* Appends the line of s to fp and flushes. 0 / -1. */
int trec_write(FILE *fp, const trec_step *s);

#endif /* BX_CLI_TRAIN_RECORD_H */
