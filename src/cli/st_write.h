/*
 * st_write.h — a safetensors file of F32 tensors written deterministically:
 * tensors in bytewise order of their names, each right after the previous
 * one, the header compact JSON with sorted keys ({"__metadata__":
 * {"format": "pt"}}), padded with spaces to a multiple of 8 bytes; synced.
 * So the bytes depend only on the names, shapes and values.
 */
#ifndef BX_CLI_ST_WRITE_H
#define BX_CLI_ST_WRITE_H

#include <stddef.h>
#include <stdint.h>

/* One tensor to write (F32). */
typedef struct tc_tensor {
  const char *name;
  int ndim;
  const int64_t *shape;
  int64_t numel;
  const float *data;
} tc_tensor;

/* Writes a safetensors file of n F32 tensors (sorted by name; names must
 * be unique). 0 / -1 with err. */
int tc_write_safetensors(const char *path, const tc_tensor *t, size_t n, char *err, size_t errlen);

#endif /* BX_CLI_ST_WRITE_H */
