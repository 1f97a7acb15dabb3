/*
 * ckpt_model.c — the model tensors of a checkpoint directory, one file or
 * shards with an index (ckpt_model.h). The index JSON is parsed by jansson;
 * the shards by safetensors.c.
 */
#include "ckpt_model.h"

#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "errbuf.h"

/* ---- the index ------------------------------------------------------------ */

/* A name for messages: at most 200 bytes. */
static const char *shown(const char *s, char *buf, size_t len) {
  snprintf(buf, len, "%.200s%s", s, strlen(s) > 200 ? "..." : "");
  return buf;
}

/* A shard's file name: a plain name in the directory. */
static const char *bad_file_name(const char *s) {
  size_t n = strlen(s);
  if (n == 0) return "is empty";
  if (n > 255) return "is longer than 255 bytes";
  if (strchr(s, '/') || strchr(s, '\\')) return "is not a plain file name (a path)";
  if (s[0] == '.') return "starts with '.'";
  for (size_t i = 0; i < n; i++)
    if ((unsigned char)s[i] < 0x20) return "holds a control character";
  if (n < 12 || strcmp(s + n - 12, ".safetensors") != 0) return "does not end in .safetensors";
  return NULL;
}

static int cmp_str(const void *a, const void *b) {
  return strcmp(*(const char *const *)a, *(const char *const *)b);
}

void ck_index_free(ck_index *ix) {
  if (ix->names)
    for (size_t i = 0; i < ix->count; i++) free(ix->names[i]);
  if (ix->files)
    for (size_t i = 0; i < ix->nfiles; i++) free(ix->files[i]);
  free(ix->names);
  free(ix->file_of);
  free(ix->files);
  memset(ix, 0, sizeof *ix);
}

int ck_index_parse(const char *text, size_t len, ck_index *ix, char *err, size_t errlen) {
  memset(ix, 0, sizeof *ix);
  json_error_t je;
  json_t *r = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
  if (!r) return cli_errf(err, errlen, "invalid JSON: %s (line %d, column %d)", je.text, je.line, je.column);
  int rc = -1;
  char nb[240], fb[240];
  const char **pairs = NULL, **fl = NULL; /* (name, file) per tensor; the files */
  json_t *wm = json_object_get(r, "weight_map"), *md = json_object_get(r, "metadata");
  if (!json_is_object(r)) {
    cli_errf(err, errlen, "not a JSON object");
    goto done;
  }
  if (!json_is_object(wm)) {
    cli_errf(err, errlen, "\"weight_map\" is missing or not an object");
    goto done;
  }
  if (md && !json_is_object(md)) {
    cli_errf(err, errlen, "\"metadata\" is not an object");
    goto done;
  }
  json_t *ts = md ? json_object_get(md, "total_size") : NULL;
  if (ts && !json_is_null(ts)) {
    if (!json_is_integer(ts) || json_integer_value(ts) < 0) {
      cli_errf(err, errlen, "\"metadata\".\"total_size\" is not a non-negative integer");
      goto done;
    }
    ix->has_total_size = 1;
    ix->total_size = (uint64_t)json_integer_value(ts);
  }
  size_t n = json_object_size(wm);
  if (n == 0) {
    cli_errf(err, errlen, "\"weight_map\" names no tensor");
    goto done;
  }
  pairs = calloc(2 * n, sizeof *pairs);
  fl = calloc(n, sizeof *fl);
  ix->names = calloc(n, sizeof *ix->names);
  ix->file_of = calloc(n, sizeof *ix->file_of);
  if (!pairs || !fl || !ix->names || !ix->file_of) {
    cli_errf(err, errlen, "out of memory for %zu tensors", n);
    goto done;
  }
  const char *key;
  json_t *v;
  size_t k = 0;
  json_object_foreach(wm, key, v) {
    if (!json_is_string(v)) {
      cli_errf(err, errlen, "\"weight_map\": tensor '%s': the file is not a string", shown(key, nb, sizeof nb));
      goto done;
    }
    const char *why = bad_file_name(json_string_value(v));
    if (why) {
      cli_errf(err, errlen, "\"weight_map\": tensor '%s': the file name '%s' %s",
               shown(key, nb, sizeof nb), shown(json_string_value(v), fb, sizeof fb), why);
      goto done;
    }
    pairs[2 * k] = key;
    pairs[2 * k + 1] = json_string_value(v);
    fl[k] = pairs[2 * k + 1];
    k++;
  }
  /* the distinct files, sorted (borrowed from r until copied) */
  qsort(fl, n, sizeof *fl, cmp_str);
  size_t u = 0;
  for (size_t i = 0; i < n; i++)
    if (u == 0 || strcmp(fl[u - 1], fl[i]) != 0) fl[u++] = fl[i];
  if (u > CK_MAX_SHARDS) {
    cli_errf(err, errlen, "\"weight_map\" names %zu files (at most %d shards)", u, CK_MAX_SHARDS);
    goto done;
  }
  /* the names, sorted, with the number of their file */
  qsort(pairs, n, 2 * sizeof *pairs, cmp_str);
  for (size_t i = 0; i < n; i++) {
    const char *f = pairs[2 * i + 1];
    const char **hit = bsearch(&f, fl, u, sizeof *fl, cmp_str);
    ix->file_of[i] = (size_t)(hit - fl);
    ix->names[i] = strdup(pairs[2 * i]);
    if (!ix->names[i]) {
      cli_errf(err, errlen, "out of memory");
      goto done;
    }
    ix->count = i + 1;
  }
  ix->files = calloc(u, sizeof *ix->files);
  if (!ix->files) {
    cli_errf(err, errlen, "out of memory");
    goto done;
  }
  for (size_t i = 0; i < u; i++) {
    ix->files[i] = strdup(fl[i]);
    if (!ix->files[i]) {
      cli_errf(err, errlen, "out of memory");
      goto done;
    }
    ix->nfiles = i + 1;
  }
  rc = 0;
done:
  if (rc) ck_index_free(ix);
  free(pairs);
  free(fl);
  json_decref(r);
  return rc;
}

static long name_at(const ck_index *ix, const char *name) {
  const char *const *hit = bsearch(&name, ix->names, ix->count, sizeof *ix->names, cmp_str);
  return hit ? (long)(hit - (const char *const *)ix->names) : -1;
}

int ck_index_check(const ck_index *ix, const st_file *shards, char *err, size_t errlen) {
  char nb[240];
  for (size_t i = 0; i < ix->count; i++) {
    const st_file *f = &shards[ix->file_of[i]];
    if (!st_find(f, ix->names[i], strlen(ix->names[i])))
      return cli_errf(err, errlen, "%s puts tensor '%s' in %s, which does not hold it", CK_INDEX_NAME,
                      shown(ix->names[i], nb, sizeof nb), ix->files[ix->file_of[i]]);
  }
  for (size_t k = 0; k < ix->nfiles; k++)
    for (size_t t = 0; t < shards[k].count; t++) {
      const st_tensor *x = &shards[k].tensors[t];
      long i = strlen(x->name) == x->name_len ? name_at(ix, x->name) : -1;
      if (i < 0)
        return cli_errf(err, errlen, "%s holds tensor '%s', which %s does not list", ix->files[k],
                        shown(x->name, nb, sizeof nb), CK_INDEX_NAME);
      if (ix->file_of[i] != k)
        return cli_errf(err, errlen, "%s holds tensor '%s', which %s puts in %s", ix->files[k],
                        shown(x->name, nb, sizeof nb), CK_INDEX_NAME, ix->files[ix->file_of[i]]);
    }
  return 0;
}

/* ---- the directory ---------------------------------------------------------- */

void ck_model_close(ck_model *m) {
  for (size_t i = 0; m->files && i < m->nfiles; i++) st_close(&m->files[i]);
  for (size_t i = 0; m->paths && i < m->nfiles; i++) free(m->paths[i]);
  free(m->files);
  free(m->paths);
  free(m->index_path);
  ck_index_free(&m->ix);
  memset(m, 0, sizeof *m);
}

static char *join(const char *dir, const char *name) {
  size_t n = strlen(dir) + strlen(name) + 2;
  char *p = malloc(n);
  if (p) snprintf(p, n, "%s/%s", dir, name);
  return p;
}

static int is_file(const char *path) {
  struct stat sb;
  return stat(path, &sb) == 0 && S_ISREG(sb.st_mode);
}

/* The whole file, NUL-terminated (at most CK_MAX_INDEX_BYTES). */
static char *read_text(const char *path, size_t *len, char *err, size_t errlen) {
  FILE *fp = fopen(path, "rb");
  char *buf = NULL;
  if (!fp) return cli_errf(err, errlen, "%s: cannot open: %s", path, strerror(errno)), NULL;
  struct stat sb;
  if (fstat(fileno(fp), &sb) != 0 || sb.st_size < 0 || (uint64_t)sb.st_size > CK_MAX_INDEX_BYTES) {
    cli_errf(err, errlen, "%s: larger than %u bytes, or cannot stat", path, CK_MAX_INDEX_BYTES);
    goto done;
  }
  buf = malloc((size_t)sb.st_size + 1);
  if (!buf) {
    cli_errf(err, errlen, "%s: out of memory", path);
    goto done;
  }
  *len = fread(buf, 1, (size_t)sb.st_size, fp);
  if (*len != (size_t)sb.st_size || ferror(fp)) {
    cli_errf(err, errlen, "%s: cannot read", path);
    free(buf);
    buf = NULL;
    goto done;
  }
  buf[*len] = 0;
done:
  fclose(fp);
  return buf;
}

int ck_model_open(const char *dir, ck_model *m, char *err, size_t errlen) {
  memset(m, 0, sizeof *m);
  char e[512];
  char *single = join(dir, CK_SINGLE_NAME), *index = join(dir, CK_INDEX_NAME), *text = NULL;
  int rc = -1;
  if (!single || !index) {
    cli_errf(err, errlen, "out of memory");
    goto done;
  }
  int has_single = is_file(single), has_index = is_file(index);
  if (has_single && has_index) {
    cli_errf(err, errlen, "%s: holds both %s and %s (which is the model?)", dir, CK_SINGLE_NAME,
             CK_INDEX_NAME);
    goto done;
  }
  if (!has_single && !has_index) {
    cli_errf(err, errlen, "%s: neither %s nor %s is there", dir, CK_SINGLE_NAME, CK_INDEX_NAME);
    goto done;
  }
  if (has_single) {
    m->files = calloc(1, sizeof *m->files);
    m->paths = calloc(1, sizeof *m->paths);
    if (!m->files || !m->paths) {
      cli_errf(err, errlen, "out of memory");
      goto done;
    }
    m->nfiles = 1;
    m->paths[0] = single;
    single = NULL;
    if (st_open(m->paths[0], &m->files[0], e, sizeof e)) {
      cli_errf(err, errlen, "%s: %s", m->paths[0], e);
      goto done;
    }
    rc = 0;
    goto done;
  }
  size_t len = 0;
  text = read_text(index, &len, err, errlen);
  if (!text) goto done;
  if (ck_index_parse(text, len, &m->ix, e, sizeof e)) {
    cli_errf(err, errlen, "%s: %s", index, e);
    goto done;
  }
  m->sharded = 1;
  m->index_path = index;
  index = NULL;
  m->files = calloc(m->ix.nfiles, sizeof *m->files);
  m->paths = calloc(m->ix.nfiles, sizeof *m->paths);
  if (!m->files || !m->paths) {
    cli_errf(err, errlen, "out of memory");
    goto done;
  }
  m->nfiles = m->ix.nfiles;
  for (size_t k = 0; k < m->nfiles; k++) {
    m->paths[k] = join(dir, m->ix.files[k]);
    if (!m->paths[k]) {
      cli_errf(err, errlen, "out of memory");
      goto done;
    }
    if (st_open(m->paths[k], &m->files[k], e, sizeof e)) {
      cli_errf(err, errlen, "%s: %s (a shard %s names)", m->paths[k], e, CK_INDEX_NAME);
      goto done;
    }
  }
  if (ck_index_check(&m->ix, m->files, e, sizeof e)) {
    cli_errf(err, errlen, "%s: %s", dir, e);
    goto done;
  }
  rc = 0;
done:
  if (rc) ck_model_close(m);
  free(single);
  free(index);
  free(text);
  return rc;
}

const st_tensor *ck_model_find(const ck_model *m, const char *name, const char **path) {
  size_t k = 0;
  if (m->sharded) {
    long i = name_at(&m->ix, name);
    if (i < 0) return NULL;
    k = m->ix.file_of[i];
  } else if (m->nfiles == 0) {
    return NULL;
  }
  if (path) *path = m->paths[k];
  return st_find(&m->files[k], name, strlen(name));
}

size_t ck_model_count(const ck_model *m) {
  size_t n = 0;
  for (size_t k = 0; k < m->nfiles; k++) n += m->files[k].count;
  return n;
}

const st_tensor *ck_model_tensor(const ck_model *m, size_t i, const char **path) {
  for (size_t k = 0; k < m->nfiles; k++) {
    if (i < m->files[k].count) {
      if (path) *path = m->paths[k];
      return &m->files[k].tensors[i];
    }
    i -= m->files[k].count;
  }
  return NULL;
}

/* ---- sizes, shards, the index's writer -------------------------------------- */

static int ends_with_ci(const char *s, size_t n, const char *suffix) {
  size_t k = strlen(suffix);
  if (n < k) return 0;
  for (size_t i = 0; i < k; i++) {
    char c = s[n - k + i];
    if (c >= 'a' && c <= 'z') c = (char)(c - 'a' + 'A');
    if (c != suffix[i]) return 0;
  }
  return 1;
}

int ck_parse_size(const char *s, uint64_t *out) {
  static const struct {
    const char *unit;
    uint64_t mult;
    int bits_if_b; /* "Gb": bits (transformers divides by 8) */
  } units[] = {{"GIB", 1ull << 30, 0}, {"MIB", 1ull << 20, 0}, {"KIB", 1ull << 10, 0},
               {"GB", 1000000000ull, 1}, {"MB", 1000000ull, 1}, {"KB", 1000ull, 1}, {"", 1, 0}};
  size_t n = strlen(s);
  for (size_t u = 0; u < sizeof units / sizeof units[0]; u++) {
    if (!ends_with_ci(s, n, units[u].unit)) continue;
    size_t digits = n - strlen(units[u].unit);
    if (digits == 0 || digits > 19) return -1;
    uint64_t v = 0;
    for (size_t i = 0; i < digits; i++) {
      if (s[i] < '0' || s[i] > '9') return -1;
      v = v * 10 + (uint64_t)(s[i] - '0');
    }
    if (__builtin_mul_overflow(v, units[u].mult, &v)) return -1;
    if (units[u].bits_if_b && s[n - 1] == 'b') v /= 8;
    if (v == 0) return -1;
    *out = v;
    return 0;
  }
  return -1;
}

size_t ck_shard_plan(const uint64_t *bytes, size_t n, uint64_t max, size_t *shard_of) {
  size_t nshards = 0, current = (size_t)-1;
  uint64_t current_size = 0;
  for (size_t i = 0; i < n; i++) {
    if (bytes[i] > max) { /* a shard of its own, appended now */
      shard_of[i] = nshards++;
      continue;
    }
    if (current == (size_t)-1 || current_size + bytes[i] > max) {
      current = nshards++;
      current_size = 0;
    }
    shard_of[i] = current;
    current_size += bytes[i];
  }
  return nshards;
}

void ck_shard_name(size_t k, size_t nshards, char *buf, size_t len) {
  snprintf(buf, len, "model-%05zu-of-%05zu.safetensors", k + 1, nshards);
}

int ck_write_index(const char *path, const char *const *names, const size_t *shard_of, size_t n,
                   size_t nshards, uint64_t total_size, uint64_t total_parameters, char *err,
                   size_t errlen) {
  json_t *r = json_object(), *wm = json_object();
  int rc = -1;
  FILE *fp = NULL;
  if (!r || !wm) {
    json_decref(wm);
    goto done;
  }
  json_object_set_new(r, "metadata", json_pack("{s:I,s:I}", "total_parameters",
                                               (json_int_t)total_parameters, "total_size",
                                               (json_int_t)total_size));
  char file[64];
  for (size_t i = 0; i < n; i++) {
    ck_shard_name(shard_of[i], nshards, file, sizeof file);
    if (json_object_set_new(wm, names[i], json_string(file)) != 0) {
      json_decref(wm);
      goto done;
    }
  }
  json_object_set_new(r, "weight_map", wm);
  fp = fopen(path, "wb");
  if (!fp) {
    cli_errf(err, errlen, "%s: cannot create: %s", path, strerror(errno));
    goto out;
  }
  int bad = json_dumpf(r, fp, JSON_INDENT(2) | JSON_SORT_KEYS | JSON_ENSURE_ASCII) != 0 ||
            fputc('\n', fp) == EOF || fflush(fp) != 0 || fsync(fileno(fp)) != 0;
  if (fclose(fp) != 0) bad = 1;
  if (bad) {
    cli_errf(err, errlen, "%s: cannot write: %s", path, strerror(errno));
    goto out;
  }
  rc = 0;
  goto out;
done:
  cli_errf(err, errlen, "out of memory");
out:
  json_decref(r);
  return rc;
}

/* ---- widening ------------------------------------------------------------------- */

static float f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h >> 15) << 31, e = (h >> 10) & 0x1f, m = h & 0x3ff, bits;
  float f;
  if (e == 0) { /* zero or subnormal: m * 2^-24, exact */
    f = (float)m * 0x1p-24f;
    memcpy(&bits, &f, 4);
    bits |= sign;
  } else if (e == 31) { /* inf / NaN, the payload kept */
    bits = sign | 0x7f800000u | (m << 13);
  } else {
    bits = sign | ((e - 15 + 127) << 23) | (m << 13);
  }
  memcpy(&f, &bits, 4);
  return f;
}

int ck_widen_f32(const st_tensor *t, float *out) {
  const uint8_t *p = t->data;
  switch (t->dtype) {
  case ST_F32:
    memcpy(out, p, (size_t)t->nelem * 4); /* little-endian host (train_ckpt.c) */
    return 0;
  case ST_BF16:
    for (uint64_t i = 0; i < t->nelem; i++) {
      uint32_t bits = (uint32_t)(p[2 * i] | p[2 * i + 1] << 8) << 16;
      memcpy(&out[i], &bits, 4);
    }
    return 0;
  case ST_F16:
    for (uint64_t i = 0; i < t->nelem; i++) out[i] = f16_to_f32((uint16_t)(p[2 * i] | p[2 * i + 1] << 8));
    return 0;
  default:
    return -1;
  }
}
