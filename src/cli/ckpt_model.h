/*
 * ckpt_model.h — the model tensors of a transformers-style checkpoint
 * directory, as `save_pretrained` writes them and `from_pretrained` reads
 * them (src/cli: `bitexact train --init-from`, `--resume`, `--save`):
 *   DIR/model.safetensors                      one file, or
 *   DIR/model.safetensors.index.json           the index of the shards
 *   DIR/model-00001-of-0000N.safetensors ...   {"metadata": {...},
 *                                               "weight_map": {NAME: FILE}}
 * (transformers looks for model.safetensors first; a directory holding
 * both is refused here as ambiguous).
 *
 * Reading validates everything before a caller sees a tensor: each shard
 * with st_parse (safetensors.h); the index with jansson (duplicate names
 * refused, "weight_map" an object of non-empty plain file names ending in
 * ".safetensors", "metadata" an object whose "total_size", when present,
 * is a non-negative integer); then the cross-check: every tensor the index
 * names is in the shard it names, every tensor of every shard is in the
 * index under that shard. So each name has exactly one tensor.
 *
 * Writing: ck_shard_plan splits tensors as huggingface_hub's
 * split_torch_state_dict_into_shards (what save_pretrained(max_shard_size=)
 * calls) does, ck_write_index writes the index as transformers does
 * (json.dumps(index, indent=2, sort_keys=True) + "\n").
 */
#ifndef BX_CLI_CKPT_MODEL_H
#define BX_CLI_CKPT_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "safetensors.h"

#define CK_INDEX_NAME "model.safetensors.index.json"
#define CK_SINGLE_NAME "model.safetensors"
#define CK_MAX_SHARDS 100000
#define CK_MAX_INDEX_BYTES (256u << 20)

/* A parsed index: count tensor names (sorted bytewise), each with the
 * number of its file in files[0..nfiles) (distinct, sorted). */
typedef struct ck_index {
  size_t count;
  char **names;
  size_t *file_of;
  size_t nfiles;
  char **files;
  int has_total_size;
  uint64_t total_size;
} ck_index;

/* Parses an index's bytes. 0, or -1 with a one-line reason in err
 * (nothing to free). */
int ck_index_parse(const char *text, size_t len, ck_index *ix, char *err, size_t errlen);
void ck_index_free(ck_index *ix);

/* The cross-check of an index and its shards (shards[k] is ix->files[k],
 * already parsed). 0 / -1 with err naming the tensor and the file. */
int ck_index_check(const ck_index *ix, const st_file *shards, char *err, size_t errlen);

/* A checkpoint's model tensors. */
typedef struct ck_model {
  int sharded;
  ck_index ix;       /* sharded only */
  size_t nfiles;
  st_file *files;    /* nfiles */
  char **paths;      /* nfiles, for messages */
  char *index_path;  /* sharded: DIR/model.safetensors.index.json (messages) */
} ck_model;

/* Opens DIR's model.safetensors, or its index and every shard the index
 * names. err is one line naming the file (its path). */
int ck_model_open(const char *dir, ck_model *m, char *err, size_t errlen);
void ck_model_close(ck_model *m);

/* The tensor called name, or NULL; *path (if not NULL) its file. */
const st_tensor *ck_model_find(const ck_model *m, const char *name, const char **path);

/* Number of tensors over every file. */
size_t ck_model_count(const ck_model *m);

/* The k-th tensor over all files (k < ck_model_count), with its file. */
const st_tensor *ck_model_tensor(const ck_model *m, size_t k, const char **path);

/* A size as transformers' convert_file_size_to_int reads it: "5GB" (10^9),
 * "500MB", "100KB", "2GiB" (2^30), "MiB", "KiB" (the unit's case is free;
 * a lower-case final "b" means bits: "8Gb" = 1 GB), or plain bytes
 * "1000000". Digits only before the unit; > 0. 0 / -1. */
int ck_parse_size(const char *s, uint64_t *out);

/* Assigns n tensors of bytes[i] (in the order given) to shards as
 * split_torch_state_dict_into_shards: a tensor larger than max gets a shard
 * of its own (appended at once); otherwise it joins the current shard
 * unless that would exceed max, which starts a new one. shard_of[i] gets
 * the shard's number (0-based); returns the number of shards. */
size_t ck_shard_plan(const uint64_t *bytes, size_t n, uint64_t max, size_t *shard_of);

/* "model-%05d-of-%05d.safetensors" of shard k (0-based) of nshards. */
void ck_shard_name(size_t k, size_t nshards, char *buf, size_t len);

/* Writes the index of n tensors (names[i] in shard shard_of[i]) to path,
 * synced: {"metadata": {"total_parameters": P, "total_size": S},
 * "weight_map": {NAME: FILE, ...}}. 0 / -1 with err. */
int ck_write_index(const char *path, const char *const *names, const size_t *shard_of, size_t n,
                   size_t nshards, uint64_t total_size, uint64_t total_parameters, char *err,
                   size_t errlen);

/* Widens a float tensor (F32, BF16 or F16) exactly into out[0..nelem).
 * 0, or -1 for any other dtype. */
int ck_widen_f32(const st_tensor *t, float *out);

#endif /* BX_CLI_CKPT_MODEL_H */
