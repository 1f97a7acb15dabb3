/*
 * safetensors.h — a validating reader of safetensors files for the bitexact
 * command (src/cli/). The format: an 8-byte little-endian header length N,
 * N bytes of JSON
 *   {"NAME": {"dtype": "F32", "shape": [2, 3], "data_offsets": [BEGIN, END]},
 *    ..., "__metadata__": {"key": "value", ...}}
 * then the data buffer; offsets are bytes relative to the buffer's start.
 *
 * st_parse() is a pure function of the bytes (it is what fuzz/
 * fuzz_safetensors.c fuzzes); st_open() maps a file read-only and calls it,
 * touching only the header's pages. Every check of the format is made here,
 * before a caller sees a tensor:
 *   - the file holds at least the 8-byte length, and 8 + N <= its size;
 *     N <= 100,000,000 (the limit of the reference implementation);
 *   - the header is one JSON object (jansson: invalid JSON, duplicate keys
 *     and NUL characters in strings are refused);
 *   - every entry has a known dtype, a shape of non-negative integers and
 *     data_offsets [BEGIN, END] with BEGIN <= END <= buffer size;
 *   - END - BEGIN == number of elements x element size (no overflow);
 *   - no two tensors' byte ranges overlap (empty tensors overlap nothing).
 * Gaps between tensors (padding) and bytes after the last one are allowed.
 * Tensors come out sorted by name (bytewise), whatever the file's order.
 */
#ifndef BX_CLI_SAFETENSORS_H
#define BX_CLI_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

/* Every dtype the safetensors format defines (0.8). */
typedef enum st_dtype {
  ST_BOOL, ST_U8, ST_I8, ST_F8_E5M2, ST_F8_E4M3, ST_F8_E8M0, ST_F8_E4M3FNUZ,
  ST_F8_E5M2FNUZ, ST_I16, ST_U16, ST_F16, ST_BF16, ST_I32, ST_U32, ST_F32,
  ST_C64, ST_F64, ST_I64, ST_U64, ST_F4, ST_F6_E2M3, ST_F6_E3M2,
  ST_DTYPE_COUNT
} st_dtype;

typedef enum st_kind {
  ST_KIND_BOOL,    /* one byte, 0 or 1 (other bytes compared as bytes) */
  ST_KIND_UINT,
  ST_KIND_INT,     /* two's complement */
  ST_KIND_FLOAT,   /* sign-magnitude binary float (IEEE-like or fp8) */
  ST_KIND_COMPLEX, /* pairs of fp32 */
  ST_KIND_PACKED   /* sub-byte floats (fp4, fp6): compared as bytes */
} st_kind;

typedef struct st_dtype_info {
  const char *name; /* as written in the header: "F32", "BF16", ... */
  unsigned bits;    /* per element */
  st_kind kind;
} st_dtype_info;

const st_dtype_info *st_dtype_get(st_dtype dt);

typedef struct st_tensor {
  const char *name;     /* NUL-terminated UTF-8 (no NUL inside) */
  size_t name_len;      /* bytes */
  st_dtype dtype;
  size_t ndim;
  const uint64_t *shape;
  uint64_t nelem;       /* product of shape (1 for a scalar) */
  uint64_t begin, end;  /* byte offsets in the data buffer */
  const uint8_t *data;  /* buffer + begin; end - begin bytes */
} st_tensor;

typedef struct st_file {
  const char *path;       /* borrowed (for messages) */
  const uint8_t *bytes;   /* the whole file (mapped by st_open) */
  uint64_t size;          /* bytes */
  uint64_t header_len;    /* N */
  const uint8_t *buffer;  /* bytes + 8 + N */
  uint64_t buffer_size;
  st_tensor *tensors;     /* sorted by name */
  size_t count;
  size_t metadata_count;  /* entries of __metadata__ (0 if absent) */
  /* private */
  void *arena;
  void *map;
  size_t map_len;
} st_file;

#define ST_MAX_HEADER 100000000u

/* Parses bytes[0..size). On success fills *f (which borrows bytes) and
 * returns 0; on failure returns -1 with a one-line reason in err (naming
 * the tensor when one is at fault) and leaves nothing to free.
 * f->path is not set. */
int st_parse(const uint8_t *bytes, uint64_t size, st_file *f, char *err, size_t errlen);

/* Opens, maps (read-only, MADV_SEQUENTIAL) and parses path. err as above
 * (without the path). The mapping lives until st_close. */
int st_open(const char *path, st_file *f, char *err, size_t errlen);

/* Frees what st_parse / st_open made. Safe on a zeroed st_file. */
void st_close(st_file *f);

/* The tensor named name (name_len bytes), or NULL. */
const st_tensor *st_find(const st_file *f, const char *name, size_t name_len);

/* "[2, 3]" into buf (truncated with "..." if it does not fit). */
void st_shape_str(const st_tensor *t, char *buf, size_t len);

#endif /* BX_CLI_SAFETENSORS_H */
