/*
 * st_write.c — the deterministic F32 safetensors writer of `bitexact train`
 * (st_write.h): checkpoints (train_ckpt.c, train_ckpt_model.c) and
 * --dump-grads.
 */
#include "st_write.h"

#include <errno.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "errbuf.h"

static const tc_tensor *sort_base;
static int cmp_idx(const void *a, const void *b) {
  return strcmp(sort_base[*(const size_t *)a].name, sort_base[*(const size_t *)b].name);
}

void tc_test_point(const char *point) {
  static const char *const vars[2] = {"BITEXACT_TEST_CKPT_KILL", "BITEXACT_TEST_CKPT_STOP"};
  static long seen[2];
  for (int k = 0; k < 2; k++) {
    const char *v = getenv(vars[k]);
    if (!v) continue;
    size_t len = strlen(point);
    if (strncmp(v, point, len) != 0 || (v[len] != 0 && v[len] != ':')) continue;
    long nth = v[len] == ':' ? strtol(v + len + 1, NULL, 10) : 1;
    if (++seen[k] == nth) raise(k == 0 ? SIGKILL : SIGSTOP);
  }
}

static int write_all(FILE *fp, const void *p, size_t n) { return fwrite(p, 1, n, fp) == n ? 0 : -1; }

int tc_write_safetensors(const char *path, const tc_tensor *t, size_t n, char *err, size_t errlen) {
  size_t *idx = malloc((n ? n : 1) * sizeof *idx);
  json_t *h = json_object();
  char *text = NULL;
  FILE *fp = NULL;
  int rc = -1;
  if (!idx || !h) {
    cli_errf(err, errlen, "out of memory");
    goto done;
  }
  for (size_t i = 0; i < n; i++) idx[i] = i;
  sort_base = t;
  qsort(idx, n, sizeof *idx, cmp_idx);
  json_object_set_new(h, "__metadata__", json_pack("{s:s}", "format", "pt"));
  uint64_t off = 0;
  for (size_t k = 0; k < n; k++) {
    const tc_tensor *x = &t[idx[k]];
    if (k && strcmp(t[idx[k - 1]].name, x->name) == 0) {
      cli_errf(err, errlen, "tensor '%s' twice", x->name);
      goto done;
    }
    json_t *shape = json_array();
    for (int d = 0; d < x->ndim; d++) json_array_append_new(shape, json_integer(x->shape[d]));
    uint64_t bytes = (uint64_t)x->numel * 4;
    json_object_set_new(h, x->name,
                        json_pack("{s:s,s:o,s:[I,I]}", "dtype", "F32", "shape", shape,
                                  "data_offsets", (json_int_t)off, (json_int_t)(off + bytes)));
    off += bytes;
  }
  text = json_dumps(h, JSON_COMPACT | JSON_SORT_KEYS);
  if (!text) {
    cli_errf(err, errlen, "out of memory");
    goto done;
  }
  size_t len = strlen(text), padded = (len + 7) & ~(size_t)7;
  fp = fopen(path, "wb");
  if (!fp) {
    cli_errf(err, errlen, "%s: cannot create: %s", path, strerror(errno));
    goto done;
  }
  uint8_t lenb[8];
  for (int i = 0; i < 8; i++) lenb[i] = (uint8_t)((uint64_t)padded >> (8 * i));
  int bad = write_all(fp, lenb, 8) || write_all(fp, text, len);
  for (size_t i = len; i < padded && !bad; i++) bad = fputc(' ', fp) == EOF;
  for (size_t k = 0; k < n && !bad; k++) {
    const tc_tensor *x = &t[idx[k]];
    if (k == n / 2) { /* the test hook: a torn file on disk */
      bad = fflush(fp) != 0;
      tc_test_point("torn");
    }
#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the checkpoint writer assumes a little-endian host"
#endif
    bad = write_all(fp, x->data, (size_t)x->numel * 4);
  }
  if (!bad) bad = fflush(fp) != 0 || fsync(fileno(fp)) != 0;
  if (fclose(fp) != 0) bad = 1;
  fp = NULL;
  if (bad) {
    cli_errf(err, errlen, "%s: cannot write: %s", path, strerror(errno));
    goto done;
  }
  rc = 0;
done:
  free(idx);
  free(text);
  json_decref(h);
  return rc;
}

