/*
 * hash.c — `bitexact hash FILE...`: canonical XXH3-128 hashes of every
 * tensor (name, dtype, shape, exact bytes) and of the whole checkpoint.
 * The definition is in the --help text (main.c) and in cli_tensor_hash
 * below; the tests recompute it with Python's xxhash package.
 *
 * Worker threads take whole tensors, largest first; one tensor's bytes
 * are one XXH3 stream (so the hash is the plain XXH3-128 of a documented
 * byte string, reproducible with any xxHash binding).
 */
#include <jansson.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__)
#include <xxh_x86dispatch.h> /* XXH3 with run-time AVX2 / AVX-512 dispatch */
#else
#include <xxhash.h>
#endif

#include "cli.h"

#define HASH_CHUNK ((uint64_t)16 << 20)

typedef struct href {
  size_t file;
  const st_tensor *t;
  XXH128_canonical_t hash;
} href;

typedef struct hash_job {
  href *refs;
  size_t *order;  /* refs by size, largest first */
  size_t n;
  atomic_size_t next;
  atomic_int failed;
  cli_progress progress;
} hash_job;

static void put_u64(XXH3_state_t *s, uint64_t v) {
  unsigned char b[8];
  for (int i = 0; i < 8; i++) b[i] = (unsigned char)(v >> (8 * i));
  XXH3_128bits_update(s, b, 8);
}

/* The tensor hash of the --help text; progress gets the data bytes. */
static int tensor_hash(XXH3_state_t *s, const st_tensor *t, XXH128_canonical_t *out,
                       cli_progress *p) {
  const char *dt = st_dtype_get(t->dtype)->name;
  if (XXH3_128bits_reset(s) != XXH_OK) return -1;
  put_u64(s, t->name_len);
  XXH3_128bits_update(s, t->name, t->name_len);
  put_u64(s, strlen(dt));
  XXH3_128bits_update(s, dt, strlen(dt));
  put_u64(s, t->ndim);
  for (size_t i = 0; i < t->ndim; i++) put_u64(s, t->shape[i]);
  uint64_t nbytes = t->end - t->begin;
  put_u64(s, nbytes);
  for (uint64_t off = 0; off < nbytes; off += HASH_CHUNK) {
    uint64_t len = nbytes - off < HASH_CHUNK ? nbytes - off : HASH_CHUNK;
    XXH3_128bits_update(s, t->data + off, (size_t)len);
    cli_progress_add(p, len);
  }
  XXH128_canonicalFromHash(out, XXH3_128bits_digest(s));
  return 0;
}

static void hash_worker(void *ctx, int worker) {
  hash_job *j = ctx;
  (void)worker;
  XXH3_state_t *s = XXH3_createState();
  if (!s) {
    atomic_store(&j->failed, 1);
    return;
  }
  for (;;) {
    size_t k = atomic_fetch_add(&j->next, 1);
    if (k >= j->n || atomic_load(&j->failed)) break;
    href *r = &j->refs[j->order[k]];
    if (tensor_hash(s, r->t, &r->hash, &j->progress) != 0) atomic_store(&j->failed, 1);
  }
  XXH3_freeState(s);
}

static int cmp_href(const void *a, const void *b) {
  const href *x = a, *y = b;
  size_t n = x->t->name_len < y->t->name_len ? x->t->name_len : y->t->name_len;
  int c = memcmp(x->t->name, y->t->name, n);
  if (c) return c;
  return (x->t->name_len > y->t->name_len) - (x->t->name_len < y->t->name_len);
}

static const href *sort_refs;
static int cmp_size_desc(const void *a, const void *b) {
  uint64_t x = sort_refs[*(const size_t *)a].t->end - sort_refs[*(const size_t *)a].t->begin;
  uint64_t y = sort_refs[*(const size_t *)b].t->end - sort_refs[*(const size_t *)b].t->begin;
  if (x != y) return x > y ? -1 : 1;
  return (*(const size_t *)a > *(const size_t *)b) - (*(const size_t *)a < *(const size_t *)b);
}

static void hex128(const XXH128_canonical_t *c, char out[33]) {
  for (int i = 0; i < 16; i++) snprintf(out + 2 * i, 3, "%02x", c->digest[i]);
}

int cmd_hash(int argc, char **argv) {
  cli_opts o = {0, 0, -1, 0};
  size_t nfiles = 0;
  char **paths = calloc((size_t)argc, sizeof *paths);
  if (!paths) return cli_error("out of memory"), CLI_ERROR;
  for (int i = 1; i < argc; i++) {
    int c = cli_common_opt(argc, argv, &i, &o);
    if (c < 0) return free(paths), CLI_ERROR;
    if (c) continue;
    if (argv[i][0] == '-' && argv[i][1]) {
      cli_error("hash: unknown option '%s'", argv[i]);
      return free(paths), CLI_ERROR;
    }
    paths[nfiles++] = argv[i];
  }
  if (nfiles == 0) {
    cli_error("hash: no input file (usage: bitexact hash [--json] [--threads N] FILE...)");
    return free(paths), CLI_ERROR;
  }
  int rc = CLI_ERROR;
  hash_job j;
  memset(&j, 0, sizeof j);
  json_t *root = NULL;
  st_file *files = calloc(nfiles, sizeof *files);
  if (!files) {
    cli_error("out of memory");
    goto done_nofiles;
  }
  if (cli_open_files(paths, nfiles, files) != 0) goto done_nofiles;
  size_t n = 0;
  uint64_t total = 0;
  for (size_t f = 0; f < nfiles; f++) n += files[f].count;
  j.refs = calloc(n ? n : 1, sizeof *j.refs);
  j.order = calloc(n ? n : 1, sizeof *j.order);
  if (!j.refs || !j.order) {
    cli_error("out of memory");
    goto done;
  }
  for (size_t f = 0, k = 0; f < nfiles; f++)
    for (size_t t = 0; t < files[f].count; t++) {
      j.refs[k].file = f;
      j.refs[k].t = &files[f].tensors[t];
      total += files[f].tensors[t].end - files[f].tensors[t].begin;
      k++;
    }
  qsort(j.refs, n, sizeof *j.refs, cmp_href);
  for (size_t k = 1; k < n; k++)
    if (cmp_href(&j.refs[k - 1], &j.refs[k]) == 0) {
      cli_error("%s: tensor '%s' is also in %s: a checkpoint hash needs unique names",
                paths[j.refs[k].file], j.refs[k].t->name, paths[j.refs[k - 1].file]);
      goto done;
    }
  for (size_t k = 0; k < n; k++) j.order[k] = k;
  sort_refs = j.refs;
  qsort(j.order, n, sizeof *j.order, cmp_size_desc);
  j.n = n;
  atomic_init(&j.next, 0);
  atomic_init(&j.failed, 0);
  cli_progress_init(&j.progress, &o, "hash", total);
  int threads = cli_threads(&o);
  if ((size_t)threads > n) threads = n ? (int)n : 1;
  cli_parallel(threads, hash_worker, &j, &j.progress);
  if (atomic_load(&j.failed)) {
    cli_error("hash: out of memory for the hash state");
    goto done;
  }

  /* the checkpoint: XXH3-128 of the canonical tensor hashes in name order */
  XXH3_state_t *s = XXH3_createState();
  if (!s || XXH3_128bits_reset(s) != XXH_OK) {
    XXH3_freeState(s);
    cli_error("hash: out of memory for the hash state");
    goto done;
  }
  for (size_t k = 0; k < n; k++) XXH3_128bits_update(s, j.refs[k].hash.digest, 16);
  XXH128_canonical_t all;
  XXH128_canonicalFromHash(&all, XXH3_128bits_digest(s));
  XXH3_freeState(s);

  FILE *out = cli_out();
  char hx[33], shape[256];
  if (o.json) {
    root = json_object();
    json_t *jf = json_array(), *jt = json_object();
    for (size_t f = 0; f < nfiles; f++) json_array_append_new(jf, json_string(paths[f]));
    hex128(&all, hx);
    json_object_set_new(root, "files", jf);
    json_object_set_new(root, "checkpoint", json_string(hx));
    json_object_set_new(root, "count", json_integer((json_int_t)n));
    for (size_t k = 0; k < n; k++) {
      const st_tensor *t = j.refs[k].t;
      json_t *e = json_object(), *js = json_array();
      hex128(&j.refs[k].hash, hx);
      for (size_t d = 0; d < t->ndim; d++) json_array_append_new(js, json_integer((json_int_t)t->shape[d]));
      json_object_set_new(e, "hash", json_string(hx));
      json_object_set_new(e, "dtype", json_string(st_dtype_get(t->dtype)->name));
      json_object_set_new(e, "shape", js);
      json_object_set_new(jt, t->name, e);
    }
    json_object_set_new(root, "tensors", jt);
    if (json_dumpf(root, out, JSON_INDENT(2)) != 0) {
      cli_error("cannot format the JSON output");
      goto done;
    }
    fputc('\n', out);
  } else {
    if (!o.quiet)
      for (size_t k = 0; k < n; k++) {
        const st_tensor *t = j.refs[k].t;
        hex128(&j.refs[k].hash, hx);
        st_shape_str(t, shape, sizeof shape);
        fprintf(out, "%s  %-8s %-18s %s\n", hx, st_dtype_get(t->dtype)->name, shape, t->name);
      }
    hex128(&all, hx);
    fprintf(out, "%s  checkpoint (%zu tensors)\n", hx, n);
  }
  rc = CLI_OK;
done:
  cli_close_files(files, nfiles);
done_nofiles:
  json_decref(root);
  free(j.refs);
  free(j.order);
  free(files);
  free(paths);
  return rc;
}
