/*
 * train_trace.h — `bitexact train --trace FILE` (docs/trace.md, format
 * version 1): per step, the XXH3-64 of every module output and module
 * input gradient, one entry per global sequence, then every parameter's
 * gradient (before clipping) and updated value, in the canonical order of
 * python/bitexact/_trace.py's writer, so the file is byte for byte the one
 * the torch and Paddle trainers write (python -m bitexact.train --trace)
 * and the same on every layout (threads, micro-batches, ranks, expert
 * parallelism: rank 0 gathers the other ranks' entries and writes).
 *
 * --dump KEY ("STEP/PHASE/MODULE/WHAT/SLICE", SLICE a sequence or "-")
 * also writes that one entry's values to FILE.dump.safetensors (by the
 * rank that computes it). Test hook: the environment variable
 * BITEXACT_TRACE_PLANT="KEY/ELEMENT" moves that element of that module's
 * live output (or input gradient) one ULP up before it is hashed, so the
 * run goes on from the changed value (tests/cli: the planted change is
 * found at exactly that module and element). One thread; not the library.
 */
#ifndef BX_CLI_TRAIN_TRACE_H
#define BX_CLI_TRAIN_TRACE_H

#include <stddef.h>
#include <stdint.h>

#include "bitexact.h"
#include "glm_config.h"
#include "train_model.h"

typedef struct tt_trace tt_trace;

/* A trace into path (rank 0 creates it and writes the header; the other
 * ranks only compute their entries). model: the model id (tt_model_id);
 * dump: a key or NULL; seq_len: L. NULL with err (path not writable, out
 * of memory, a bad BITEXACT_TRACE_PLANT). */
tt_trace *tt_open(const char *path, const char *model, const char *dump, int64_t seq_len, int rank,
                  char *err, size_t errlen);
/* The model's hook (tr_run_opts.trace). */
const tr_trace *tt_hook(tt_trace *t);
/* The step the next entries belong to. */
void tt_begin_step(tt_trace *t, int64_t step);
/* A whole tensor's entry: phase 1 (backward) or 2 (optimizer), what
 * "grad" or "param", order: its index in the model's parameter list (the
 * same on every rank). 0 / -1 (out of memory). */
int tt_tensor(tt_trace *t, int phase, const char *name, const char *what, int64_t order,
              const float *x, int ndim, const int64_t *shape);
/* Ends the step: every rank calls it; rank 0 gathers the entries of ranks
 * 1 .. P-1 (comm: the agreement; NULL with one rank), sorts them and
 * writes the step's lines. 0 / -1 with err (the same on every rank). */
int tt_end_step(tt_trace *t, int P, const bx_comm *comm, char *err, size_t errlen);
/* Closes the file (rank 0); 0 / -1 when a write failed. */
int tt_close(tt_trace *t);

/* The model id of the header: "Glm4MoeForCausalLM:" and the XXH3-64 of
 * "name:d0,d1;" over the parameters in order (what
 * bitexact.torch.trace's default id gives the same model), then ":" and
 * the XXH3-64 of the config fields no shape shows (tt_config_text), so
 * `bitexact diff --trace` refuses traces of other configs. out holds 64
 * bytes. */
void tt_model_id(const char *const *names, const int *ndims, const int64_t *const *shapes, size_t n,
                 const tr_config *cfg, char *out, size_t outlen);
/* "partial_rotary_factor=X;rope_theta=X;rms_norm_eps=X;num_experts_per_tok=N;
 * n_group=N;topk_group=N;norm_topk_prob=B;routed_scaling_factor=X;" (X: float.hex,
 * B: 0 or 1): what python -m bitexact.train hashes alike. */
void tt_config_text(const tr_config *cfg, char *out, size_t outlen);

#endif /* BX_CLI_TRAIN_TRACE_H */
