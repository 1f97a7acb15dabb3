/*
 * fuzz_ckpt_index.c — libFuzzer harness for the sharded checkpoint reader
 * of `bitexact train --init-from` / `--resume` (src/cli/ckpt_model.c): the
 * model.safetensors.index.json parser (ck_index_parse) and the cross-check
 * of an index with its shards (ck_index_check), plus the
 * --save-max-shard-size parser (ck_parse_size). Any byte string gives
 * either a checked result or a one-line error — no crash, no leak, no
 * overread (ASan, UBSan), and no silent acceptance: an accepted index and
 * its shards name each tensor exactly once, in the shard the index says.
 *
 * Input: INDEX-JSON "\0" HEADER-1 "\0" HEADER-2 ... (at most 4 shards):
 * shard k is a safetensors file made of HEADER-k (the harness adds the
 * 8-byte length) and 64 data bytes, and stands for the index's k-th file
 * (its files sorted); an index naming more files than shards given is
 * not checked further (a missing file).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt_model.h"

#define CHECK(c)                 \
  do {                           \
    if (!(c)) __builtin_trap();  \
  } while (0)

#define MAX_SHARDS 4
#define DATA_BYTES 64

static void one_line(const char *err, size_t len) {
  CHECK(memchr(err, 0, len) != NULL && err[0] != 0);
  CHECK(strchr(err, '\n') == NULL);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size > (1u << 16)) return 0;
  char err[512];
  /* the size parser on a short prefix */
  char sz[32];
  size_t sl = size < sizeof sz - 1 ? size : sizeof sz - 1;
  memcpy(sz, data, sl);
  sz[sl] = 0;
  uint64_t v = 0;
  if (ck_parse_size(sz, &v) == 0) CHECK(v > 0);

  const uint8_t *seg[1 + MAX_SHARDS];
  size_t seglen[1 + MAX_SHARDS], nseg = 0, at = 0;
  while (nseg < 1 + MAX_SHARDS && at <= size) {
    const uint8_t *z = memchr(data + at, 0, size - at);
    size_t end = z ? (size_t)(z - data) : size;
    seg[nseg] = data + at;
    seglen[nseg++] = end - at;
    at = end + 1;
    if (!z) break;
  }
  ck_index ix;
  memset(err, 0, sizeof err);
  if (ck_index_parse((const char *)seg[0], seglen[0], &ix, err, sizeof err) != 0) {
    one_line(err, sizeof err);
    return 0;
  }
  CHECK(ix.count >= 1 && ix.nfiles >= 1 && ix.nfiles <= ix.count);
  for (size_t i = 0; i < ix.count; i++) {
    CHECK(ix.file_of[i] < ix.nfiles);
    if (i) CHECK(strcmp(ix.names[i - 1], ix.names[i]) < 0);
  }
  for (size_t k = 0; k < ix.nfiles; k++) {
    size_t n = strlen(ix.files[k]);
    CHECK(n >= 12 && strcmp(ix.files[k] + n - 12, ".safetensors") == 0 && !strchr(ix.files[k], '/'));
    if (k) CHECK(strcmp(ix.files[k - 1], ix.files[k]) < 0);
  }
  size_t nshards = nseg - 1;
  if (ix.nfiles > nshards) { /* a shard the index names is missing */
    ck_index_free(&ix);
    return 0;
  }
  st_file sh[MAX_SHARDS];
  uint8_t *bytes[MAX_SHARDS];
  memset(sh, 0, sizeof sh);
  memset(bytes, 0, sizeof bytes);
  int ok = 1;
  for (size_t k = 0; k < ix.nfiles; k++) {
    size_t hl = seglen[1 + k], n = 8 + hl + DATA_BYTES;
    bytes[k] = malloc(n);
    if (!bytes[k]) {
      ok = 0;
      break;
    }
    for (int b = 0; b < 8; b++) bytes[k][b] = (uint8_t)((uint64_t)hl >> (8 * b));
    memcpy(bytes[k] + 8, seg[1 + k], hl);
    memset(bytes[k] + 8 + hl, 0x3f, DATA_BYTES);
    if (st_parse(bytes[k], n, &sh[k], err, sizeof err) != 0) {
      ok = 0;
      break;
    }
  }
  if (ok) {
    memset(err, 0, sizeof err);
    if (ck_index_check(&ix, sh, err, sizeof err) == 0) {
      size_t total = 0;
      for (size_t k = 0; k < ix.nfiles; k++) total += sh[k].count;
      CHECK(total == ix.count); /* each name exactly once */
      for (size_t i = 0; i < ix.count; i++)
        CHECK(st_find(&sh[ix.file_of[i]], ix.names[i], strlen(ix.names[i])) != NULL);
    } else {
      one_line(err, sizeof err);
    }
  }
  for (size_t k = 0; k < MAX_SHARDS; k++) {
    st_close(&sh[k]);
    free(bytes[k]);
  }
  ck_index_free(&ix);
  return 0;
}
