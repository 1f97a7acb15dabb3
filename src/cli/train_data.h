/*
 * train_data.h — the token data of `bitexact train` and its order
 * (DESIGN §10), so that any tool can recompute the sequences of a step.
 *
 * Sources:
 *   - a .npy file (recognised by its magic "\x93NUMPY"): format version 1,
 *     2 or 3, a 1-D array (shape (N,)), fortran_order False, descr one of
 *     '<i2' '<u2' '<i4' '<u4' '<i8' (little-endian integers); the file
 *     holds exactly the header and N elements;
 *   - a raw little-endian uint16 file (nanoGPT's train.bin), any other
 *     file whose name ends in ".bin": an even number of bytes;
 *   - the built-in synthetic corpus (no --data): TD_SYNTH_TOKENS tokens of
 *     a seeded Markov source with an exactly known entropy rate (below).
 * Every id must lie in [0, vocab_size): the whole file is checked when it
 * is opened, so a bad id is refused before anything runs.
 *
 * Order and the synthetic corpus: src/glm/glm_data.h (pure functions of
 * their counters; this file maps the data and keeps the epoch's
 * permutation).
 */
#ifndef BX_CLI_TRAIN_DATA_H
#define BX_CLI_TRAIN_DATA_H

#include <stddef.h>
#include <stdint.h>

#include "glm_data.h"

#define TD_SYNTH_TOKENS GLM_SYNTH_TOKENS

typedef enum td_kind { TD_SYNTH = 0, TD_NPY = 1, TD_BIN = 2 } td_kind;

/* The element types of a .npy file this reader takes. */
typedef enum td_elem { TD_I2, TD_U2, TD_I4, TD_U4, TD_I8 } td_elem;

/* What td_npy_parse finds in a .npy file. */
typedef struct td_npy {
  int major, minor;      /* format version */
  td_elem elem;
  unsigned elem_size;    /* bytes */
  uint64_t count;        /* N */
  uint64_t data_offset;  /* bytes from the file's start */
} td_npy;

/* Parses the .npy header of bytes[0..size) and checks that the file holds
 * exactly the header and count elements. A pure function of the bytes
 * (fuzz/fuzz_npy.c). 0, or -1 with a one-line reason in err. */
int td_npy_parse(const uint8_t *bytes, uint64_t size, td_npy *out, char *err, size_t errlen);

typedef struct td_data {
  td_kind kind;
  int64_t ntokens;       /* N */
  int64_t seq_len;       /* L */
  int64_t nseq;          /* S = floor((N - 1) / L) */
  int shuffle;
  uint64_t seed;
  double entropy_bits;   /* synthetic corpus: H (else NaN) */
  double entropy_nats;
  /* private */
  td_elem elem;
  unsigned elem_size;
  const uint8_t *elems;  /* the first element (mapped file) */
  void *map;
  size_t map_len;
  int32_t *synth;
  int64_t *perm;
  int64_t perm_epoch;
} td_data;

/* Opens path (NULL: the synthetic corpus), checks every id against vocab
 * and that one whole sequence of seq_len + 1 tokens fits. 0, or -1 with a
 * one-line reason in err (nothing left to free). */
int td_open(td_data *d, const char *path, int64_t vocab, int64_t seq_len, uint64_t seed,
            int shuffle, char *err, size_t errlen);
void td_close(td_data *d);

/* The data sequence of global sequence g (>= 0). -1 if out of memory
 * (the permutation of a new epoch). */
int64_t td_sequence(td_data *d, int64_t g);

/* Tokens [i*L, i*L+L+1) of data sequence i (0 <= i < nseq) into out[L+1]. */
void td_tokens(const td_data *d, int64_t i, int32_t *out);

#endif /* BX_CLI_TRAIN_DATA_H */
