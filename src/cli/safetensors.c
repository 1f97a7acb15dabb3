/*
 * safetensors.c — validating safetensors reader (see safetensors.h).
 * The JSON header is parsed by jansson (Debian's libjansson); everything
 * else is integer arithmetic with overflow checks, so any byte string gives
 * either a fully checked st_file or a one-line error.
 */
#include "errbuf.h"
#include "safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

static const st_dtype_info dtype_table[ST_DTYPE_COUNT] = {
    [ST_BOOL] = {"BOOL", 8, ST_KIND_BOOL},
    [ST_U8] = {"U8", 8, ST_KIND_UINT},
    [ST_I8] = {"I8", 8, ST_KIND_INT},
    [ST_F8_E5M2] = {"F8_E5M2", 8, ST_KIND_FLOAT},
    [ST_F8_E4M3] = {"F8_E4M3", 8, ST_KIND_FLOAT},
    [ST_F8_E8M0] = {"F8_E8M0", 8, ST_KIND_FLOAT},
    [ST_F8_E4M3FNUZ] = {"F8_E4M3FNUZ", 8, ST_KIND_FLOAT},
    [ST_F8_E5M2FNUZ] = {"F8_E5M2FNUZ", 8, ST_KIND_FLOAT},
    [ST_I16] = {"I16", 16, ST_KIND_INT},
    [ST_U16] = {"U16", 16, ST_KIND_UINT},
    [ST_F16] = {"F16", 16, ST_KIND_FLOAT},
    [ST_BF16] = {"BF16", 16, ST_KIND_FLOAT},
    [ST_I32] = {"I32", 32, ST_KIND_INT},
    [ST_U32] = {"U32", 32, ST_KIND_UINT},
    [ST_F32] = {"F32", 32, ST_KIND_FLOAT},
    [ST_C64] = {"C64", 64, ST_KIND_COMPLEX},
    [ST_F64] = {"F64", 64, ST_KIND_FLOAT},
    [ST_I64] = {"I64", 64, ST_KIND_INT},
    [ST_U64] = {"U64", 64, ST_KIND_UINT},
    [ST_F4] = {"F4", 4, ST_KIND_PACKED},
    [ST_F6_E2M3] = {"F6_E2M3", 6, ST_KIND_PACKED},
    [ST_F6_E3M2] = {"F6_E3M2", 6, ST_KIND_PACKED},
};

const st_dtype_info *st_dtype_get(st_dtype dt) {
  return (unsigned)dt < ST_DTYPE_COUNT ? &dtype_table[dt] : NULL;
}

static int dtype_lookup(const char *name, st_dtype *out) {
  for (int i = 0; i < ST_DTYPE_COUNT; i++)
    if (strcmp(name, dtype_table[i].name) == 0) {
      *out = (st_dtype)i;
      return 0;
    }
  return -1;
}

/* Non-negative JSON integer, else -1. */
static int get_u64(const json_t *v, uint64_t *out) {
  if (!json_is_integer(v)) return -1;
  json_int_t i = json_integer_value(v);
  if (i < 0) return -1;
  *out = (uint64_t)i;
  return 0;
}

/* A tensor name for messages: at most 200 bytes, control bytes as '?'. */
static const char *printable(const char *name, char *buf, size_t len) {
  size_t i = 0;
  for (; name[i] && i + 4 < len && i < 200; i++)
    buf[i] = (unsigned char)name[i] < 0x20 ? '?' : name[i];
  if (name[i]) {
    memcpy(buf + i, "...", 3);
    i += 3;
  }
  buf[i] = 0;
  return buf;
}

/* Checks one header entry. Fills dtype, ndim, nelem, begin, end. */
static int check_entry(const char *name, const json_t *v, uint64_t buffer_size, st_dtype *dt,
                       size_t *ndim, uint64_t *nelem, uint64_t *begin, uint64_t *end,
                       char *err, size_t errlen) {
  char nb[256];
  const char *pn = printable(name, nb, sizeof nb);
  if (!json_is_object(v)) return cli_errf(err, errlen, "tensor '%s': entry is not a JSON object", pn);
  const json_t *jd = json_object_get(v, "dtype"), *js = json_object_get(v, "shape");
  const json_t *jo = json_object_get(v, "data_offsets");
  if (!json_is_string(jd)) return cli_errf(err, errlen, "tensor '%s': missing or non-string \"dtype\"", pn);
  if (dtype_lookup(json_string_value(jd), dt) != 0) {
    char db[64];
    return cli_errf(err, errlen, "tensor '%s': unknown dtype \"%s\"", pn,
                printable(json_string_value(jd), db, sizeof db));
  }
  if (!json_is_array(js)) return cli_errf(err, errlen, "tensor '%s': missing or non-array \"shape\"", pn);
  if (!json_is_array(jo) || json_array_size(jo) != 2)
    return cli_errf(err, errlen, "tensor '%s': \"data_offsets\" is not an array of two integers", pn);
  if (get_u64(json_array_get(jo, 0), begin) || get_u64(json_array_get(jo, 1), end))
    return cli_errf(err, errlen, "tensor '%s': \"data_offsets\" must be non-negative integers", pn);
  if (*begin > *end)
    return cli_errf(err, errlen, "tensor '%s': data_offsets [%llu, %llu] end before they begin", pn,
                (unsigned long long)*begin, (unsigned long long)*end);
  if (*end > buffer_size)
    return cli_errf(err, errlen,
                "tensor '%s': data_offsets [%llu, %llu] reach beyond the data buffer of %llu "
                "bytes (truncated file?)",
                pn, (unsigned long long)*begin, (unsigned long long)*end,
                (unsigned long long)buffer_size);
  *ndim = json_array_size(js);
  uint64_t n = 1;
  int overflow = 0, zero = 0;
  for (size_t i = 0; i < *ndim; i++) {
    uint64_t d;
    if (get_u64(json_array_get(js, i), &d))
      return cli_errf(err, errlen, "tensor '%s': shape[%zu] is not a non-negative integer", pn, i);
    if (d == 0) zero = 1;
    if (__builtin_mul_overflow(n, d, &n)) overflow = 1;
  }
  if (zero) n = 0, overflow = 0;
  uint64_t bits = dtype_table[*dt].bits, nbits;
  if (overflow || __builtin_mul_overflow(n, bits, &nbits))
    return cli_errf(err, errlen, "tensor '%s': shape is too large (element count overflows)", pn);
  if (nbits % 8 != 0 || nbits / 8 != *end - *begin)
    return cli_errf(err, errlen,
                "tensor '%s': %llu bytes in data_offsets but dtype %s x shape needs %llu%s bytes",
                pn, (unsigned long long)(*end - *begin), dtype_table[*dt].name,
                (unsigned long long)(nbits / 8), nbits % 8 ? " and a fraction of" : "");
  *nelem = n;
  return 0;
}

static int cmp_name(const void *a, const void *b) {
  const st_tensor *x = a, *y = b;
  size_t n = x->name_len < y->name_len ? x->name_len : y->name_len;
  int c = memcmp(x->name, y->name, n);
  if (c) return c;
  return (x->name_len > y->name_len) - (x->name_len < y->name_len);
}

static int cmp_range(const void *a, const void *b) {
  const st_tensor *x = *(const st_tensor *const *)a, *y = *(const st_tensor *const *)b;
  if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
  return (x->end > y->end) - (x->end < y->end);
}

/* The quoted key in jansson's "duplicate object key near '\"x\"'". */
static const char *dup_key(const char *text) {
  const char *p = strstr(text, "near '");
  return p ? p + 6 : "?'";
}

int st_parse(const uint8_t *bytes, uint64_t size, st_file *f, char *err, size_t errlen) {
  memset(f, 0, sizeof *f);
  if (size == 0) return cli_errf(err, errlen, "empty file");
  if (size < 8)
    return cli_errf(err, errlen, "file of %llu bytes is too short for the 8-byte header length",
                (unsigned long long)size);
  uint64_t n = 0;
  for (int i = 7; i >= 0; i--) n = n << 8 | bytes[i];
  if (n > size - 8)
    return cli_errf(err, errlen,
                "header length %llu is beyond the end of the file (%llu bytes; truncated file?)",
                (unsigned long long)n, (unsigned long long)size);
  if (n > ST_MAX_HEADER)
    return cli_errf(err, errlen, "header length %llu exceeds the format's limit of %u bytes",
                (unsigned long long)n, ST_MAX_HEADER);
  if (n == 0 || bytes[8] != '{')
    return cli_errf(err, errlen, "the JSON header does not start with '{'");

  json_error_t je;
  json_t *root = json_loadb((const char *)bytes + 8, (size_t)n, JSON_REJECT_DUPLICATES, &je);
  if (!root) {
    if (strncmp(je.text, "duplicate object key", 20) == 0)
      return cli_errf(err, errlen, "duplicate name '%s in the JSON header (line %d, column %d)",
                  dup_key(je.text), je.line, je.column);
    return cli_errf(err, errlen, "invalid JSON header: %s (line %d, column %d)", je.text, je.line,
                je.column);
  }
  int rc = -1;
  st_tensor **byrange = NULL;
  if (!json_is_object(root)) {
    cli_errf(err, errlen, "the JSON header is not an object");
    goto done;
  }
  uint64_t buffer_size = size - 8 - n;

  /* pass 1: check every entry, size the arena */
  size_t count = 0, shape_words = 0, name_bytes = 0, metadata = 0;
  const char *key;
  json_t *v;
  json_object_foreach(root, key, v) {
    if (strcmp(key, "__metadata__") == 0) {
      const char *mk;
      json_t *mv;
      if (!json_is_object(v)) {
        cli_errf(err, errlen, "\"__metadata__\" is not an object");
        goto done;
      }
      json_object_foreach(v, mk, mv) {
        if (!json_is_string(mv)) {
          char nb[256];
          cli_errf(err, errlen, "\"__metadata__\" entry '%s' is not a string",
               printable(mk, nb, sizeof nb));
          goto done;
        }
      }
      metadata = json_object_size(v);
      continue;
    }
    st_dtype dt;
    size_t ndim = 0;
    uint64_t nelem, begin, end;
    if (check_entry(key, v, buffer_size, &dt, &ndim, &nelem, &begin, &end, err, errlen)) goto done;
    count++;
    shape_words += ndim;
    name_bytes += strlen(key) + 1;
  }

  /* pass 2: copy out of the JSON tree into one block: tensors, shapes, names */
  size_t head = count * sizeof(st_tensor);
  head = (head + 7) & ~(size_t)7;
  char *mem = calloc(1, head + shape_words * sizeof(uint64_t) + name_bytes + 1);
  if (!mem) {
    cli_errf(err, errlen, "out of memory for %zu tensors", count);
    goto done;
  }
  f->arena = mem;
  f->tensors = (st_tensor *)mem;
  uint64_t *shapes = (uint64_t *)(mem + head);
  char *names = (char *)(shapes + shape_words);
  size_t k = 0;
  json_object_foreach(root, key, v) {
    if (strcmp(key, "__metadata__") == 0) continue;
    st_tensor *t = &f->tensors[k++];
    const json_t *js = json_object_get(v, "shape"), *jo = json_object_get(v, "data_offsets");
    t->ndim = json_array_size(js);
    t->nelem = 1;
    for (size_t i = 0; i < t->ndim; i++) {
      shapes[i] = (uint64_t)json_integer_value(json_array_get(js, i));
      t->nelem *= shapes[i]; /* checked in pass 1: no overflow unless a 0 follows */
    }
    for (size_t i = 0; i < t->ndim; i++)
      if (shapes[i] == 0) t->nelem = 0;
    t->shape = shapes;
    shapes += t->ndim;
    dtype_lookup(json_string_value(json_object_get(v, "dtype")), &t->dtype);
    t->begin = (uint64_t)json_integer_value(json_array_get(jo, 0));
    t->end = (uint64_t)json_integer_value(json_array_get(jo, 1));
    t->name_len = strlen(key);
    memcpy(names, key, t->name_len + 1);
    t->name = names;
    names += t->name_len + 1;
  }
  f->count = count;
  f->metadata_count = metadata;
  f->bytes = bytes;
  f->size = size;
  f->header_len = n;
  f->buffer = bytes + 8 + n;
  f->buffer_size = buffer_size;
  for (size_t i = 0; i < count; i++) f->tensors[i].data = f->buffer + f->tensors[i].begin;

  /* overlapping byte ranges (empty tensors cannot overlap anything) */
  byrange = malloc((count ? count : 1) * sizeof *byrange);
  if (!byrange) {
    cli_errf(err, errlen, "out of memory for %zu tensors", count);
    goto done;
  }
  size_t m = 0;
  for (size_t i = 0; i < count; i++)
    if (f->tensors[i].end > f->tensors[i].begin) byrange[m++] = &f->tensors[i];
  qsort(byrange, m, sizeof *byrange, cmp_range);
  for (size_t i = 1; i < m; i++) {
    const st_tensor *a = byrange[i - 1], *b = byrange[i];
    if (b->begin < a->end) {
      char na[256], nb[256];
      cli_errf(err, errlen, "tensors '%s' [%llu, %llu) and '%s' [%llu, %llu) overlap",
           printable(a->name, na, sizeof na), (unsigned long long)a->begin,
           (unsigned long long)a->end, printable(b->name, nb, sizeof nb),
           (unsigned long long)b->begin, (unsigned long long)b->end);
      goto done;
    }
  }
  qsort(f->tensors, count, sizeof *f->tensors, cmp_name);
  rc = 0;
done:
  free(byrange);
  json_decref(root);
  if (rc != 0) st_close(f);
  return rc;
}

int st_open(const char *path, st_file *f, char *err, size_t errlen) {
  memset(f, 0, sizeof *f);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return cli_errf(err, errlen, "cannot open: %s", strerror(errno));
  struct stat sb;
  if (fstat(fd, &sb) != 0) {
    cli_errf(err, errlen, "cannot stat: %s", strerror(errno));
    close(fd);
    return -1;
  }
  if (!S_ISREG(sb.st_mode)) {
    close(fd);
    return cli_errf(err, errlen, "not a regular file");
  }
  uint64_t size = (uint64_t)sb.st_size;
  if (size == 0) {
    close(fd);
    return cli_errf(err, errlen, "empty file");
  }
  void *map = mmap(NULL, (size_t)size, PROT_READ, MAP_SHARED, fd, 0);
  int saved = errno;
  close(fd);
  if (map == MAP_FAILED) return cli_errf(err, errlen, "cannot map: %s", strerror(saved));
  madvise(map, (size_t)size, MADV_SEQUENTIAL);
  if (st_parse(map, size, f, err, errlen) != 0) {
    munmap(map, (size_t)size);
    return -1;
  }
  f->path = path;
  f->map = map;
  f->map_len = (size_t)size;
  return 0;
}

void st_close(st_file *f) {
  free(f->arena);
  if (f->map) munmap(f->map, f->map_len);
  memset(f, 0, sizeof *f);
}

const st_tensor *st_find(const st_file *f, const char *name, size_t name_len) {
  st_tensor key;
  memset(&key, 0, sizeof key);
  key.name = name;
  key.name_len = name_len;
  return bsearch(&key, f->tensors, f->count, sizeof *f->tensors, cmp_name);
}

void st_shape_str(const st_tensor *t, char *buf, size_t len) {
  size_t used = 0;
  int w = snprintf(buf, len, "[");
  used = w > 0 ? (size_t)w : 0;
  for (size_t i = 0; i < t->ndim && used < len; i++) {
    w = snprintf(buf + used, len - used, "%s%llu", i ? ", " : "", (unsigned long long)t->shape[i]);
    if (w < 0) break;
    used += (size_t)w;
  }
  if (used < len) snprintf(buf + used, len - used, "]");
  if (used + 1 >= len && len > 4) memcpy(buf + len - 4, "...", 4);
}
